"""kafka-dump-log for this broker's data directory: the batches of a topic's segment files."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from sparkafka.broker import records
from sparkafka.broker.records import (
    COMPRESSION_NAMES,
    CONTROL_KEY,
    CONTROL_TYPE_NAMES,
    END_TXN_VALUE,
    LOG_APPEND_TIME,
    NO_SEQUENCE,
    BatchHeader,
    Buffer,
    CodecUnavailableError,
    CorruptBatchError,
    InvalidRecordError,
    Record,
    crc_is_valid,
    decode_records,
    increment_sequence,
)


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
                    yield from format_batch_dump(
                        header, batch, position=position, print_records=print_records
                    )
            except records.CorruptBatchError as exc:
                message = f"corrupt or incomplete batch after byte {exc.valid_bytes} of {segment}: {exc}"
                if report_corrupt is None:
                    yield message
                else:
                    report_corrupt(message)


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")  # Kafka's StringDecoder also replaces malformed UTF-8


def _control_description(record: Record) -> str:
    key = record.key or b""
    control_type = CONTROL_KEY.unpack_from(key)[1] if len(key) >= CONTROL_KEY.size else -1
    if control_type in (0, 1) and record.value is not None and len(record.value) >= END_TXN_VALUE.size:
        coordinator_epoch = END_TXN_VALUE.unpack_from(record.value)[1]
        return f" endTxnMarker: {CONTROL_TYPE_NAMES[control_type]} coordinatorEpoch: {coordinator_epoch}"
    return f" controlType: {CONTROL_TYPE_NAMES.get(control_type, 'UNKNOWN')}({control_type})"


def format_batch_dump(
    header: BatchHeader,
    batch: Buffer,
    *,
    position: int,
    print_records: bool = True,
    print_payload: bool = True,
) -> list[str]:
    """Lines kafka-dump-log.sh prints for one batch (Kafka's DumpLogSegments.dumpLog/printBatchLevel).

    `position` is the batch's byte position in its segment file. `print_records` adds a line per record
    (--deep-iteration); `print_payload` then also prints keys and values (--print-data-log).
    """
    timestamp_name = "LogAppendTime" if header.timestamp_type == LOG_APPEND_TIME else "CreateTime"
    horizon = header.delete_horizon_ms
    codec = COMPRESSION_NAMES[header.compression] if header.compression < len(COMPRESSION_NAMES) else "?"
    is_valid = crc_is_valid(batch, header)
    lines = [
        f"baseOffset: {header.base_offset} lastOffset: {header.last_offset} count: {header.record_count} "
        f"baseSequence: {header.base_sequence} lastSequence: {header.last_sequence} "
        f"producerId: {header.producer_id} producerEpoch: {header.producer_epoch} "
        f"partitionLeaderEpoch: {header.partition_leader_epoch} "
        f"isTransactional: {str(header.is_transactional).lower()} "
        f"isControl: {str(header.is_control).lower()} "
        f"deleteHorizonMs: {'OptionalLong.empty' if horizon is None else f'OptionalLong[{horizon}]'} "
        f"position: {position} {timestamp_name}: {header.max_timestamp} size: {header.size} "
        f"magic: {header.magic} compresscodec: {codec} crc: {header.crc} isvalid: {str(is_valid).lower()}"
    ]
    if not print_records:
        return lines
    try:
        records = decode_records(batch)
    except (CorruptBatchError, InvalidRecordError, CodecUnavailableError) as exc:
        return [*lines, f"| cannot decode records: {exc}"]
    for record in records:
        sequence = (
            increment_sequence(header.base_sequence, record.offset - header.base_offset)
            if header.base_sequence >= 0
            else NO_SEQUENCE
        )
        header_keys = ",".join(_text(key.encode("utf-8", "surrogateescape")) for key, _ in record.headers)
        line = (
            f"| offset: {record.offset} {timestamp_name}: {record.timestamp} "
            f"keySize: {-1 if record.key is None else len(record.key)} "
            f"valueSize: {-1 if record.value is None else len(record.value)} "
            f"sequence: {sequence} headerKeys: [{header_keys}]"
        )
        if header.is_control:
            line += _control_description(record)
        elif print_payload:
            if record.key is not None:
                line += f" key: {_text(record.key)}"
            if record.value is not None:
                line += f" payload: {_text(record.value)}"
        lines.append(line)
    return lines
