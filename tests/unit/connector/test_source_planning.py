"""The source's planning steps one by one (sparkafka.connector.source.planning) and the typed source
offset they plan from (offsets.SourceOffset): no Kafka, no Spark. KafkaStreamReader.latestOffset,
which chains them, is tested in test_source_heartbeat.py, test_source_discovery.py and
test_leader_epochs.py."""

from __future__ import annotations

import json
import logging

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from sparkafka.connector.source.offsets import (
    INITIAL_OFFSET_KEY,
    UNRESOLVED_START,
    SourceOffset,
    Split,
)
from sparkafka.connector.source.planning import (
    AdmissionControl,
    LogFindings,
    TransactionHolds,
    place_new_partitions,
    reconcile,
    report_gone,
)
from sparkafka.errors import CheckpointFormatError, DataLossError

from .test_source_heartbeat import T0, T1, FakeAdmin, FakeClock, clock, parse, reader_with

__all__ = ["clock"]  # the fixture, used by name
T2 = ("t", 2)


# -- the typed source offset ---------------------------------------------------------------------------


def test_a_source_offset_encodes_as_checkpoints_hold_it_and_decodes_back() -> None:
    """The JSON every release wrote to the offsets log for these entries: a checkpoint written before
    must decode, and equal offsets must stay equal text (the engine compares it)."""
    positions = {T0: 5, T1: 7, ("u", 10): 1, ("u", 2): 3}
    in_checkpoints = json.loads(
        '{"sparkafka:firstBatchStart:t":{"0":1,"1":2},"sparkafka:heldStart:t":{"1":7},'
        '"sparkafka:idleHeartbeat":{"0":42},"sparkafka:leaderEpoch:t":{"0":3,"1":3},'
        '"sparkafka:split":{"calculator":2,"maxRecordsPerPartition":0,"minPartitions":3},'
        '"sparkafka:topicId:t":{"lsb":2,"msb":1},"sparkafka:topicId:u":{"lsb":4,"msb":3},'
        '"t":{"0":5,"1":7},"u":{"2":3,"10":1}}'
    )
    typed = SourceOffset(
        positions,
        heartbeat_ms=42,
        first_batch_start={T0: 1, T1: 2},
        held_starts={T1: 7},
        leader_epochs={T0: 3, T1: 3},
        topic_ids={"t": (1, 2), "u": (3, 4), "not-read": (5, 6)},
        split=Split(3, None),
    )
    encoded = typed.encode()
    assert encoded == in_checkpoints
    assert json.dumps(encoded) == json.dumps(in_checkpoints), "the same key order: the engine compares text"
    assert list(encoded["u"]) == ["2", "10"], "partitions in numeric order"
    decoded = SourceOffset.decode(encoded)
    assert decoded.positions == positions and decoded.heartbeat_ms == 42
    assert decoded.first_batch_start == {T0: 1, T1: 2} and decoded.held_starts == {T1: 7}
    assert decoded.leader_epochs == {T0: 3, T1: 3} and decoded.split == Split(3, None)
    assert decoded.topic_ids == {"t": (1, 2), "u": (3, 4)}, "only the ids of topics the offset reads"
    assert not decoded.initial and not decoded.unresolved_start


def test_the_initial_and_unresolved_marks_round_trip() -> None:
    initial = SourceOffset({T0: 0}, initial=True, first_batch_start={T0: 0}).encode()
    assert initial == {
        "sparkafka:firstBatchStart:t": {"0": 0},
        "sparkafka:initialOffset": {"0": 0},
        "t": {"0": 0},
    }
    assert INITIAL_OFFSET_KEY in initial and SourceOffset.decode(initial).initial
    unresolved = SourceOffset.decode(UNRESOLVED_START)
    assert unresolved.unresolved_start and unresolved.positions == {}
    assert unresolved.encode() == UNRESOLVED_START


def test_an_offset_without_entries_of_its_own_decodes_to_none_and_empty() -> None:
    """Offsets checkpointed by Spark's kafka format, or before sparkafka recorded its entries."""
    bare = SourceOffset.decode({"t": {"0": 4}})
    assert bare == SourceOffset({T0: 4})
    assert bare.encode() == {"t": {"0": 4}}


@pytest.mark.parametrize(
    "entry",
    [
        {"sparkafka:split": {"calculator": "x"}},
        {"sparkafka:heldStart:t": {"a": 1}},
        {"sparkafka:topicId:t": {"msb": "not a number", "lsb": 1}},
        {"t": {"zero": 5}},
    ],
)
def test_an_offset_that_does_not_parse_fails_naming_it(entry: dict) -> None:
    """sparkafka never writes one: a hand-edited or damaged checkpoint. Planning fails before it
    reads or commits anything, rather than plan from the entries it can parse."""
    with pytest.raises(
        CheckpointFormatError, match="a source offset in the checkpoint does not parse"
    ) as failed:
        SourceOffset.decode({"t": {"0": 5}, **entry})
    assert "restore the checkpoint's offsets log" in str(failed.value)


