"""Set up the separate virtualenv that the PyFlink runner (`benchmarks/systems/flink.py`) runs in.

PyFlink pins its own versions of apache-beam, pyarrow, pandas, numpy and friends, which must not leak
into the project's venv, so it gets a venv of its own: ``<venvs_dir>/flink``, created with ``python -m
venv`` from the interpreter running this module. Installed into it:

* ``apache-flink`` 2.0.0 (which pulls in ``apache-flink-libraries``, Flink's own jars and a JVM
  mini-cluster launcher; a JDK 11/17 must be on PATH or in JAVA_HOME at run time), and
* ``shigawire-apache-flink-libraries``, a wheel that ships ``flink-connector-kafka`` (4.0.1-2.0) and
  ``kafka-clients`` (3.9.1) jars built for Flink 2.0 (Flink's own Python wheel includes no connector).

The first call downloads about 500 MB (apache-flink-libraries alone is a 310 MB source archive) and
takes about 2 minutes here; the venv is about 0.9 GB.

A marker file in the venv records the requirement set that was installed; when it matches, the call
returns at once. Only the standard library is used here: the benchmark driver imports this module in
the project's venv.

    python benchmarks/systems/flink_env.py <venvs_dir>      # prints the venv's python
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

# apache-flink is pinned to the Flink release the shigawire wheel was built against: that wheel drops
# Flink 2.0.0's own core jars (flink-core, flink-runtime, ...) into pyflink/lib next to apache-flink's
# flink-dist, and PyFlink puts pyflink/lib/*.jar on the JVM classpath in directory order, so any other
# 2.0.x would mix classes of two Flink releases.
REQUIREMENTS: tuple[str, ...] = (
    "apache-flink==2.0.0",
    "shigawire-apache-flink-libraries==2.0.0.post1",
)
VENV_NAME = "flink"
MARKER = "sparkafka-bench-requirements.json"


class FlinkEnvironmentError(RuntimeError):
    """The Flink venv could not be created or its packages not installed."""


def _log(message: str) -> None:
    print(f"[flink-env] {message}", file=sys.stderr, flush=True)


def _venv_python(venv: pathlib.Path) -> pathlib.Path:
    if os.name == "nt":
        return venv / "Scripts" / "python.exe"
    return venv / "bin" / "python"


def _wanted_marker() -> dict[str, object]:
    # The base interpreter's version is part of the key: a venv made by another Python would have
    # wheels for the wrong ABI.
    return {
        "requirements": list(REQUIREMENTS),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }


def _marker_matches(venv: pathlib.Path) -> bool:
    marker = venv / MARKER
    if not marker.is_file() or not _venv_python(venv).exists():
        return False
    try:
        return json.loads(marker.read_text()) == _wanted_marker()
    except (OSError, ValueError):
        return False


def _run(cmd: list[str], what: str, fix: str) -> None:
    _log(f"{what}: {' '.join(cmd)}")
    try:
        subprocess.run(cmd, check=True, stdout=sys.stderr, stderr=sys.stderr)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise FlinkEnvironmentError(f"{what} failed ({exc}). {fix}") from exc


def ensure_environment(venvs_dir: pathlib.Path) -> pathlib.Path:
    """Create (once) ``venvs_dir/flink`` with PyFlink and the Kafka connector jars; return its python."""
    venv = pathlib.Path(venvs_dir).resolve() / VENV_NAME
    python = _venv_python(venv)
    if _marker_matches(venv):
        return python

    started = time.monotonic()
    if venv.exists():
        # Half-built or built for another requirement set: pip could leave stale packages behind,
        # and a fresh venv is cheap next to the download.
        _log(f"rebuilding {venv} (requirement set changed or an earlier install did not finish)")
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    _run(
        [sys.executable, "-m", "venv", str(venv)],
        f"creating virtualenv {venv}",
        f"Check that {sys.executable} has the venv module (Debian: apt-get install python3-venv) "
        f"and that {venv.parent} is writable.",
    )
    _run(
        [str(python), "-m", "pip", "install", *REQUIREMENTS],
        f"installing {', '.join(REQUIREMENTS)}",
        f"Check network access to PyPI, that wheels for Python "
        f"{sys.version_info.major}.{sys.version_info.minor} exist for these versions, then re-run "
        f"`{sys.executable} benchmarks/systems/flink_env.py {venvs_dir}` "
        f"(or delete {venv} to start over).",
    )
    (venv / MARKER).write_text(json.dumps(_wanted_marker(), indent=2) + "\n")
    _log(f"Flink venv ready in {time.monotonic() - started:.0f} s: {python}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        _log("warning: no `java` on PATH and no JAVA_HOME; PyFlink needs a JDK 11 or 17 to run")
    return python


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print(f"usage: {pathlib.Path(sys.argv[0]).name} VENVS_DIR", file=sys.stderr)
        return 2
    try:
        python = ensure_environment(pathlib.Path(args[0]))
    except FlinkEnvironmentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
