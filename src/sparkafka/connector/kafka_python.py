"""kafka-python, for the few requests librdkafka does not expose (OffsetForLeaderEpoch,
ListTransactions): its settings from the same ``kafka.*`` client properties."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# librdkafka property -> kafka-python setting.
KAFKA_PYTHON_SETTINGS = {
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "client.id": "client_id",
}

# Properties of how to reach and log in to the cluster: one kafka-python cannot take means it
# cannot connect the way librdkafka does.
CONNECTION_PREFIXES = ("security.", "sasl.", "ssl.")


def kafka_python_settings(client_properties: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """kafka-python's settings for ``client_properties`` (librdkafka's names), and the properties
    among them it has no setting for (those starting with :data:`CONNECTION_PREFIXES` change how it
    would connect)."""
    settings: dict[str, Any] = {}
    ignored = []
    for key, value in client_properties.items():
        setting = KAFKA_PYTHON_SETTINGS.get(key)
        if setting is None:
            ignored.append(key)
            continue
        settings[setting] = value.upper() if setting in ("security_protocol", "sasl_mechanism") else value
    return settings, ignored
