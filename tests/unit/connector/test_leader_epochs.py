"""Leader epochs in the source's offsets, and the kafka-python settings the epoch check uses."""

from __future__ import annotations

from sparkafka.connector.kafka_python import kafka_python_settings
from sparkafka.connector.source.offsets import decode_offsets, leader_epochs, with_leader_epochs


def test_leader_epochs_travel_in_entries_of_their_own() -> None:
    end = {"in": {"0": 200, "1": 7}}
    recorded = with_leader_epochs(end, {("in", 0): 3, ("in", 1): 0})
    assert recorded["sparkafka:leaderEpoch:in"] == {"0": 3, "1": 0}
    assert decode_offsets(recorded) == {("in", 0): 200, ("in", 1): 7}, "never taken for a topic"
    assert leader_epochs(recorded) == {("in", 0): 3, ("in", 1): 0}
    assert leader_epochs(end) == {}, "offsets checkpointed before epochs were recorded"


def test_kafka_python_settings_name_the_connection_properties_it_cannot_take() -> None:
    settings, unsupported = kafka_python_settings(
        {
            "security.protocol": "sasl_ssl",
            "sasl.mechanism": "plain",
            "sasl.username": "u",
            "ssl.endpoint.identification.algorithm": "https",
            "linger.ms": "5",
        }
    )
    assert settings == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "u",
    }
    assert unsupported == ["ssl.endpoint.identification.algorithm"]
