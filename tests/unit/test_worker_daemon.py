"""The worker daemon's path rule: drop only the zips that duplicate installed packages."""

from __future__ import annotations

import zipfile
from pathlib import Path

from sparkafka.worker_daemon import without_bundled_archives


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
