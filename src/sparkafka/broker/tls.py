"""The broker's TLS listener: Kafka's ``listeners=SSL://HOST:PORT`` with a PEM keystore
(``ssl.keystore.type=PEM``), built on Python's ``ssl``.

A client on it speaks TLS and then the same protocol as on the plaintext listener; with SASL users
configured it authenticates after the handshake (Kafka's SASL_SSL). With a truststore
(``ssl.truststore.location``) and ``ssl.client.auth=requested|required`` clients may, or must, present
a certificate signed by one of its CAs.

Every problem with the files is found when the broker starts, and named with the option that gave
the file: a broker that starts and then fails every handshake is harder to diagnose."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from sparkafka.broker.config import SslListener

# ssl.key.password, read from the environment: a process's arguments are visible to every user.
SSL_KEY_PASSWORD_ENV = "SPARKAFKA_BROKER_SSL_KEY_PASSWORD"
CLIENT_AUTH = ("none", "requested", "required")


class TlsConfigError(RuntimeError):
    """A TLS setting or file the listener cannot use; the message names the option and the fix."""


def _read(path: Path, option: str, what: str) -> str:
    if not path.exists():
        raise TlsConfigError(f"{option} {path}: no such file (the {what}, PEM)")
    if not path.is_file():
        raise TlsConfigError(f"{option} {path}: not a file (the {what}, PEM)")
    try:
        data = path.read_bytes()
    except PermissionError as error:
        raise TlsConfigError(
            f"{option} {path}: cannot be read by the broker's user ({error.strerror}): fix its permissions"
        ) from None
    except OSError as error:  # an I/O error, a file that vanished meanwhile: not a permissions matter
        raise TlsConfigError(
            f"{option} {path}: could not be read ({error.strerror or error}): check the file and its disk"
        ) from None
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise TlsConfigError(
            f"{option} {path}: not PEM text (a JKS or PKCS12 keystore?): the {what} must be PEM; "
            "convert a PKCS12 file with `openssl pkcs12 -in FILE -nodes`"
        ) from None


def server_context(listener: SslListener) -> ssl.SSLContext:
    """The TLS context of ``listener``, its files checked and loaded; TlsConfigError names what is wrong."""
    if listener.client_auth not in CLIENT_AUTH:
        raise TlsConfigError(
            f"--ssl-client-auth {listener.client_auth!r}: use one of {', '.join(CLIENT_AUTH)} (Kafka's "
            "ssl.client.auth)"
        )
    certificate = _read(listener.certfile, "--ssl-certfile", "certificate chain")
    if "-----BEGIN CERTIFICATE-----" not in certificate:
        raise TlsConfigError(f"--ssl-certfile {listener.certfile}: holds no PEM certificate")
    keyfile = listener.keyfile or listener.certfile
    key_option = "--ssl-keyfile" if listener.keyfile is not None else "--ssl-certfile (no --ssl-keyfile)"
    key = _read(keyfile, key_option, "private key")
    if "PRIVATE KEY-----" not in key:
        raise TlsConfigError(f"{key_option} {keyfile}: holds no PEM private key")
    encrypted = "ENCRYPTED PRIVATE KEY-----" in key or "Proc-Type: 4,ENCRYPTED" in key
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # Kafka's ssl.enabled.protocols default: TLSv1.2 and TLSv1.3.
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    password = listener.key_password
    if password is None:
        password = os.environ.get(SSL_KEY_PASSWORD_ENV) or None
    if encrypted and password is None:
        raise TlsConfigError(
            f"{key_option} {keyfile}: the key is encrypted: put its password in ${SSL_KEY_PASSWORD_ENV}"
        )
    try:
        # A callable, so an encrypted key without a password fails instead of prompting on the terminal.
        context.load_cert_chain(listener.certfile, keyfile, password=lambda: password or "")
    except ssl.SSLError as error:
        reason = error.reason or str(error)
        if encrypted:
            hint = f"is the password in ${SSL_KEY_PASSWORD_ENV} the key's?"
        elif "KEY_VALUES_MISMATCH" in reason:
            hint = "the private key does not belong to the certificate"
        else:
            hint = "both must be PEM, the key unencrypted or its password in $" + SSL_KEY_PASSWORD_ENV
        raise TlsConfigError(
            f"--ssl-certfile {listener.certfile} with {key_option} {keyfile}: the certificate and key "
            f"could not be loaded ({reason}): {hint}"
        ) from None
    if listener.cafile is not None:
        if "-----BEGIN CERTIFICATE-----" not in _read(listener.cafile, "--ssl-cafile", "CA certificates"):
            raise TlsConfigError(f"--ssl-cafile {listener.cafile}: holds no PEM certificate")
        try:
            context.load_verify_locations(cafile=listener.cafile)
        except ssl.SSLError as error:
            raise TlsConfigError(
                f"--ssl-cafile {listener.cafile}: the CA certificates could not be loaded ({error.reason})"
            ) from None
    if listener.client_auth != "none":
        if listener.cafile is None:
            raise TlsConfigError(
                f"--ssl-client-auth {listener.client_auth} needs --ssl-cafile: the CA certificates that "
                "sign the clients' certificates"
            )
        context.verify_mode = ssl.CERT_REQUIRED if listener.client_auth == "required" else ssl.CERT_OPTIONAL
    return context
