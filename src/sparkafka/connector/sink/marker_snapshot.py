"""The read of step 3a of the exactly-once protocol (sink package docstring,
:mod:`sparkafka.connector.sink`), done once per run, not once per write task.

At the first batch of a query run every write task must know what the commit log holds of its
query: the partitions of its prefix and query id, read to their ends with read_committed after its
producer has initialised its id (which aborts what a crashed attempt left open). Read from offset 0
by every task, that costs (write tasks x everything those partitions hold, other queries' markers
included). Instead, in two parts:

(a) On the driver, before the tasks, when Spark creates the sink's writer (every micro-batch), the
    query's snapshot is taken from the checkpoint (one file per prefix under
    ``sparkafka/marker-snapshots/``): the records of those partitions that concern the query
    (:func:`concerns_query`), and per partition the last committed record the read returned (offset
    and digest). Where it is missing, names another topic, prefix, query or layout, or the topic's
    id changed (deleted and created again), it is read anew from the partitions' starts; where it is
    older than :data:`REFRESH_AFTER_S`, or more than :data:`REFRESH_AFTER_RECORDS` records were
    written past it, the partitions are read on from its last records. Both reads stop at the last
    stable offset and never wait on an open transaction; the snapshot is saved back.
(b) The writer carries the snapshot to every task. A task at its id's first write of a run (step 3a)
    reads each partition on from the snapshot's last record to its end (waiting out open
    transactions as a full read does) and lays what it reads over the snapshot
    (:func:`query_markers`). The quick read of step 2 (:func:`prefix_markers`) starts from it too.

Invariants:
- snapshot plus the rest equals a read from offset 0, for every key the protocol looks at: records
  before the last stable offset belong to decided transactions, so a read_committed read up to it
  returns or skips each of them for good; a read on starts at the snapshot's last committed record,
  so whatever the log holds after it (aborted records and transaction markers included) is read
  again; later records win, as in one read; a key read again takes its new value or leaves the
  snapshot; compaction keeps a key's newest record; the filter keeps every key that names the
  prefix or query, and every value that names the query (every record :mod:`.id_state` and the
  driver's check look at).
- a snapshot never stands in for a log it was not read from: a read on first reads the snapshot's
  last record again and compares its digest (key, value, timestamp, leader epoch); a log that no
  longer holds it there, or whose last stable offset is not past it (deleted and created again,
  truncated by an unclean election and perhaps written past it again, or compacted), is read from
  offset 0, and so is a topic with another id.
Limits: a tombstone written by hand into the marker topic and cleaned away before a task reads past
it leaves the snapshot's older value (the sink never writes tombstones); a log cut back by a lost
disk tail on a lone broker that keeps its leader epoch, then written past the snapshot's last record
with a record alike in key, value and timestamp at that very offset, passes for the log read."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from sparkafka.connector.sink.batch_plan import CheckpointFiles
from sparkafka.connector.sink.commit_log import (
    MarkerLayout,
    RecordAnchor,
    marker_layout,
    marker_partition_end,
    may_name_query,
    read_in_query_order,
    read_marker_partition_from,
    read_markers,
    read_query_markers,
)
from sparkafka.connector.sink.options import SinkOptions

log = logging.getLogger(__name__)

SNAPSHOT_DIRECTORY = "sparkafka/marker-snapshots"
# A snapshot is read on from its positions when it is older than this, or when more records than
# REFRESH_AFTER_RECORDS were written past its last record in one of its partitions (asked at every
# micro-batch: one offsets request per partition): so a task at a run's first batch reads at most
# about that many records of each partition, whenever the run starts.
REFRESH_AFTER_S = 60.0
REFRESH_AFTER_RECORDS = 10_000


@dataclass(frozen=True)
class MarkerSnapshot:
    """What the commit log holds of one query's prefix, read up to ``positions``."""

    topic: str
    # The marker topic's id (most, least significant bits) when read; None where the cluster
    # names none.
    topic_id: tuple[int, int] | None
    layout_partitions: int
    prefix: str
    query_id: str
    # Per partition read, the last committed record the read returned (None: it returned none), from
    # which a later read goes on, and the latest value of every key there that concerns the query
    # (:func:`concerns_query`).
    positions: Mapping[int, RecordAnchor | None]
    records: Mapping[int, Mapping[str, bytes]] = field(default_factory=dict)
    taken_ms: int = 0

    def is_for(self, options: SinkOptions, layout: MarkerLayout, prefix: str, query_id: str) -> bool:
        return (
            self.topic == options.marker_topic
            and self.layout_partitions == layout.partitions
            and self.prefix == prefix
            and self.query_id == query_id
        )

    @property
    def layout(self) -> MarkerLayout:
        """The topic's layout, as the driver found it: a layout never changes once the topic has it
        (:func:`~.commit_log.marker_layout`), so a task need not look again."""
        return MarkerLayout(self.layout_partitions)

    def encode(self) -> str:
        return json.dumps(
            {
                "version": 2,
                "topic": self.topic,
                "topic_id": None if self.topic_id is None else list(self.topic_id),
                "layout_partitions": self.layout_partitions,
                "prefix": self.prefix,
                "query_id": self.query_id,
                "positions": {
                    str(partition): None if anchor is None else [anchor.offset, anchor.digest]
                    for partition, anchor in self.positions.items()
                },
                "records": {
                    str(partition): {
                        key: base64.b64encode(value).decode() for key, value in of_partition.items()
                    }
                    for partition, of_partition in self.records.items()
                },
                "taken_ms": self.taken_ms,
            },
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, text: str) -> MarkerSnapshot:
        """The snapshot ``text`` holds; ValueError where it is not one this code wrote."""
        try:
            raw = json.loads(text)
            if raw.get("version") != 2:
                raise ValueError(f"version {raw.get('version')!r}, this code reads 2")
            topic_id = raw["topic_id"]
            return cls(
                topic=str(raw["topic"]),
                topic_id=None if topic_id is None else (int(topic_id[0]), int(topic_id[1])),
                layout_partitions=int(raw["layout_partitions"]),
                prefix=str(raw["prefix"]),
                query_id=str(raw["query_id"]),
                positions={
                    int(partition): None if anchor is None else RecordAnchor(int(anchor[0]), str(anchor[1]))
                    for partition, anchor in raw["positions"].items()
                },
                records={
                    int(partition): {key: base64.b64decode(value) for key, value in of_partition.items()}
                    for partition, of_partition in raw["records"].items()
                },
                taken_ms=int(raw["taken_ms"]),
            )
        except (AttributeError, KeyError, TypeError, ValueError, IndexError) as error:
            raise ValueError(f"not a commit-marker snapshot: {error}") from None


