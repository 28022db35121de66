"""``sparkafka checkpoint to-spark-kafka``: make a streaming checkpoint written by sparkafka's source
readable by Spark's own ``kafka`` format, the way back for a query that leaves sparkafka.

Spark keeps a micro-batch query's source offsets in ``<checkpoint>/offsets/<batch id>``: a version
line (``v1``), a line of batch metadata, then one line per source, its offset as JSON or ``-``.
sparkafka's offsets have the shape of Spark's Kafka offsets (``{"topic": {"partition": offset}}``)
plus entries of its own whose keys start with ``sparkafka:`` (never a topic: Kafka topic names
cannot contain ``:``). Spark's Kafka source refuses any such entry whose partitions are not numbers
(every batch sparkafka planned records its split that way) and would take the others for topics,
so they must go. Nothing else in the checkpoint depends on the source's format: the query id, the
commit log and the state stores carry over as they are.

Steps of :func:`to_spark_kafka` (the query must be stopped: Spark keeps no lock on a checkpoint):

1. Check that the directory is a streaming checkpoint (``metadata`` and ``offsets/``) whose first
   micro-batch is committed: Spark's source replays an uncommitted first batch from the start it
   keeps in ``sources/<n>/0``, a file a Python data source never writes, so it would resolve
   ``startingOffsets`` anew and read other records than sparkafka planned. And that every offsets
   file is of version 1 (a ``v2`` log, Spark 4.3's format for named sources, is refused).
2. Copy ``offsets/`` and ``commits/`` to the backup directory, which must not exist yet.
3. In every offsets file, drop the ``sparkafka:`` entries from each source line; check that what
   is left has Spark's shape; write the file anew (a temporary file renamed over it) and delete its
   ``.<batch id>.crc`` checksum, which no longer matches (Hadoop's checksummed file system refuses a
   file whose checksum disagrees and reads one without a checksum file as it is).

Files that hold no ``sparkafka:`` entry are left alone, so a second run changes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sparkafka.connector.api import OWN_ENTRY_PREFIX
from sparkafka.errors import SparkafkaError

_COPIED = ("offsets", "commits")


class CheckpointError(SparkafkaError):
    """A checkpoint cannot be rewritten as asked; nothing was changed."""


@dataclass
class Rewrite:
    """What :func:`to_spark_kafka` did."""

    backup: Path
    rewritten_batches: list[int] = field(default_factory=list)
    removed_entries: set[str] = field(default_factory=set)


def default_backup(checkpoint: Path) -> Path:
    """``<checkpoint>.backup-<UTC time>`` beside the checkpoint (outside it, where Spark never looks)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    return checkpoint.with_name(f"{checkpoint.name}.backup-{stamp}")


def to_spark_kafka(checkpoint: Path, backup: Path | None = None) -> Rewrite:
    """Rewrite the offsets log of ``checkpoint`` for Spark's kafka format (see the module docstring)."""
    offsets_dir = checkpoint / "offsets"
    if not (checkpoint / "metadata").is_file() or not offsets_dir.is_dir():
        raise CheckpointError(
            f"{checkpoint} is not a streaming query's checkpoint: it needs a 'metadata' file and an "
            "'offsets' directory (the checkpointLocation of a query that ran at least one micro-batch)"
        )
    if (offsets_dir / "0").exists() and not (checkpoint / "commits" / "0").exists():
        raise CheckpointError(
            f"the first micro-batch of {checkpoint} is not committed: Spark's kafka source would replay it "
            "from a start it keeps in sources/<n>/0, which sparkafka never writes, and read other records. "
            "Run the query on sparkafka until its first micro-batch is committed, then rewrite"
        )
    backup = backup or default_backup(checkpoint)
    if backup.exists():
        raise CheckpointError(f"the backup directory {backup} exists already: name another with --backup")
    batches = sorted((int(path.name), path) for path in offsets_dir.iterdir() if path.name.isdigit())
    planned = [(batch, path, _without_own_entries(path)) for batch, path in batches]

    backup.mkdir(parents=True)
    for name in _COPIED:
        if (checkpoint / name).is_dir():
            shutil.copytree(checkpoint / name, backup / name)
    result = Rewrite(backup=backup)
    for batch, path, (text, removed) in planned:
        if not removed:
            continue
        temporary = path.with_name(f".{path.name}.sparkafka-rewrite")
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
        (path.parent / f".{path.name}.crc").unlink(missing_ok=True)
        result.rewritten_batches.append(batch)
        result.removed_entries |= removed
    return result


def _without_own_entries(path: Path) -> tuple[str, set[str]]:
    """The text of offsets file ``path`` without sparkafka's entries, and the keys removed. Fails,
    changing nothing, when the file or what is left of a source line is not what Spark reads."""
    lines = path.read_text(encoding="utf-8").split("\n")
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise CheckpointError(f"{path} is not an offsets file of Spark's (a 'v1' line, then metadata)")
    if lines[0] != "v1":
        raise CheckpointError(
            f"{path} is an offsets file of version {lines[0][1:]!r}; this command rewrites version 1 only "
            "(Spark writes version 2 for named sources or spark.sql.streaming.offsetLog.formatVersion=2)"
        )
    removed: set[str] = set()
    for index in range(2, len(lines)):
        line = lines[index]
        if not line.startswith("{"):
            continue  # "-" (a source without an offset yet), or the empty remainder after the last line
        try:
            offset = json.loads(line)
        except json.JSONDecodeError as error:
            raise CheckpointError(f"{path}, line {index + 1}: not JSON ({error})") from None
        own = {key for key in offset if key.startswith(OWN_ENTRY_PREFIX)}
        if not own:
            continue
        kept = {key: value for key, value in offset.items() if key not in own}
        _check_spark_kafka_shape(path, index, kept)
        removed |= own
        lines[index] = json.dumps(kept, separators=(",", ":"))
    return "\n".join(lines), removed


def _check_spark_kafka_shape(path: Path, index: int, offset: dict[str, object]) -> None:
    for topic, partitions in offset.items():
        if not isinstance(partitions, dict) or not all(
            str(partition).lstrip("-").isdigit() and isinstance(position, int)
            for partition, position in partitions.items()
        ):
            raise CheckpointError(
                f"{path}, line {index + 1}: entry {topic!r} is not a topic's partition offsets "
                '({"partition": offset}); this source line is not one of sparkafka\'s Kafka offsets'
            )
