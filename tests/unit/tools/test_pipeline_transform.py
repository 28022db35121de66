"""`--transform module:function`: where the module is looked up, and what a wrong name says."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkafka.errors import SparkafkaOptionError
from sparkafka.tools.pipeline import load_transform


@pytest.fixture
def user_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A working directory that is not on sys.path, as for the installed console script."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if entry not in ("", ".", str(tmp_path))])
    (tmp_path / "local_jobs_for_test.py").write_text(
        "def enrich(frame):\n    return frame\n\nNOT_A_FUNCTION = 1\n"
    )
    yield tmp_path
    sys.modules.pop("local_jobs_for_test", None)


def test_the_module_is_found_in_the_working_directory(user_directory: Path) -> None:
    function = load_transform("local_jobs_for_test:enrich")
    assert function("frame") == "frame"
    assert sys.path[0] == str(user_directory)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("local_jobs_for_test", "is not module:function"),
        (":enrich", "is not module:function"),
        ("local_jobs_for_test:", "is not module:function"),
        ("no_such_module_for_test:enrich", "cannot import module 'no_such_module_for_test'"),
        ("local_jobs_for_test:missing", "has no function 'missing'"),
        ("local_jobs_for_test:NOT_A_FUNCTION", "has no function 'NOT_A_FUNCTION'"),
    ],
)
def test_a_wrong_name_says_what_is_wrong(user_directory: Path, spec: str, message: str) -> None:
    with pytest.raises(SparkafkaOptionError, match=message):
        load_transform(spec)
