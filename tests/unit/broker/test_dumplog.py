"""The log dump tool's refusals: a data directory or topic that is not there, and a segment that a
running broker's cleaner removes between the listing and the read."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkafka.broker.dumplog import dump_topic


def test_a_missing_data_directory_or_topic_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list(dump_topic(tmp_path / "absent", "out"))
    with pytest.raises(FileNotFoundError, match="no log for topic 'out' partition 3"):
        list(dump_topic(tmp_path, "out", 3))


def test_a_segment_removed_while_it_is_dumped_fails_naming_the_cause(tmp_path: Path) -> None:
    segment = tmp_path / "out-0" / "00000000000000000000.log"
    segment.parent.mkdir()
    segment.write_bytes(b"")
    lines = dump_topic(tmp_path, "out", 0)
    assert next(lines) == f"Dumping {segment}"
    segment.unlink()  # as the cleaner swaps a segment for its cleaned copy
    with pytest.raises(FileNotFoundError, match="was removed while the log was being dumped"):
        next(lines)
