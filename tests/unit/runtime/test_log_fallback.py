"""sparkafka's stand-in for Python's last-resort handler (sparkafka.runtime.log_fallback), in fresh processes:
logging's state is per process, and pytest configures its own."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING sparkafka\.librdkafka: FAIL boom$")


def _stderr_of(setup: str) -> list[str]:
    code = (
        "import logging\n"
        f"{setup}\n"
        "import sparkafka\n"
        "log = logging.getLogger('sparkafka.librdkafka')\n"
        "log.info('quiet')\n"
        "log.warning('FAIL boom')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stderr.splitlines()


def test_an_unconfigured_process_gets_the_warning_as_a_log_line() -> None:
    (line,) = _stderr_of("")
    assert _LINE.match(line), line


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        # Configured logging gets the record once, in its own format.
        ("logging.basicConfig(format='%(levelname)s|%(message)s')", ["WARNING|FAIL boom"]),
        # Any handler on the way counts, whatever its level, as for Python's last resort.
        ("logging.getLogger().addHandler(logging.NullHandler())", []),
        ("logging.getLogger('sparkafka').addHandler(logging.NullHandler())", []),
        ("logging.lastResort = None", []),
    ],
)
def test_configured_logging_gets_every_record_exactly_as_before(setup: str, expected: list[str]) -> None:
    assert _stderr_of(setup) == expected


def test_a_logger_that_does_not_propagate_keeps_its_records() -> None:
    setup = "logging.getLogger('sparkafka.librdkafka').propagate = False"
    # Not propagated: neither the fallback nor the root sees it, and Python's last resort prints it bare.
    assert _stderr_of(setup) == ["FAIL boom"]
