"""Leader epochs in the source's offsets, and the kafka-python settings the epoch check uses."""

from __future__ import annotations

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from sparkafka.connector.kafka_python import kafka_python_settings
from sparkafka.connector.source.epochs import EpochEnd
from sparkafka.connector.source.offsets import SourceOffset, decode_offsets
from sparkafka.errors import DataLossError

from .test_source_heartbeat import T0, T1, FakeAdmin, reader_with


def test_leader_epochs_travel_in_entries_of_their_own() -> None:
    end = {"in": {"0": 200, "1": 7}}
    recorded = SourceOffset(decode_offsets(end), leader_epochs={("in", 0): 3, ("in", 1): 0}).encode()
    assert recorded["sparkafka:leaderEpoch:in"] == {"0": 3, "1": 0}
    assert decode_offsets(recorded) == {("in", 0): 200, ("in", 1): 7}, "never taken for a topic"
    assert SourceOffset.decode(recorded).leader_epochs == {("in", 0): 3, ("in", 1): 0}
    assert SourceOffset.decode(end).leader_epochs == {}, "offsets checkpointed before epochs were recorded"


PROPERTIES = {
    "security.protocol": "sasl_ssl",
    "sasl.mechanism": "plain",
    "sasl.username": "u",
    "ssl.endpoint.identification.algorithm": "https",
    "linger.ms": "5",
}


def test_kafka_python_settings_name_the_properties_it_cannot_take() -> None:
    settings, ignored = kafka_python_settings(PROPERTIES)
    assert settings == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "u",
    }
    assert ignored == ["ssl.endpoint.identification.algorithm", "linger.ms"]


