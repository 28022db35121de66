"""A produced batch checked as Kafka checks it before appending: ``UnifiedLog.analyzeAndValidateRecords``
and ``LogValidator`` (offsets, size, CRC, codec, counts, control and sequence rules, keys of a compacted
topic, timestamps against the topic's settings), after ``ProduceRequest.validateRecords``
(:func:`~sparkafka.broker.records.check_produce_request_records`).
"""

from __future__ import annotations

from dataclasses import dataclass

import crc32c

from sparkafka.broker.errors import BrokerError, ErrorCode
from sparkafka.broker.record_scan import RecordScan, as_long, scan_records
from sparkafka.broker.records import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_NAMES,
    CRC_OFFSET,
    HEADER_SIZE,
    INT64,
    LOG_APPEND_TIME,
    NO_TIMESTAMP,
    UINT32,
    BatchHeader,
    Buffer,
    CodecUnavailableError,
    DecompressionError,
    InvalidRecordError,
    RecordValidationError,
    check_produce_request_records,
    decode_records,
    parse_header,
)
from sparkafka.broker.topic_configs import default_int


@dataclass(frozen=True)
class TimestampRules:
    """A topic's timestamp settings as LogValidator applies them to produced records."""

    log_append_time: bool = False  # message.timestamp.type=LogAppendTime
    before_max_ms: int = default_int("message.timestamp.before.max.ms")
    after_max_ms: int = default_int("message.timestamp.after.max.ms")


@dataclass(frozen=True)
class AcceptedBatch:
    header: BatchHeader
    # LogValidator's maxBatchTimestamp: the largest record timestamp, at least NO_TIMESTAMP. A CreateTime
    # topic stores it as the batch's maxTimestamp, whatever the producer wrote there.
    max_record_timestamp: int


def validate_produce_payload(
    buf: Buffer,
    *,
    max_batch_bytes: int,
    topic_partition: str = "<unknown>",
    produce_version: int | None = None,
    require_keys: bool = False,
    now_ms: int = 0,
    timestamps: TimestampRules | None = None,
) -> list[AcceptedBatch]:
    """Validate one partition's records from a Produce request (v3+) exactly as Kafka does.

    Steps, in Kafka's order (each raises BrokerError with Kafka's code and message):
      1. ProduceRequest.validateRecords: at least one complete batch (INVALID_RECORD), a readable
         length >= 14 and magic in 0..2 (CORRUPT_MESSAGE), magic == 2 (INVALID_RECORD), exactly one batch
         (INVALID_RECORD). Kafka silently trims a trailing partial batch; we refuse it (CORRUPT_MESSAGE)
         rather than drop bytes a client sent.
      2. UnifiedLog.analyzeAndValidateRecords: baseOffset == 0 (INVALID_RECORD), size <= max_batch_bytes
         (MESSAGE_TOO_LARGE), CRC32C matches (CORRUPT_MESSAGE), known codec (UNKNOWN_SERVER_ERROR).
      3. LogValidator.validateBatch: lastOffsetDelta+1 >= 1, recordsCount >= 1 and they agree, not a
         control batch, a producer id implies a sequence (all INVALID_RECORD).
      4. Every record decodes and recordsCount matches the records present, after decompression
         (INVALID_RECORD; a blob that does not decompress is UNKNOWN_SERVER_ERROR as in Kafka).
      5. LogValidator.validateRecord, for every record: with `require_keys` (compacted topics) it needs a
         key (INVALID_RECORD); otherwise, with `timestamps`, on a CreateTime topic a timestamp other
         than NO_TIMESTAMP must lie within [now - before.max.ms, now + after.max.ms], and a batch the
         producer marked LogAppendTime is refused on a LogAppendTime topic, and on a CreateTime topic
         when its maxTimestamp is NO_TIMESTAMP (INVALID_TIMESTAMP). All records are checked; any error
         rejects the batch, reporting each record's (RecordValidationError), INVALID_TIMESTAMP if any
         of them is one.
    Returns the accepted batches (always exactly one), with their largest record timestamp.
    """
    view = memoryview(buf)
    tp = topic_partition
    invalid = ErrorCode.INVALID_RECORD
    size = check_produce_request_records(view, produce_version)
    if len(view) > size:
        raise BrokerError(
            ErrorCode.CORRUPT_MESSAGE,
            f"The records for {tp} carry {len(view) - size} bytes after the record batch that do not form a "
            "complete batch; the client must send whole batches only",
        )

    (base_offset,) = INT64.unpack_from(view, 0)
    if base_offset != 0:
        raise BrokerError(
            invalid,
            f"The baseOffset of the record batch in the append to {tp} should be 0, but it is {base_offset}",
        )
    if size > max_batch_bytes:
        raise BrokerError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"The record batch size in the append to {tp} is {size} bytes which exceeds the "
            f"maximum configured value of {max_batch_bytes}.",
        )
    (stored_crc,) = UINT32.unpack_from(view, CRC_OFFSET)
    if size < HEADER_SIZE or crc32c.crc32c(view[ATTRIBUTES_OFFSET:size]) != stored_crc:
        raise BrokerError(
            ErrorCode.CORRUPT_MESSAGE,
            f"Record is corrupt (stored crc = {stored_crc}) in topic partition {tp}.",
        )
    header = parse_header(view)
    if header.compression >= len(COMPRESSION_NAMES):
        raise BrokerError(
            ErrorCode.UNKNOWN_SERVER_ERROR, f"Unknown compression type id: {header.compression}"
        )

    offset_range = f"[{header.base_offset}, {header.last_offset}]"
    count_from_offsets = header.last_offset_delta + 1
    if count_from_offsets <= 0:
        raise BrokerError(
            invalid, f"Batch has an invalid offset range: {offset_range} in topic partition {tp}"
        )
    if header.record_count <= 0:
        raise BrokerError(
            invalid, f"Invalid reported count for record batch: {header.record_count} in topic partition {tp}"
        )
    if count_from_offsets != header.record_count:
        raise BrokerError(
            invalid,
            f"Inconsistent batch offset range {offset_range} and count of records {header.record_count} "
            f"in topic partition {tp}",
        )
    if header.is_control:
        raise BrokerError(
            invalid, f"Clients are not allowed to write control records in topic partition {tp}"
        )
    if header.has_producer_id and header.base_sequence < 0:
        raise BrokerError(
            invalid,
            f"Invalid sequence number {header.base_sequence} in record batch with producerId "
            f"{header.producer_id} in topic partition {tp}",
        )

    whole = buf if len(buf) == size else view[:size]
    try:
        scan = scan_records(whole, header)
    except InvalidRecordError as exc:
        raise BrokerError(invalid, str(exc)) from exc
    except (DecompressionError, CodecUnavailableError) as exc:
        raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, str(exc)) from exc

    if (require_keys and scan.keyless) or (
        timestamps is not None and _timestamps_may_fail(header, scan, now_ms, timestamps)
    ):
        _check_each_record(whole, header, tp, require_keys, now_ms, timestamps)
    return [AcceptedBatch(header, max(NO_TIMESTAMP, scan.max_timestamp))]


