"""The admin client's own state (sparkafka.connector.kafka_admin.KafkaAdmin), without a cluster."""

from __future__ import annotations

from confluent_kafka import Uuid

from sparkafka.connector.kafka_admin import KafkaAdmin


def test_an_admin_client_keeps_no_zero_topic_id_and_forgets_a_topic_gone() -> None:
    """The id a description gives a topic tells it from one of the same name created again; the zero
    UUID (a cluster without topic ids) tells nothing and is not kept."""
    admin = KafkaAdmin({"bootstrap.servers": "localhost:9092"}, timeout_s=1)
    admin._note_topic_id("t", Uuid(1, 2))
    assert admin.known_topic_ids == {"t": (1, 2)}
    admin._note_topic_id("t", Uuid(0, 0))
    assert admin.known_topic_ids == {}
    admin._note_topic_id("u", None)
    assert admin.known_topic_ids == {}
