"""The Schema Registry's errors as Confluent's answers them: an HTTP status, Confluent's error code
and message (``{"error_code": code, "message": message}``)."""

from __future__ import annotations

# Confluent's error codes (io.confluent.kafka.schemaregistry.rest.exceptions.Errors).
SUBJECT_NOT_FOUND = 40401
VERSION_NOT_FOUND = 40402
SCHEMA_NOT_FOUND = 40403
SUBJECT_COMPATIBILITY_NOT_CONFIGURED = 40408
INCOMPATIBLE_SCHEMA = 409
INVALID_SCHEMA = 42201
INVALID_VERSION = 42202
INVALID_COMPATIBILITY_LEVEL = 42203
STORE_ERROR = 50001


class RegistryError(Exception):
    """An error answered to the client as ``{"error_code": code, "message": message}``."""

    def __init__(self, status: int, error_code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.message = message


def subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, SUBJECT_NOT_FOUND, f"Subject '{subject}' not found.")
