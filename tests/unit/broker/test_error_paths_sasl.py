"""Error paths of sparkafka.broker.sasl's users file: text that is not UTF-8 is refused naming the line
(never quoting it: lines hold passwords)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparkafka.broker.sasl import SaslUser, SaslUsersError, read_users_file


def users_file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def test_a_users_file_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = users_file(tmp_path / "users", b"# users\nalice:s\xe9cret\nbob:pw\n")
    with pytest.raises(SaslUsersError, match=f"^{re.escape(str(path))}, line 2: not UTF-8 text$") as raised:
        read_users_file(path)
    assert "cret" not in str(raised.value)


def test_a_utf8_users_file_is_read(tmp_path: Path) -> None:
    path = users_file(tmp_path / "users", "alice:sécret\n".encode())
    assert read_users_file(path) == [(SaslUser("alice", "sécret"), f"{path}, line 1")]
