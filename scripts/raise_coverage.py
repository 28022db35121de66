"""Which of the connector's error paths a test triggers: every ``raise`` of an exception in
src/sparkafka/connector, and whether a test run executed it.

    .venv/bin/python scripts/raise_coverage.py                # the connector's tests
    .venv/bin/python scripts/raise_coverage.py -- tests/unit  # other pytest arguments
    .venv/bin/python scripts/raise_coverage.py --list         # also list the raises no test reached

The tests run under coverage.py, with every Python process they start measured too: pytest's
workers, `sparkafka run` pipelines, and Spark's own Python processes (the driver-side data source
workers and the executors' workers, which Spark forks and ends with os._exit, SIGHUP or
SIGTERM: see SAVE_ON_SIGNAL). A raise counts as
triggered when its line ran. A bare ``raise`` (re-raising what was caught) is not an error path of
its own and is not counted.

Needs coverage.py (``pip install coverage``). Prints the count and the share; exits 1 when the share
is below ``--target`` percent.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
CONNECTOR = REPOSITORY / "src" / "sparkafka" / "connector"
DEFAULT_TESTS = ["tests/unit/connector", "tests/integration/connector", "tests/integration/tools"]
PYTEST_OPTIONS = ["-n", "2", "--dist", "loadfile", "-q", "-p", "no:cacheprovider"]


@dataclass(frozen=True)
class RaiseSite:
    path: Path
    line: int
    text: str  # the raise statement's first line, for the listing


def raise_sites(root: Path) -> list[RaiseSite]:
    """Every ``raise <exception>`` under ``root``, by file and line."""
    sites = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source, str(path))):
            if isinstance(node, ast.Raise) and node.exc is not None:
                sites.append(RaiseSite(path, node.lineno, lines[node.lineno - 1].strip()))
    return sorted(sites, key=lambda s: (str(s.path), s.line))


# Imported at start-up by every Python process of the run (its directory goes first on PYTHONPATH,
# which Spark passes on to its Python processes). Spark ends the workers it keeps for reuse with
# SIGHUP or SIGTERM, whose default action kills a process before coverage.py saves what it measured
# (the driver-side commit of a streaming write runs in such a worker): with this, a process about to
# die of either signal saves first, then dies of it as it would have.
SAVE_ON_SIGNAL = """\
import os
import signal

if os.environ.get("COVERAGE_PROCESS_CONFIG") or os.environ.get("COVERAGE_PROCESS_START"):
    _install = signal.signal

    def _save_then_die(signum, frame):
        try:
            import coverage

            current = coverage.Coverage.current()
            if current is not None:
                current.stop()
                current.save()
        finally:
            _install(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _signal(signum, handler):
        if signum in (signal.SIGHUP, signal.SIGTERM) and handler == signal.SIG_DFL:
            handler = _save_then_die
        return _install(signum, handler)

    signal.signal = _signal
    for _signum in (signal.SIGHUP, signal.SIGTERM):
        if signal.getsignal(_signum) == signal.SIG_DFL:
            _install(_signum, _save_then_die)
"""


def executed_lines(pytest_args: list[str], work: Path) -> dict[str, set[int]]:
    """Run pytest under coverage, every Python subprocess measured; the lines run, per file."""
    from coverage import CoverageData

    rcfile = work / "coveragerc"
    rcfile.write_text(
        "[run]\n"
        f"source = {CONNECTOR}\n"
        "parallel = true\n"
        f"data_file = {work / '.coverage'}\n"
        # Spark forks its Python workers from a daemon and ends them with os._exit.
        "patch = subprocess, fork, _exit, execv\n"
    )
    command = [sys.executable, "-m", "coverage", "run", f"--rcfile={rcfile}", "-m", "pytest", *pytest_args]
    print("running:", " ".join(command), flush=True)
    hooks = work / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SAVE_ON_SIGNAL)
    inherited = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hooks), *([inherited] if inherited else [])])}
    tests = subprocess.run(command, cwd=REPOSITORY, check=False, env=env)
    if tests.returncode != 0:
        print("some tests failed: a raise only a failed test would have reached is counted as missed")
    combine = [sys.executable, "-m", "coverage", "combine", f"--rcfile={rcfile}", "--quiet"]
    subprocess.run(combine, cwd=REPOSITORY, check=True)
    data = CoverageData(basename=str(work / ".coverage"))
    data.read()
    return {str(Path(name).resolve()): set(data.lines(name) or ()) for name in data.measured_files()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="list the raises no test reached")
    parser.add_argument("--target", type=float, default=90.0, help="percent to reach [90]")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest arguments")
    args = parser.parse_args()
    pytest_args = args.pytest_args or [*DEFAULT_TESTS, *PYTEST_OPTIONS]
    sites = raise_sites(CONNECTOR)
    with tempfile.TemporaryDirectory(prefix="raise-coverage-") as scratch:
        ran = executed_lines(pytest_args, Path(scratch))
    missed = [site for site in sites if site.line not in ran.get(str(site.path.resolve()), set())]
    triggered = len(sites) - len(missed)
    share = 100.0 * triggered / len(sites) if sites else 100.0
    print(f"connector raises triggered by a test: {triggered} of {len(sites)} ({share:.0f} %)")
    if args.list:
        for site in missed:
            print(f"  not triggered: {site.path.relative_to(REPOSITORY)}:{site.line}: {site.text}")
    return 0 if share >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
