"""``--command-config FILE``: a Kafka client properties file, as Kafka's own tools take it.

Kafka's tools (``kafka-topics.sh --command-config client.properties``) read Java client
properties; the console tools here run on librdkafka, which names most of them alike and a few
otherwise. This module reads the file (Java ``.properties`` syntax) and turns it into librdkafka
properties: the same name where librdkafka has it, a translation where the Java client spells a
setting its own way (``sasl.jaas.config``, ``ssl.truststore.*``, ``ssl.keystore.*``), and a
refusal naming the property and what to do where librdkafka cannot do what the file asks (a JKS
store, a login module it has no counterpart for). Nothing is dropped silently.

``bootstrap.servers`` in the file gives way to ``--bootstrap-server``, as in Kafka's tools."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import javaproperties

from sparkafka.errors import SparkafkaOptionError

# Names of Java classes that turn bytes into objects: the console tools send and print bytes as
# text themselves, as Kafka's console tools do with their own formatter options.
_JAVA_CLASSES_FOR_OBJECTS = frozenset(
    {"key.deserializer", "value.deserializer", "key.serializer", "value.serializer"}
)

_JAAS_ENTRY = re.compile(r"^\s*(?P<module>[\w.$]+)\s+(?P<flag>\w+)(?P<options>.*?);?\s*$", re.DOTALL)
_JAAS_OPTION = re.compile(r'(?P<key>[\w.]+)\s*=\s*(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>[^\s;]+))')


class CommandConfigError(SparkafkaOptionError):
    """A property of the ``--command-config`` file that the tools cannot use as written."""


def read_command_config(path: Path) -> dict[str, str]:
    """The librdkafka client properties ``path`` (a Java client properties file) stands for."""
    try:
        with path.open(encoding="utf-8") as handle:
            java = dict(javaproperties.load(handle))
    except OSError as error:
        raise CommandConfigError(f"--command-config {path}: cannot read it ({error.strerror})") from None
    except (UnicodeDecodeError, ValueError) as error:
        raise CommandConfigError(f"--command-config {path}: not a properties file ({error})") from None
    return librdkafka_properties(java, source=str(path))


def librdkafka_properties(java: Mapping[str, str], *, source: str) -> dict[str, str]:
    """Java client properties -> librdkafka properties (see the module docstring)."""
    properties: dict[str, str] = {}
    for key, value in java.items():
        if key in _JAVA_CLASSES_FOR_OBJECTS or key == "bootstrap.servers":
            continue
        if key == "sasl.jaas.config":
            properties.update(_jaas(value, source))
        elif key.startswith(("ssl.truststore.", "ssl.keystore.")):
            continue  # each store as a whole, below
        elif key == "ssl.endpoint.identification.algorithm":
            # The Java client turns host name checking off with an empty value.
            properties[key] = value.strip().lower() or "none"
        else:
            properties[key] = value
    properties.update(_truststore(java, source))
    properties.update(_keystore(java, source))
    return properties


def _jaas(value: str, source: str) -> dict[str, str]:
    entry = _JAAS_ENTRY.match(value)
    if entry is None:
        raise CommandConfigError(
            f"--command-config {source}: sasl.jaas.config is not '<LoginModule> required key=\"value\" ...;'"
        )
    module = entry.group("module").rsplit(".", 1)[-1]
    options = {
        found.group("key"): (
            found.group("bare")
            if found.group("quoted") is None
            else re.sub(r"\\(.)", r"\1", found.group("quoted"))
        )
        for found in _JAAS_OPTION.finditer(entry.group("options"))
    }
    if module in ("PlainLoginModule", "ScramLoginModule"):
        missing = [name for name in ("username", "password") if name not in options]
        if missing:
            raise CommandConfigError(
                f"--command-config {source}: sasl.jaas.config ({module}) names no {' and no '.join(missing)}"
            )
        return {"sasl.username": options["username"], "sasl.password": options["password"]}
    if module == "Krb5LoginModule":
        kerberos = {}
        if "keyTab" in options:
            kerberos["sasl.kerberos.keytab"] = options["keyTab"]
        if "principal" in options:
            kerberos["sasl.kerberos.principal"] = options["principal"]
        return kerberos
    raise CommandConfigError(
        f"--command-config {source}: sasl.jaas.config uses {module}, which librdkafka has no counterpart "
        "for. For OAUTHBEARER set sasl.oauthbearer.method=oidc and the sasl.oauthbearer.client.id, "
        "sasl.oauthbearer.client.secret and sasl.oauthbearer.token.endpoint.url properties instead"
    )


def _store_type(java: Mapping[str, str], kind: str) -> str:
    # The Java client's default store type is JKS.
    return java.get(f"ssl.{kind}.type", "JKS").strip().upper()


def _truststore(java: Mapping[str, str], source: str) -> dict[str, str]:
    if "ssl.truststore.certificates" in java:
        return {"ssl.ca.pem": java["ssl.truststore.certificates"]}
    location = java.get("ssl.truststore.location")
    if location is None:
        return {}
    store_type = _store_type(java, "truststore")
    if store_type == "PEM":
        return {"ssl.ca.location": location}
    export = (
        f"keytool -exportcert -rfc -keystore {location} -alias <alias> -file ca.pem"
        if store_type == "JKS"
        else f"openssl pkcs12 -in {location} -nokeys -out ca.pem"
    )
    raise CommandConfigError(
        f"--command-config {source}: ssl.truststore.location is a {store_type} store, and librdkafka reads "
        f"CA certificates from PEM files only. Export them ({export}) and set ssl.truststore.location to "
        "that file with ssl.truststore.type=PEM (or pass -X ssl.ca.location=ca.pem)"
    )


def _keystore(java: Mapping[str, str], source: str) -> dict[str, str]:
    if "ssl.keystore.certificate.chain" in java or "ssl.keystore.key" in java:
        inline = {}
        if "ssl.keystore.certificate.chain" in java:
            inline["ssl.certificate.pem"] = java["ssl.keystore.certificate.chain"]
        if "ssl.keystore.key" in java:
            inline["ssl.key.pem"] = java["ssl.keystore.key"]
        return inline
    location = java.get("ssl.keystore.location")
    if location is None:
        return {}
    store_type = _store_type(java, "keystore")
    password = java.get("ssl.keystore.password")
    if store_type == "PKCS12":
        return {"ssl.keystore.location": location} | (
            {} if password is None else {"ssl.keystore.password": password}
        )
    if store_type == "PEM":
        # A PEM key store holds the certificate chain and the private key in one file.
        return {"ssl.certificate.location": location, "ssl.key.location": location}
    raise CommandConfigError(
        f"--command-config {source}: ssl.keystore.location is a {store_type} store, which librdkafka cannot "
        f"read. Convert it to PKCS#12 (keytool -importkeystore -srckeystore {location} -destkeystore "
        "client.p12 -deststoretype PKCS12) and set ssl.keystore.location to it with ssl.keystore.type=PKCS12"
    )