def concerns_query(key: str, value: bytes, prefix: str, query_id: str) -> bool:
    """Whether a record of the marker topic may matter to ``query_id`` writing under ``prefix``: its
    key names the prefix (the prefix's ids' markers and registrations, its claim, progress and
    refusal records) or the query (its ``query/`` records), or its value names the query (its
    markers under other prefixes). A superset of what the protocol reads: more is harmless, less
    would not be."""
    return prefix in key or query_id in key or may_name_query(query_id)(value)


def snapshot_for_run(
    options: SinkOptions,
    layout: MarkerLayout,
    prefix: str,
    query_id: str,
    topic_id: tuple[int, int] | None,
) -> MarkerSnapshot | None:
    """Part (a) of the module's text, on the driver before the tasks: the checkpoint's snapshot,
    taken anew or read on where needed and saved back; None where the checkpoint cannot be read or
    written (the tasks then read from offset 0)."""
    assert options.checkpoint_location is not None, "exactly-once writes have a checkpoint"
    files = CheckpointFiles(options.checkpoint_location)
    name = snapshot_file(prefix)
    saved = _load(files, name)
    usable = (
        saved
        if saved is not None
        and saved.is_for(options, layout, prefix, query_id)
        and (saved.topic_id == topic_id or topic_id is None)
        else None
    )
    now_ms = int(time.time() * 1000)
    if (
        usable is not None
        and now_ms - usable.taken_ms < REFRESH_AFTER_S * 1000
        and not _far_behind(options, usable)
    ):
        return usable
    snapshot = _read_on(options, layout, prefix, query_id, usable, topic_id, now_ms)
    try:
        files.write(name, snapshot.encode())
    except OSError as error:
        log.warning("could not save the commit-marker snapshot in the checkpoint: %s", error)
    return snapshot


def _far_behind(options: SinkOptions, snapshot: MarkerSnapshot) -> bool:
    """Whether a partition of ``snapshot`` has more than :data:`REFRESH_AFTER_RECORDS` records past
    its last record."""
    return any(
        marker_partition_end(options, partition) - (0 if anchor is None else anchor.offset)
        > REFRESH_AFTER_RECORDS
        for partition, anchor in snapshot.positions.items()
    )


def snapshot_file(prefix: str) -> str:
    """The checkpoint's file of ``prefix``'s snapshot: one per prefix, as two exactly-once writes of
    one foreachBatch function write under two prefixes."""
    return f"{SNAPSHOT_DIRECTORY}/{hashlib.sha256(prefix.encode()).hexdigest()[:24]}.json"


def _load(files: CheckpointFiles, name: str) -> MarkerSnapshot | None:
    try:
        text = files.text(name)
        return None if text is None else MarkerSnapshot.decode(text)
    except (OSError, ValueError) as error:
        # Only a cost: the snapshot is taken anew from the partitions' starts.
        log.warning("the checkpoint's commit-marker snapshot is unreadable (%s); reading anew", error)
        return None


