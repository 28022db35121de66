"""What the checkpoint says about the micro-batch being written: its id, the input it was planned
from, and the query it belongs to, read on the driver when Spark creates the batch's writer.

Why. A commit marker says that a transactional id committed micro-batch ``b`` of a query. Whether a
later micro-batch numbered ``b`` is *the same batch* depends on the checkpoint's offsets log: a crash
replays ``offsets/b`` as it was written, but a checkpoint restored from an older copy, or one that
lost its newest entries, makes Spark plan ``b`` anew from the input present now. The plan digest
(:attr:`BatchPlan.digest`) tells the two apart: it hashes the source lines of ``offsets/b`` and of
``offsets/b-1`` (where ``b`` starts), so a replay has the digest its markers recorded and a batch
planned anew does not.

When. Spark creates the sink's writer for every micro-batch on the driver, after it wrote
``offsets/b``: the newest entry of the offsets log is the batch about to be written. The write tasks
check that their batch id is that entry's before they trust the digest.

Where from. The sink's ``checkpointLocation`` option, which Spark hands every streaming sink when
the query sets it. A local directory or a ``file:`` URI is read directly; other file systems through
``pyarrow.fs`` (S3, GCS, HDFS where pyarrow finds them). A checkpoint that cannot be read leaves the
digest unknown, and the checks that need it are skipped (said once in the log): markers still catch
a checkpoint behind its output by batch id.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlparse

from sparkafka.connector.source.offsets import FIRST_BATCH_START_PREFIX, OWN_ENTRY_PREFIX

log = logging.getLogger(__name__)

_OFFSETS = "offsets"
_METADATA = "metadata"
_SOURCE_LINES_FROM = 2  # offsets/<b>: "v1", the batch metadata, then one line per source


@dataclass(frozen=True)
class BatchPlan:
    """The newest entry of a checkpoint's offsets log (the micro-batch about to be written)."""

    batch_id: int
    # sha256 (hex, 32 characters) of the source lines of offsets/<batch_id> and offsets/<batch_id - 1>.
    digest: str
    # The source lines of offsets/<batch_id>: where each source ends this batch ("-" for none).
    end_offsets: tuple[str, ...]
    # The query id the checkpoint's metadata file names (StreamingQuery.id), when readable.
    query_id: str | None
    # The input records between the batch's start and end offsets (Kafka sources), None when unknown.
    input_records: int | None = None
    # The source lines of offsets/<batch_id - 1>: where each source starts this batch (None for 0).
    start_offsets: tuple[str, ...] | None = None
    # The commit-marker topic in which the checkpoint recorded, before this batch's writer was
    # created, that the query claimed its transactional-id prefix (claims.settle_checkpoint_claim).
    claimed_in: str | None = None


class CheckpointFiles:
    """Files of a checkpoint, on the local file system or through pyarrow's file systems."""

    def __init__(self, location: str) -> None:
        parsed = urlparse(location)
        if parsed.scheme in ("", "file"):
            self.root = parsed.path if parsed.scheme else location
            self._fs = None
        else:
            from pyarrow import fs

            self._fs, self.root = fs.FileSystem.from_uri(location)

    def names(self, directory: str) -> list[str]:
        path = f"{self.root.rstrip('/')}/{directory}"
        if self._fs is None:
            return os.listdir(path) if os.path.isdir(path) else []
        from pyarrow import fs

        infos = self._fs.get_file_info(fs.FileSelector(path, allow_not_found=True))
        return [info.base_name for info in infos]

    def text(self, name: str) -> str | None:
        path = f"{self.root.rstrip('/')}/{name}"
        if self._fs is None:
            try:
                with open(path, encoding="utf-8") as file:
                    return file.read()
            except FileNotFoundError:
                return None
        try:
            with self._fs.open_input_stream(path) as stream:
                return bytes(stream.read()).decode("utf-8")
        except FileNotFoundError:
            return None

    def write(self, name: str, text: str) -> None:
        """Replace the file ``name`` with ``text``, whole: a reader sees the old text or the new."""
        path = f"{self.root.rstrip('/')}/{name}"
        parent = path.rsplit("/", 1)[0]
        from pyarrow import fs

        if self._fs is None:
            os.makedirs(parent, exist_ok=True)
            temporary = f"{path}.{os.getpid()}.tmp"
            with open(temporary, "w", encoding="utf-8") as file:
                file.write(text)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
            return
        self._fs.create_dir(parent, recursive=True)
        # Written aside, then moved: a reader never sees part of it (an object store's move is a
        # copy of a complete object; HDFS's rename does not replace, hence the delete before it).
        temporary = f"{path}.{os.getpid()}.tmp"
        with self._fs.open_output_stream(temporary) as stream:
            stream.write(text.encode("utf-8"))
        if self._fs.get_file_info(path).type != fs.FileType.NotFound:
            self._fs.delete_file(path)
        self._fs.move(temporary, path)


def read_batch_plan(checkpoint_location: str | None) -> BatchPlan | None:
    """The newest offsets-log entry of ``checkpoint_location``; None when there is none or it cannot
    be read (said once per location in the log)."""
    if not checkpoint_location:
        return None
    try:
        reader = CheckpointFiles(checkpoint_location)
        batches = sorted(int(name) for name in reader.names(_OFFSETS) if name.isdigit())
        if not batches:
            # Spark wrote the batch's entry before it created this writer: the sink reads elsewhere
            # (a path Spark resolves against another default file system, say).
            _warn_unreadable_once(checkpoint_location, "no offsets-log entry found there")
            return None
        newest = batches[-1]
        end = _source_lines(reader.text(f"{_OFFSETS}/{newest}"))
        start = _source_lines(reader.text(f"{_OFFSETS}/{newest - 1}")) if newest > 0 else ()
        if end is None:
            return None
        # A query's first batch carries its own start (the source resolved startingOffsets into it).
        begins = (start or None) if newest > 0 else _first_batch_starts(end)
        return BatchPlan(
            newest,
            plan_digest(start or (), end),
            end,
            _query_id(reader.text(_METADATA)),
            input_records_between(begins, end),
            begins,
        )
    except Exception as error:  # an unreadable checkpoint leaves the check to the batch ids alone
        _warn_unreadable_once(checkpoint_location, f"{type(error).__name__}: {error}")
        return None