def test_a_connection_property_kafka_python_cannot_take_turns_the_epoch_check_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only connection properties count: a producer setting kafka-python ignores changes nothing of
    how it would reach the cluster. The check is off before any connection is tried."""
    from sparkafka.connector.source.epochs import LeaderEpochEnds

    ends = LeaderEpochEnds({"bootstrap.servers": "localhost:1", **PROPERTIES}, timeout_s=1)
    with caplog.at_level("WARNING"):
        assert ends.ends({T0: 3}) is None
    assert "ssl.endpoint.identification.algorithm" in caplog.text and "linger.ms" not in caplog.text


# -- the stream reader's check, over the reader tests' admin -----------------------------------------


class RecordedEpochEnds:
    """Where each asked epoch ends, as a leader answers; records what was asked."""

    def __init__(self, ends: dict) -> None:
        self.answers = ends
        self.asked: list[dict] = []

    def ends(self, positions: dict) -> dict:
        self.asked.append(dict(positions))
        return {tp: self.answers[tp] for tp in positions if tp in self.answers}


def _planned_at_100(**options: str) -> tuple:
    admin = FakeAdmin()
    admin.stable = {T0: 100, T1: 100}
    admin.leader_epochs = {T0: 3, T1: 3}
    reader = reader_with(admin, **options)
    start = {"t": {"0": 0, "1": 0}}
    end = reader.latestOffset(start, ReadAllAvailable())
    assert SourceOffset.decode(end).leader_epochs == {T0: 3, T1: 3}
    return admin, reader, end


def test_an_unchanged_leader_epoch_costs_no_request() -> None:
    admin, reader, end = _planned_at_100()
    ends = RecordedEpochEnds({})
    reader.log_check.epoch_ends = ends  # type: ignore[assignment]
    admin.stable = {T0: 150, T1: 150}
    planned = reader.latestOffset(end, ReadAllAvailable())
    assert decode_offsets(planned) == {T0: 150, T1: 150}
    assert ends.asked == []


def test_a_truncation_below_the_position_fails_naming_the_offsets_lost() -> None:
    admin, reader, end = _planned_at_100()
    reader.log_check.epoch_ends = RecordedEpochEnds({T0: EpochEnd(3, 60)})  # type: ignore[assignment]
    admin.leader_epochs = {T0: 4, T1: 3}  # an unclean election on partition 0, refilled past 100
    admin.stable = {T0: 180, T1: 120}
    with pytest.raises(DataLossError) as lost:
        reader.latestOffset(end, ReadAllAvailable())
    assert "topic 't' partition 0: the log was truncated below the query's position: offsets 60 to 99" in str(
        lost.value
    )
    assert "failOnDataLoss" in str(lost.value)


def test_with_fail_on_data_loss_off_the_query_reads_on_from_the_truncation() -> None:
    admin, reader, end = _planned_at_100(failOnDataLoss="false")
    ends = RecordedEpochEnds({T0: EpochEnd(3, 60), T1: EpochEnd(3, 120)})
    reader.log_check.epoch_ends = ends  # type: ignore[assignment]
    admin.leader_epochs = {T0: 4, T1: 4}
    admin.stable = {T0: 180, T1: 120}
    planned = reader.latestOffset(end, ReadAllAvailable())
    assert ends.asked == [{T0: 3, T1: 3}]
    # Partition 0: an empty range this batch, from 60 on the next; partition 1 was not truncated.
    assert decode_offsets(planned) == {T0: 60, T1: 120}
    assert SourceOffset.decode(planned).leader_epochs == {T0: 4, T1: 4}
    ranges = reader.partitions(end, planned)
    assert [(r.partition, r.start, r.end) for r in ranges] == [(1, 100, 120)]
    admin.stable = {T0: 180, T1: 120}
    following = reader.latestOffset(planned, ReadAllAvailable())
    assert [(r.partition, r.start, r.end) for r in reader.partitions(planned, following)] == [(0, 60, 180)]


def test_a_replayed_batch_is_cut_where_its_log_was_truncated_since() -> None:
    admin, _, end = _planned_at_100(failOnDataLoss="false")
    restarted = reader_with(admin, failOnDataLoss="false")  # a new run: the batch is a replay
    restarted.log_check.epoch_ends = RecordedEpochEnds({T0: EpochEnd(3, 70)})  # type: ignore[assignment]
    admin.leader_epochs = {T0: 4, T1: 3}
    ranges = restarted.partitions({"t": {"0": 0, "1": 0}}, end)
    assert sorted((r.partition, r.start, r.end) for r in ranges) == [(0, 0, 70), (1, 0, 100)]
    failing = reader_with(admin)
    failing.log_check.epoch_ends = RecordedEpochEnds({T0: EpochEnd(3, 70)})  # type: ignore[assignment]
    with pytest.raises(DataLossError, match="offsets 70 to 99"):
        failing.partitions({"t": {"0": 0, "1": 0}}, end)


def test_an_epoch_the_log_does_not_know_is_left_to_the_latest_offset_check() -> None:
    admin, reader, end = _planned_at_100()
    reader.log_check.epoch_ends = RecordedEpochEnds({T0: EpochEnd(-1, -1)})  # type: ignore[assignment]
    admin.leader_epochs = {T0: 0, T1: 3}  # the topic deleted and created again, say
    admin.stable = {T0: 150, T1: 100}
    assert decode_offsets(reader.latestOffset(end, ReadAllAvailable())) == {T0: 150, T1: 100}


def test_a_recreated_topic_is_told_from_a_truncation_by_its_id() -> None:
    """The topic deleted and created again, its new log led in epochs 0 (offsets 0-39) and 4: the
    recorded epoch 3 ends at 40 there, which alone reads as a truncation. The topic's id changed:
    the new topic is read from its earliest offset, nothing of it skipped."""
    admin = FakeAdmin()
    admin.stable = {T0: 100, T1: 100}
    admin.leader_epochs = {T0: 3, T1: 3}
    admin.topic_ids = {"t": (1, 1)}
    reader = reader_with(admin, failOnDataLoss="false")
    end = reader.latestOffset({"t": {"0": 0, "1": 0}}, ReadAllAvailable())
    assert end["sparkafka:topicId:t"] == {"lsb": 1, "msb": 1}
    reader.log_check.epoch_ends = RecordedEpochEnds({T0: EpochEnd(0, 40)})  # type: ignore[assignment]
    admin.topic_ids = {"t": (2, 2)}
    admin.leader_epochs = {T0: 4, T1: 3}
    admin.stable = {T0: 60, T1: 100}
    planned = reader.latestOffset(end, ReadAllAvailable())
    assert decode_offsets(planned)[T0] == 0
    following = reader.latestOffset(planned, ReadAllAvailable())
    assert [(r.partition, r.start, r.end) for r in reader.partitions(planned, following)] == [(0, 0, 60)]


def test_a_position_its_leader_does_not_answer_for_is_held_until_it_does() -> None:
    """No answer within the timeout: the partition is not read past, and keeps its recorded epoch,
    so the next batch asks again and finds the truncation."""
    admin, reader, end = _planned_at_100(failOnDataLoss="false")
    reader.log_check.epoch_ends = RecordedEpochEnds({})  # type: ignore[assignment]
    admin.leader_epochs = {T0: 4, T1: 3}
    admin.stable = {T0: 180, T1: 150}
    planned = reader.latestOffset(end, ReadAllAvailable())
    assert decode_offsets(planned) == {T0: 100, T1: 150}
    assert SourceOffset.decode(planned).leader_epochs == {T0: 3, T1: 3}
    answering = RecordedEpochEnds({T0: EpochEnd(3, 60)})
    reader.log_check.epoch_ends = answering  # type: ignore[assignment]
    assert decode_offsets(reader.latestOffset(planned, ReadAllAvailable()))[T0] == 60
    assert answering.asked == [{T0: 3}]


def test_a_replay_whose_leader_does_not_answer_is_not_read_unchecked() -> None:
    from sparkafka.errors import KafkaUnavailableError

    admin, _, end = _planned_at_100()
    restarted = reader_with(admin)
    restarted.log_check.epoch_ends = RecordedEpochEnds({})  # type: ignore[assignment]
    admin.leader_epochs = {T0: 4, T1: 3}
    with pytest.raises(KafkaUnavailableError, match="it is not read unchecked"):
        restarted.partitions({"t": {"0": 0, "1": 0}}, end)


def test_a_clean_leader_change_on_an_idle_input_is_asked_about_once() -> None:
    admin, reader, end = _planned_at_100()
    ends = RecordedEpochEnds({T0: EpochEnd(3, 100), T1: EpochEnd(3, 100)})
    reader.log_check.epoch_ends = ends  # type: ignore[assignment]
    admin.leader_epochs = {T0: 4, T1: 4}  # clean elections, no new records
    for _ in range(5):  # Spark asks for the latest offset every trigger while the input idles
        assert reader.latestOffset(end, ReadAllAvailable()) == end
    assert ends.asked == [{T0: 3, T1: 3}]
