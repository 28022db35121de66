"""sparkafka as a user installs it: the wheel built from this checkout, installed with its
dependencies into a fresh virtualenv, runs the demo and a Spark query of its own. An editable
checkout hides a file the wheel leaves out (a module, a resource, an entry point such as
``sparkafka-python`` or ``pyspark_sparkafka``); this does not."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

QUERY = """
from pyspark.sql import SparkSession
import sparkafka
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
print("found by Spark's lookup:", sparkafka.format_known(spark, "sparkafka"))
print("rows:", spark.range(3).count())
spark.stop()
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel of this checkout and its dependencies; its bin directory."""
    directory = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "-w",
            str(directory / "dist"),
            str(ROOT),
        ],
        check=True,
        timeout=600,
    )
    (wheel,) = (directory / "dist").glob("sparkafka-*.whl")
    environment = directory / "venv"
    venv.create(environment, with_pip=True)
    bin_dir = environment / "bin"
    subprocess.run(
        [
            str(bin_dir / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            str(wheel),
        ],
        check=True,
        timeout=1200,
    )
    return bin_dir


def _clean_environment(bin_dir: Path) -> dict[str, str]:
    """This process's environment without what points at the checkout or its virtualenv."""
    left_out = ("PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON", "SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")
    kept = {k: v for k, v in os.environ.items() if k not in left_out}
    kept["PATH"] = f"{bin_dir}{os.pathsep}{kept.get('PATH', '')}"
    return kept


def test_the_installed_wheel_runs_the_demo(installed: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [str(installed / "sparkafka"), "demo"],
        cwd=tmp_path,
        env=_clean_environment(installed),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (installed / "sparkafka-python").exists(), "the launcher entry point is installed"


def test_the_installed_wheel_runs_a_spark_query_of_its_own(installed: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [str(installed / "python"), "-c", QUERY],
        cwd=tmp_path,
        env=_clean_environment(installed),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "found by Spark's lookup: True" in result.stdout, "pyspark_sparkafka lets Spark find the format"
    assert "rows: 3" in result.stdout
    where = subprocess.run(
        [str(installed / "python"), "-c", "import sparkafka; print(sparkafka.__file__)"],
        cwd=tmp_path,
        env=_clean_environment(installed),
        capture_output=True,
        text=True,
        check=True,
    )
    assert str(ROOT / "src") not in where.stdout, "the wheel's sparkafka, not the checkout's"
