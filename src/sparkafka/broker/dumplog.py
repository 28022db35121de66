"""kafka-dump-log for this broker's data directory: the batches of a topic's segment files."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from sparkafka.broker import records


def partition_directories(data_dir: Path, topic: str, partition: int | None = None) -> list[Path]:
    """The partition directories ``{topic}-{n}`` of a topic, in partition order."""
    found = []
    for directory in data_dir.glob(f"{topic}-*"):
        name, _, number = directory.name.rpartition("-")
        wanted = partition is None or (number.isdigit() and int(number) == partition)
        if directory.is_dir() and name == topic and number.isdigit() and wanted:
            found.append((int(number), directory))
    return [directory for _, directory in sorted(found)]


def dump_topic(
    data_dir: Path,
    topic: str,
    partition: int | None = None,
    *,
    print_records: bool = True,
    report_corrupt: Callable[[str], None] | None = None,
) -> Iterator[str]:
    """Lines as Kafka's kafka-dump-log.sh --print-data-log prints them, segment by segment.

    Raises FileNotFoundError when the data directory holds no log of the topic (or partition), or
    when a segment goes away between listing and reading it (a running broker's cleaner). A
    corrupt or torn tail ends the segment's dump with a line saying where, since the broker truncates
    such a tail on its next start; ``report_corrupt`` receives that line instead, when given."""
    if not data_dir.is_dir():
        raise FileNotFoundError(f"data directory {data_dir} does not exist (or is not a directory)")
    directories = partition_directories(data_dir, topic, partition)
    if not directories:
        which = "" if partition is None else f" partition {partition}"
        raise FileNotFoundError(f"no log for topic {topic!r}{which} in {data_dir}")
    for directory in directories:
        for segment in sorted(directory.glob("*.log")):
            yield f"Dumping {segment}"
            try:
                data = segment.read_bytes()
            except FileNotFoundError:
                # Listed a moment ago: a running broker's cleaner or retention swapped or deleted it.
                raise FileNotFoundError(
                    f"{segment} was removed while the log was being dumped (a running broker's cleaner "
                    "or retention replaced or deleted it): dump again, or stop the broker for a dump "
                    "that holds still"
                ) from None
            try:
                for position, header in records.iter_batches(data):
                    batch = data[position : position + header.size]
                    yield from records.format_batch_dump(
                        header, batch, position=position, print_records=print_records
                    )
            except records.CorruptBatchError as exc:
                message = f"corrupt or incomplete batch after byte {exc.valid_bytes} of {segment}: {exc}"
                if report_corrupt is None:
                    yield message
                else:
                    report_corrupt(message)