def test_a_malformed_checkpointed_start_fails_the_plan_before_the_group_commit() -> None:
    admin = FakeAdmin()
    reader = reader_with(admin, **{"kafka.group.id": "g"})
    with pytest.raises(CheckpointFormatError):
        reader.latestOffset(
            {"t": {"0": 0, "1": 0}, "sparkafka:split": {"calculator": "x"}}, ReadAllAvailable()
        )
    assert admin.group_commits == []
    reader.latestOffset({"t": {"0": 0, "1": 0}}, ReadAllAvailable())
    assert admin.group_commits == [{T0: 0, T1: 0}], "a well-formed start is committed to the group"


# -- steps 3 and 4: holds, gone partitions, each partition's end ---------------------------------------


def test_only_initial_or_still_held_starting_offsets_may_wait_for_a_transaction() -> None:
    initial = SourceOffset({T0: 5, T1: 6}, initial=True)
    assert TransactionHolds.may_hold(initial) == {T0, T1}
    # Held at 6 by the previous batch and still there; partition 0 moved on from its held start.
    later = SourceOffset({T0: 9, T1: 6}, held_starts={T0: 5, T1: 6})
    assert TransactionHolds.may_hold(later) == {T1}
    assert TransactionHolds.may_hold(SourceOffset({T0: 5})) == set()


def test_gone_partitions_fail_the_query_or_are_left_out_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    start = SourceOffset({T0: 5, T1: 6})
    with pytest.raises(DataLossError, match=r"partitions \[t-1\] are gone"):
        report_gone(parse(), start, {T0: 9})
    with caplog.at_level(logging.WARNING):
        assert report_gone(parse(failOnDataLoss="false"), start, {T0: 9}) == [T1]
    assert "are gone" in caplog.text
    assert report_gone(parse(), start, {T0: 9, T1: 9}) == []


def test_each_partition_reads_up_to_its_latest_offset_capped_by_the_available_now_target() -> None:
    start = SourceOffset({T0: 5, T1: 6, T2: 7})
    latest = {T0: 50, T1: 60, T2: 7}
    assert reconcile(parse(), start, latest, {}, LogFindings(), set(), None).end == {T0: 50, T1: 60, T2: 7}
    target = {T0: 20, T1: 3}  # partition 1's target lies behind the start; partition 2 has none
    capped = reconcile(parse(), start, latest, {}, LogFindings(), set(), target)
    assert capped.end == {T0: 20, T1: 6, T2: 7} and capped.reset == []


def test_held_and_unchecked_partitions_stay_where_they_are() -> None:
    start = SourceOffset({T0: 5, T1: 6}, leader_epochs={T0: 2, T1: 2})
    epochs = {T0: 3, T1: 3}
    findings = LogFindings(unchecked={T0})
    planned = reconcile(parse(), start, {T0: 50, T1: 4}, epochs, findings, {T1}, None)
    assert planned.end == {T0: 5, T1: 6}
    assert epochs == {T0: 2, T1: 3}, "an unchecked position keeps the epoch it was recorded in"


def test_a_truncated_log_reads_on_from_the_truncation_or_fails(caplog: pytest.LogCaptureFixture) -> None:
    start = SourceOffset({T0: 100, T1: 100})
    findings = LogFindings(truncated={T0: 60})
    with pytest.raises(DataLossError, match="offsets 60 to 99"):
        reconcile(parse(), start, {T0: 180, T1: 120}, {}, findings, set(), None)
    with caplog.at_level(logging.WARNING):
        planned = reconcile(
            parse(failOnDataLoss="false"), start, {T0: 180, T1: 120}, {}, findings, set(), None
        )
    assert planned.end == {T0: 60, T1: 120} and planned.reset == []
    assert "unclean leader election" in caplog.text


def test_a_recreated_topic_or_a_latest_offset_gone_back_starts_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    start = SourceOffset({T0: 100, T1: 100})
    findings = LogFindings(recreated={T0})
    with pytest.raises(DataLossError, match="deleted and created again"):
        reconcile(parse(), start, {T0: 180, T1: 120}, {}, findings, set(), None)
    with pytest.raises(DataLossError, match="went back from 100 to 40"):
        reconcile(parse(), start, {T0: 180, T1: 40}, {}, LogFindings(), set(), None)
    with caplog.at_level(logging.WARNING):
        planned = reconcile(
            parse(failOnDataLoss="false"), start, {T0: 180, T1: 40}, {}, findings, set(), None
        )
    assert planned.reset == [T0, T1] and planned.end == {}


