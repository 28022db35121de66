"""--command-config: the Java client's properties, as librdkafka takes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkafka.cli.command_config import CommandConfigError, librdkafka_properties, read_command_config


def test_a_sasl_ssl_file_of_kafkas_documentation_becomes_librdkafkas_settings(tmp_path: Path) -> None:
    path = tmp_path / "client.properties"
    path.write_text(
        "bootstrap.servers=kafka-1:9093\n"
        "security.protocol = SASL_SSL\n"
        "sasl.mechanism: SCRAM-SHA-512\n"
        "! a comment, in the other style\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        '  username="svc" password="p\\\\\\"w";\n'
        "ssl.truststore.location=/etc/kafka/ca.pem\n"
        "ssl.truststore.type=PEM\n"
        "ssl.endpoint.identification.algorithm=\n"
        "key.deserializer=org.apache.kafka.common.serialization.StringDeserializer\n"
        "client.id=ops\n"
    )
    assert read_command_config(path) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "svc",
        "sasl.password": 'p"w',
        "ssl.ca.location": "/etc/kafka/ca.pem",
        "ssl.endpoint.identification.algorithm": "none",
        "client.id": "ops",
    }


@pytest.mark.parametrize(
    ("java", "expected"),
    [
        (
            {"ssl.keystore.location": "/c.p12", "ssl.keystore.type": "pkcs12", "ssl.keystore.password": "x"},
            {"ssl.keystore.location": "/c.p12", "ssl.keystore.password": "x"},
        ),
        (
            {"ssl.keystore.location": "/c.pem", "ssl.keystore.type": "PEM", "ssl.key.password": "k"},
            {"ssl.certificate.location": "/c.pem", "ssl.key.location": "/c.pem", "ssl.key.password": "k"},
        ),
        (
            {"ssl.keystore.certificate.chain": "-----BEGIN CERT", "ssl.keystore.key": "-----BEGIN KEY"},
            {"ssl.certificate.pem": "-----BEGIN CERT", "ssl.key.pem": "-----BEGIN KEY"},
        ),
        ({"ssl.truststore.certificates": "-----BEGIN CA"}, {"ssl.ca.pem": "-----BEGIN CA"}),
        (
            {
                "sasl.jaas.config": "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true "
                'keyTab="/etc/k.keytab" principal="kafka/h@R";',
                "sasl.kerberos.service.name": "kafka",
            },
            {
                "sasl.kerberos.keytab": "/etc/k.keytab",
                "sasl.kerberos.principal": "kafka/h@R",
                "sasl.kerberos.service.name": "kafka",
            },
        ),
    ],
)
def test_stores_and_login_modules_librdkafka_can_read(java: dict[str, str], expected: dict[str, str]) -> None:
    assert librdkafka_properties(java, source="f") == expected


@pytest.mark.parametrize(
    ("java", "message"),
    [
        (
            {"ssl.truststore.location": "/t.jks"},
            "is a JKS store, and librdkafka reads CA certificates from PEM",
        ),
        (
            {"ssl.truststore.location": "/t.p12", "ssl.truststore.type": "PKCS12"},
            "openssl pkcs12 -in /t.p12 -nokeys -out ca.pem",
        ),
        ({"ssl.keystore.location": "/k.jks"}, "keytool -importkeystore -srckeystore /k.jks"),
        (
            {
                "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
                " required;"
            },
            "uses OAuthBearerLoginModule, which librdkafka has no counterpart for",
        ),
        (
            {
                "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required"
                ' username="u";'
            },
            "(PlainLoginModule) names no password",
        ),
        ({"sasl.jaas.config": "   "}, "sasl.jaas.config is not '<LoginModule> required"),
    ],
)
def test_what_librdkafka_cannot_follow_is_refused_with_the_way_to_do_it(
    java: dict[str, str], message: str
) -> None:
    with pytest.raises(CommandConfigError, match=r"^--command-config f: ") as refused:
        librdkafka_properties(java, source="f")
    assert message in str(refused.value)


def test_a_file_that_is_not_there_or_not_text_is_named(tmp_path: Path) -> None:
    with pytest.raises(
        CommandConfigError, match=r"none.properties: cannot read it \(No such file or directory\)"
    ):
        read_command_config(tmp_path / "none.properties")
    binary = tmp_path / "binary.properties"
    binary.write_bytes(b"\xff\xfe\x00key=value")
    with pytest.raises(CommandConfigError, match=r"binary\.properties: not a properties file"):
        read_command_config(binary)
