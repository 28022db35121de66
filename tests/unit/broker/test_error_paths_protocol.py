"""Error paths of sparkafka.broker.protocol: request frames whose header is too short, whose client
id or tagged fields run past the frame, or whose body cannot be decoded (MalformedRequest, on which
the broker closes the connection)."""

from __future__ import annotations

import struct

import pytest
from kafka.protocol.metadata import MetadataRequest

from sparkafka.broker import protocol
from sparkafka.broker.protocol import MalformedRequest

API_VERSIONS = 18


def header(client_id: bytes | None, *, api_key: int = API_VERSIONS, api_version: int = 3) -> bytes:
    """The fixed start of a request header: api key, version, correlation id, client id."""
    if client_id is None:
        return struct.pack(">hhih", api_key, api_version, 1, -1)
    return struct.pack(">hhih", api_key, api_version, 1, len(client_id)) + client_id


def metadata_frame(version: int) -> bytes:
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="orders")])
    request.API_VERSION = version
    request.with_header(correlation_id=1, client_id="test")
    return bytes(request.encode(header=True, framed=False))


def test_a_frame_shorter_than_a_request_header_is_malformed() -> None:
    with pytest.raises(
        MalformedRequest, match=r"^request frame of 9 bytes is shorter than a request header$"
    ):
        protocol.peek_header(header(b"")[:9])


def test_a_client_id_length_below_minus_one_is_malformed() -> None:
    frame = struct.pack(">hhih", API_VERSIONS, 3, 1, -2)
    with pytest.raises(MalformedRequest, match=r"^request header has an invalid client id length -2$"):
        protocol.peek_header(frame)


def test_a_client_id_running_past_the_frame_is_malformed() -> None:
    frame = header(b"client")[:-1]
    with pytest.raises(MalformedRequest, match=r"^request header has an invalid client id length 6$"):
        protocol.peek_header(frame)


def test_a_null_client_id_is_read_as_none() -> None:
    # The boundary of the length check above: -1 is the one negative length Kafka allows.
    assert protocol.peek_header(header(None)).client_id is None


def test_a_flexible_header_without_its_tagged_fields_is_malformed() -> None:
    with pytest.raises(MalformedRequest, match=r"^request header ends before its tagged fields$"):
        protocol.check_header_tagged_fields(header(b"client"))


def test_a_tagged_field_count_varint_of_six_bytes_is_malformed() -> None:
    frame = header(b"client") + b"\x80" * 5 + b"\x01"
    with pytest.raises(MalformedRequest, match=r"^request header has a varint longer than 5 bytes$"):
        protocol.check_header_tagged_fields(frame)


def test_a_tagged_field_whose_size_runs_past_the_frame_is_malformed() -> None:
    # One tagged field: tag 0, 10 bytes announced, 2 present.
    frame = header(b"client") + b"\x01\x00\x0a" + b"ab"
    with pytest.raises(MalformedRequest, match=r"^request header has a tagged field past the frame's end$"):
        protocol.check_header_tagged_fields(frame)


def test_a_complete_tagged_field_section_is_accepted() -> None:
    protocol.check_header_tagged_fields(header(b"client") + b"\x01\x00\x02" + b"ab")


def test_a_request_body_ending_inside_a_string_length_cannot_be_decoded() -> None:
    frame = metadata_frame(1)
    assert protocol.decode_request(protocol.peek_header(frame), frame).topics[0].name == "orders"
    cut = frame[: -len("orders") - 1]  # the topic name's int16 length keeps one of its two bytes
    with pytest.raises(MalformedRequest, match=r"^cannot decode MetadataRequest v1: \w+"):
        protocol.decode_request(protocol.peek_header(cut), cut)