def plan_digest(start: Sequence[str], end: Sequence[str]) -> str:
    """The digest of a micro-batch planned from ``start`` to ``end`` (source lines of the offsets log)."""
    joined = json.dumps([list(start), list(end)], separators=(",", ":"))
    return hashlib.sha256(joined.encode()).hexdigest()[:32]


def input_records_between(start: Sequence[str] | None, end: Sequence[str]) -> int | None:
    """The offsets between two offsets-log entries of Kafka sources (``{"topic": {"partition":
    offset}}``, ``sparkafka:`` entries left out), summed; None when a source line is not of that shape
    or a partition has no start (a batch's first, for one)."""
    if start is None:
        return None
    compared = _offset_differences(start, end)
    return None if compared is None else sum(max(0, difference) for difference in compared[0])


def _offset_differences(start: Sequence[str], end: Sequence[str]) -> tuple[list[int], bool] | None:
    """End minus start for every partition of ``end`` (source lines of the offsets log, Kafka
    sources, ``sparkafka:`` entries left out), and whether ``start`` names exactly those partitions;
    None when a line is not of that shape or a partition of ``end`` has no start."""
    if len(start) != len(end):
        return None
    differences: list[int] = []
    same_partitions = True
    for start_line, end_line in zip(start, end, strict=True):
        try:
            starts, ends = json.loads(start_line), json.loads(end_line)
        except json.JSONDecodeError:
            return None
        if not isinstance(starts, dict) or not isinstance(ends, dict):
            return None
        for topic, partitions in ends.items():
            if topic.startswith(OWN_ENTRY_PREFIX):
                continue
            begun = starts.get(topic)
            if not isinstance(partitions, dict) or not isinstance(begun, dict):
                return None
            if not set(partitions) <= set(begun):
                return None
            same_partitions = same_partitions and set(begun) == set(partitions)
            differences.extend(
                int(offset) - int(begun[partition]) for partition, offset in partitions.items()
            )
    return differences, same_partitions


def _first_batch_starts(end: Sequence[str]) -> tuple[str, ...] | None:
    """The start of a query's first batch, from the ``sparkafka:firstBatchStart:<topic>`` entries of
    its end offsets, as source lines of Spark's shape; None where a source line has none."""
    lines = []
    for line in end:
        try:
            parsed = json.loads(line)
        except json.JSONDecodeError:
            return None
        if not isinstance(parsed, dict):
            return None
        starts = {
            key[len(FIRST_BATCH_START_PREFIX) :]: value
            for key, value in parsed.items()
            if key.startswith(FIRST_BATCH_START_PREFIX)
        }
        if not starts:
            return None
        lines.append(json.dumps(starts, separators=(",", ":"), sort_keys=True))
    return tuple(lines)


def offsets_gap(start: Sequence[str], end: Sequence[str]) -> tuple[int, int] | None:
    """How a query starting at ``start`` stands to input that ended at ``end`` (source lines of
    the offsets log, Kafka sources): the records of ``end`` it reads again (start below end) and
    those it never reads (start above end), summed over partitions; None when they cannot be
    compared (other sources, a partition missing from either)."""
    compared = _offset_differences(start, end)
    if compared is None or not compared[1]:
        return None
    differences = compared[0]
    return sum(max(0, d) for d in differences), sum(max(0, -d) for d in differences)


def _source_lines(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    lines = text.splitlines()
    if len(lines) < _SOURCE_LINES_FROM or not lines[0].startswith("v"):
        raise ValueError(f"not an offsets-log entry: {text[:80]!r}")
    return tuple(lines[_SOURCE_LINES_FROM:])


def _query_id(text: str | None) -> str | None:
    if not text:
        return None
    found = json.loads(text.splitlines()[0]).get("id")
    return str(found) if found else None


@functools.cache
def _warn_unreadable_once(location: str, reason: str) -> None:
    log.warning(
        "the exactly-once sink cannot read the checkpoint %s (%s): a micro-batch planned anew after the "
        "checkpoint went back (restored from an older copy) is then recognised by its batch id only. "
        "Make the checkpoint readable from the driver's Python (a local path, or a file system pyarrow "
        "reaches)",
        location,
        reason,
    )


def starting_offsets_of(end_offsets: Sequence[str]) -> str | None:
    """Spark's ``startingOffsets`` JSON for a query that starts where ``end_offsets`` (one source
    line of the offsets log) ended: the source's own ``sparkafka:`` entries dropped. None unless
    there is exactly one source and it is a Kafka source."""
    lines = [line for line in end_offsets if line.strip() and line.strip() != "-"]
    if len(lines) != 1:
        return None
    try:
        parsed = json.loads(lines[0])
    except json.JSONDecodeError:
        return None
    if not isinstance(parsed, dict):
        return None
    topics = {
        topic: partitions
        for topic, partitions in parsed.items()
        if not topic.startswith(OWN_ENTRY_PREFIX) and isinstance(partitions, dict)
    }
    return json.dumps(topics, separators=(",", ":"), sort_keys=True) if topics else None
