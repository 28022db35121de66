"""The path rule of sparkafka.runtime.python_exec (drop only the zips that duplicate installed packages) and
the `sparkafka-python` launcher that applies it to the processes Spark starts."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import pyspark

from sparkafka.runtime.python_exec import launcher_path, without_bundled_archives


def _package(root: Path, name: str) -> None:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "__init__.py").write_text("")


def _zip(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("placeholder.py", "")
    return str(path)


def _site(tmp_path: Path, *, py4j_installed: bool = True) -> tuple[Path, str, str]:
    site = tmp_path / "site-packages"
    _package(site, "pyspark")
    if py4j_installed:
        _package(site, "py4j")
    lib = site / "pyspark" / "python" / "lib"
    return site, _zip(lib / "pyspark.zip"), _zip(lib / "py4j-0.10.9.9-src.zip")


def test_zips_bundled_in_the_installed_pyspark_are_dropped(tmp_path: Path) -> None:
    site, pyspark_zip, py4j_zip = _site(tmp_path)
    path = [pyspark_zip, py4j_zip, "/some/project", str(site)]
    assert without_bundled_archives(path) == ["/some/project", str(site)]


def test_the_installed_pysparks_own_jars_are_dropped_other_jars_stay(tmp_path: Path) -> None:
    site, pyspark_zip, _ = _site(tmp_path)
    spark_core = _zip(site / "pyspark" / "jars" / "spark-core_2.13-4.3.0.jar")
    user_jar = _zip(tmp_path / "project" / "udfs.jar")
    path = [pyspark_zip, spark_core, user_jar, str(site)]
    assert without_bundled_archives(path) == [user_jar, str(site)]


def test_the_installed_pysparks_jars_hold_no_python() -> None:
    # What the jar rule relies on: Python in a bundled jar would be dropped with it.
    for jar in sorted((Path(pyspark.__file__).resolve().parent / "jars").glob("spark-*.jar")):
        with zipfile.ZipFile(jar) as archive:
            python = [name for name in archive.namelist() if name.endswith((".py", ".pyc"))]
        assert not python, f"{jar.name} holds Python files: {python[:5]}"


def test_a_zip_whose_package_is_not_installed_stays(tmp_path: Path) -> None:
    site, pyspark_zip, py4j_zip = _site(tmp_path, py4j_installed=False)
    assert without_bundled_archives([pyspark_zip, py4j_zip, str(site)]) == [py4j_zip, str(site)]


def test_another_spark_homes_zip_stays(tmp_path: Path) -> None:
    site, _, _ = _site(tmp_path)
    cluster_zip = _zip(tmp_path / "opt" / "spark" / "python" / "lib" / "pyspark.zip")
    assert without_bundled_archives([cluster_zip, str(site)]) == [cluster_zip, str(site)]


def test_without_an_installed_pyspark_nothing_moves(tmp_path: Path) -> None:
    lib = tmp_path / "spark" / "python" / "lib"
    path = [_zip(lib / "pyspark.zip"), _zip(lib / "py4j-0.10.9.9-src.zip"), str(tmp_path)]
    assert without_bundled_archives(path) == path


def test_other_zips_in_the_bundled_directory_stay(tmp_path: Path) -> None:
    site, pyspark_zip, _ = _site(tmp_path)
    user_zip = _zip(site / "pyspark" / "python" / "lib" / "deps.zip")
    assert without_bundled_archives([pyspark_zip, user_zip, str(site)]) == [user_zip, str(site)]


PROBE = """
import json, os, sys
import pyspark
zips = [path for path, found in sys.path_importer_cache.items() if type(found).__name__ == "zipimporter"]
print(json.dumps({"pyspark": pyspark.__file__, "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
                  "zip_importers": zips}))
sys.exit(3)
"""


def _run_launcher(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    launcher = launcher_path()
    assert launcher is not None, "sparkafka-python is not installed beside this interpreter"
    installed = Path(pyspark.__file__).resolve().parent
    bundled = [str(zip_) for zip_ in sorted((installed / "python" / "lib").glob("*.zip"))]
    bundled += [str(jar) for jar in sorted((installed / "jars").glob("spark-core_*.jar"))]  # as Spark does
    (tmp_path / "probe_module.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*bundled, str(tmp_path)])}
    return subprocess.run(
        [launcher, *args], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path
    )


def test_the_launcher_runs_a_module_like_python_m_with_the_installed_pyspark(tmp_path: Path) -> None:
    done = _run_launcher(["-m", "probe_module", "first", "--second"], tmp_path)
    assert done.returncode == 3, done.stderr  # the module's exit status
    report = json.loads(done.stdout)
    installed = Path(pyspark.__file__).resolve().parent
    assert Path(report["pyspark"]).resolve().parent == installed  # not from pyspark.zip
    assert report["argv"] == [str(tmp_path / "probe_module.py"), "first", "--second"]
    assert report["path0"] == report["cwd"] == str(tmp_path)
    assert "RuntimeWarning" not in done.stderr
    # No importer left for a dropped zip: importlib.invalidate_caches() would re-read its directory.
    assert not [entry for entry in report["zip_importers"] if Path(entry).is_relative_to(installed)]


def test_the_launcher_hands_other_command_lines_to_python_unchanged(tmp_path: Path) -> None:
    done = _run_launcher(["-c", PROBE, "x"], tmp_path)
    assert done.returncode == 3, done.stderr
    report = json.loads(done.stdout)
    assert report["argv"] == ["-c", "x"]
    if (Path(pyspark.__file__).resolve().parent / "python" / "lib" / "pyspark.zip").exists():
        assert "pyspark.zip" in report["pyspark"]  # the path is left as Spark set it