# -- step 5: new and reset partitions -----------------------------------------------------------------


def test_new_and_reset_partitions_start_at_their_earliest_offset(caplog: pytest.LogCaptureFixture) -> None:
    start = SourceOffset({T0: 100})
    planned = reconcile(parse(failOnDataLoss="false"), start, {T0: 40, T1: 9}, {}, LogFindings(), set(), None)
    with caplog.at_level(logging.INFO):
        place_new_partitions(parse(failOnDataLoss="false"), planned, [T1], {T0: 3, T1: 0}, None)
    assert planned.end == {T0: 3, T1: 0}
    assert "discovered partition t-1; reading it from offset 0" in caplog.text


def test_a_new_partition_whose_log_starts_above_zero_lost_records() -> None:
    planned = reconcile(parse(), SourceOffset({T0: 1}), {T0: 1, T1: 9}, {}, LogFindings(), set(), None)
    with pytest.raises(DataLossError, match="added partition t-1 starts from offset 4 instead of 0"):
        place_new_partitions(parse(), planned, [T1], {T1: 4}, None)
    lenient = parse(failOnDataLoss="false")
    place_new_partitions(lenient, planned, [T1, T2], {T1: 4}, {T1: 2})
    assert planned.end == {T0: 1, T1: 2}, "capped by the AvailableNow target; no answer, not placed"


# -- step 6: admission control ------------------------------------------------------------------------


def test_min_offsets_wait_until_enough_or_the_delay_passed(clock: FakeClock) -> None:
    control = AdmissionControl(parse(minOffsetsPerTrigger="10", maxTriggerDelay="5s"))
    start, small, large = {T0: 0}, {T0: 4}, {T0: 12}
    assert control.apply(start, small, ReadMinRows(10), may_wait=True, available_now=False) == small, (
        "the first trigger never waits"
    )
    assert control.apply(start, small, ReadMinRows(10), may_wait=True, available_now=False) == start
    assert control.apply(start, large, ReadMinRows(10), may_wait=True, available_now=False) == large
    assert control.apply(start, small, ReadMinRows(10), may_wait=False, available_now=False) == small
    assert control.apply(start, small, ReadMinRows(10), may_wait=True, available_now=True) == small
    clock.advance(1000)
    assert control.apply(start, small, ReadMinRows(10), may_wait=True, available_now=False) == start
    clock.advance(5000)
    assert control.apply(start, small, ReadMinRows(10), may_wait=True, available_now=False) == small


def test_max_offsets_cap_the_batch_from_the_limit_or_the_options() -> None:
    start, end = {T0: 0, T1: 0}, {T0: 10, T1: 10}
    assert AdmissionControl(parse()).apply(
        start, end, ReadMaxRows(4), may_wait=True, available_now=False
    ) == {
        T0: 2,
        T1: 2,
    }
    options = parse(maxOffsetsPerTrigger="6")
    capped = AdmissionControl(options).apply(
        start, end, ReadAllAvailable(), may_wait=True, available_now=False
    )
    assert capped == {T0: 3, T1: 3}


def test_a_malformed_checkpointed_end_fails_the_batch_plan_naming_it() -> None:
    """A replay plans its ranges from the end in the offsets log: one that does not parse fails
    before any range is planned, with the checkpoint's own error rather than a KeyError."""
    reader = reader_with(FakeAdmin())
    with pytest.raises(CheckpointFormatError, match="does not parse"):
        reader.partitions(
            {"t": {"0": 0, "1": 0}}, {"t": {"0": 4, "1": 4}, "sparkafka:split": {"calculator": "x"}}
        )
    assert reader.partitions({"t": {"0": 0, "1": 0}}, {"t": {"0": 4, "1": 4}}), "a well-formed end plans"


def test_the_zero_topic_id_of_a_cluster_without_ids_names_no_topic() -> None:
    """Kafka 2.7 and older answer the zero UUID for every topic: recorded so by an earlier release, it
    must not make a topic look created again once the cluster names real ids."""
    recorded = SourceOffset({T0: 5}, topic_ids={"t": (0, 0)}).encode()
    assert SourceOffset.decode(recorded).topic_ids == {}
    assert SourceOffset.decode(SourceOffset({T0: 5}, topic_ids={"t": (1, 2)}).encode()).topic_ids == {
        "t": (1, 2)
    }
