"""The virtualenv the Quix Streams runner (`quix.py`) runs in: its own, because quixstreams pins its
own confluent-kafka range, which need not match the project's.

Stdlib only: the driver imports this module from the project venv, and the venv it builds must not
see the project's packages. Idempotent: a marker file records the requirement the venv was built
for, so a second call returns at once and a changed requirement (or Python) rebuilds it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

# Pinned so that runs on different days compare the same Quix Streams.
REQUIREMENTS = ["quixstreams==3.28.1"]
VENV_NAME = "quix"
MARKER_NAME = ".sparkafka-bench-ready"


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def ensure_environment(venvs_dir: Path) -> Path:
    """Create (once) ``venvs_dir/quix`` with Quix Streams installed; return that venv's python."""
    venv = venvs_dir / VENV_NAME
    marker = venv / MARKER_NAME
    python = venv_python(venv)
    # The interpreter's version is part of the marker: wheels built for another Python would not load.
    wanted = "\n".join([*REQUIREMENTS, f"python {sys.version_info.major}.{sys.version_info.minor}"])
    if marker.exists() and python.exists() and marker.read_text() == wanted:
        return python
    if venv.exists():
        shutil.rmtree(venv)
    venvs_dir.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "venv", str(venv)], "create the Quix Streams virtualenv")
    _run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *REQUIREMENTS],
        f"install {' '.join(REQUIREMENTS)}",
    )
    marker.write_text(wanted)
    return python


def _run(command: list[str], purpose: str) -> None:
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(
            f"could not {purpose} (exit {completed.returncode}): {' '.join(command)}\n"
            f"{completed.stderr[-3000:]}\n"
            "Check that PyPI is reachable, or delete the virtualenv directory and run "
            "`python -m benchmarks --setup-only` again."
        )


if __name__ == "__main__":
    print(ensure_environment(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".bench-venvs")))