# Timestamps this far from zero may make Kafka's long arithmetic wrap: checked record by record.
_SAFE_TIMESTAMP = 2**61


def _timestamps_may_fail(header: BatchHeader, scan: RecordScan, now_ms: int, rules: TimestampRules) -> bool:
    """Whether some record of the batch may fail LogValidator.validateTimestamp, from the extremes of the
    record timestamps; False means none does."""
    marked_log_append_time = header.timestamp_type == LOG_APPEND_TIME
    if rules.log_append_time:
        return marked_log_append_time
    if marked_log_append_time and scan.max_timestamp == NO_TIMESTAMP:
        return True
    if max(abs(scan.min_timestamp), abs(scan.max_timestamp)) >= _SAFE_TIMESTAMP:
        return True
    return (
        now_ms - scan.min_timestamp > rules.before_max_ms or scan.max_timestamp - now_ms > rules.after_max_ms
    )


def _check_each_record(
    batch: Buffer, header: BatchHeader, tp: str, require_keys: bool, now_ms: int, rules: TimestampRules | None
) -> None:
    """LogValidator.validateRecord for every record and processRecordErrors: raise RecordValidationError
    with each failing record's index and Kafka's message, or return when none fails."""
    errors: list[tuple[int, str]] = []
    timestamp_error = False
    marked_log_append_time = header.timestamp_type == LOG_APPEND_TIME
    for index, record in enumerate(decode_records(batch)):
        if require_keys and record.key is None:
            errors.append(
                (index, f"Compacted topic cannot accept message without key in topic partition {tp}")
            )
            continue
        if rules is None:
            continue
        timestamp = as_long(record.timestamp)
        if not rules.log_append_time and timestamp != NO_TIMESTAMP:
            difference = as_long(now_ms - timestamp)
            if difference > rules.before_max_ms or as_long(-difference) > rules.after_max_ms:
                timestamp_error = True
                errors.append(
                    (
                        index,
                        f"Timestamp {timestamp} of message with offset {record.offset} is out of range. The "
                        f"timestamp should be within [{as_long(now_ms - rules.before_max_ms)}, "
                        f"{as_long(now_ms + rules.after_max_ms)}]",
                    )
                )
        elif marked_log_append_time:
            timestamp_error = True
            described = (
                f"DefaultRecord(offset={record.offset}, timestamp={timestamp}, "
                f"key={len(record.key or b'')} bytes, value={len(record.value or b'')} bytes)"
            )
            errors.append(
                (
                    index,
                    f"Invalid timestamp type in message {described}. Producer should not set timestamp type "
                    "to LogAppendTime.",
                )
            )
    if not errors:
        return
    if timestamp_error:
        raise RecordValidationError(
            ErrorCode.INVALID_TIMESTAMP,
            "One or more records have been rejected due to invalid timestamp",
            errors,
        )
    shown = ", ".join(f"RecordError(batchIndex={index}, message='{text}')" for index, text in errors[:3])
    raise RecordValidationError(
        ErrorCode.INVALID_RECORD,
        f"One or more records have been rejected due to {len(errors)} record errors in total, and "
        f"only showing the first three errors at most: [{shown}]",
        errors,
    )