def _read_on(
    options: SinkOptions,
    layout: MarkerLayout,
    prefix: str,
    query_id: str,
    previous: MarkerSnapshot | None,
    topic_id: tuple[int, int] | None,
    now_ms: int,
) -> MarkerSnapshot:
    """The partitions :func:`read_query_markers` reads, each to its last stable offset: on from
    ``previous``'s last record over its records where the log still holds that record, else from
    the start. A key read again takes its new value, or leaves the snapshot where that no longer
    concerns the query (another query's marker of an id this query wrote under once)."""
    records: dict[int, dict[str, bytes]] = {}
    positions: dict[int, RecordAnchor | None] = {}

    def read(partition: int) -> dict[str, bytes]:
        start = None if previous is None else previous.positions.get(partition)
        found = (
            None if start is None else read_marker_partition_from(options, partition, start, stable_only=True)
        )
        kept: dict[str, bytes] = {}
        if found is None:  # no position, or one the log no longer holds: from the start
            found = read_marker_partition_from(options, partition, None, stable_only=True)
            assert found is not None, "a read from the log's start always has its start"
        elif previous is not None:
            kept.update(previous.records.get(partition, {}))
        for key, value in found.latest.items():
            if concerns_query(key, value, prefix, query_id):
                kept[key] = value
            else:
                kept.pop(key, None)
        records[partition], positions[partition] = kept, found.last
        return kept

    read_in_query_order(layout, prefix, query_id, read)
    return MarkerSnapshot(
        options.marker_topic, topic_id, layout.partitions, prefix, query_id, positions, records, now_ms
    )


def task_layout(
    options: SinkOptions, snapshot: MarkerSnapshot | None, prefix: str, query_id: str
) -> MarkerLayout:
    """The marker topic's layout for a write task: the snapshot's where it is this query's, else
    asked of the topic (:func:`~.commit_log.marker_layout`)."""
    if snapshot is not None and snapshot.is_for(options, snapshot.layout, prefix, query_id):
        return snapshot.layout
    return marker_layout(options)


def prefix_markers(
    options: SinkOptions,
    layout: MarkerLayout,
    prefix: str,
    query_id: str,
    snapshot: MarkerSnapshot | None,
) -> dict[str, bytes]:
    """Step 2 of the protocol (sink package docstring): what the partition of ``prefix`` holds to
    its last stable offset, as ``read_markers(options, prefix, stable_only=True)`` finds it (a quick
    look that never waits on an open transaction) — from the snapshot's position where it is this
    query's."""
    partition = layout.partition_of(prefix)
    if (
        snapshot is not None
        and partition in snapshot.positions
        and snapshot.is_for(options, layout, prefix, query_id)
    ):
        found = _read_past(options, snapshot, partition, stable_only=True)
        if found is not None:
            return found
    return read_markers(options, prefix, stable_only=True, layout=layout)


def _read_past(
    options: SinkOptions, snapshot: MarkerSnapshot, partition: int, *, stable_only: bool = False
) -> dict[str, bytes] | None:
    """The snapshot's records of ``partition`` with what the log holds past its position laid over
    them; None where the log no longer holds the record at that position."""
    anchor = snapshot.positions[partition]
    read = read_marker_partition_from(options, partition, anchor, stable_only=stable_only)
    return None if read is None else {**snapshot.records.get(partition, {}), **read.latest}


class _NotInSnapshot(Exception):
    """A partition the snapshot does not cover, or one whose log no longer holds its position."""


def query_markers(
    options: SinkOptions,
    layout: MarkerLayout,
    prefix: str,
    query_id: str,
    snapshot: MarkerSnapshot | None,
) -> dict[str, bytes]:
    """Part (b) of the module's text, in a write task at step 3a of the protocol (sink package
    docstring), and in the driver's check after the tasks: what the marker topic holds of ``prefix``
    and of every prefix ``query_id`` claimed, to the partitions' ends, as :func:`read_query_markers`
    finds it — from the snapshot's positions where it is this query's, from offset 0 otherwise."""
    if snapshot is None or not snapshot.is_for(options, layout, prefix, query_id):
        return read_query_markers(options, layout, prefix, query_id)

    def read_rest(partition: int) -> dict[str, bytes]:
        if partition not in snapshot.positions:  # a prefix claimed since the snapshot, elsewhere
            raise _NotInSnapshot
        found = _read_past(options, snapshot, partition)
        if found is None:
            anchor = snapshot.positions[partition]
            assert anchor is not None, "a read from the log's start always has its start"
            log.warning(
                "%s-%d no longer holds the record at offset %d where the run's commit-marker snapshot "
                "ends (the log went back, or compaction removed it): reading the commit markers from "
                "the start",
                options.marker_topic,
                partition,
                anchor.offset,
            )
            raise _NotInSnapshot
        return found

    try:
        return read_in_query_order(layout, prefix, query_id, read_rest)
    except _NotInSnapshot:
        return read_query_markers(options, layout, prefix, query_id)
