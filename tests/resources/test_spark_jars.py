"""Delta's jars resolved once into the cache and passed to every driver (lake/driver/jars.py).

The resolution itself (one Spark driver with `spark.jars.packages`) runs in scripts/setup.sh
before the suite, and the suite's Spark session takes its jars from the folder it made
(tests/conftest.py), so every Spark test depends on it; these tests cover the folder's rules.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sis_platform.cli import spark_jars as spark_jars_cli
from sis_platform.lake.driver.jars import (
    COMPLETE,
    hadoop_version,
    jar_paths,
    jars_dir,
    keep,
    packages,
    resolved_jars_dir,
    s3a_package,
)
from sis_platform.resources.config import spark_config
from sis_platform.settings.records import SparkSettings


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _jars(folder: Path, *names: str) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / name for name in names]
    for path in paths:
        path.write_bytes(b"PK jar " + path.name.encode())
    return paths


def test_a_drivers_spark_jars_value_names_local_files() -> None:
    value = "file:///root/.ivy2/jars/a%20b.jar, /opt/jars/c.jar,,"
    assert jar_paths(value) == [Path("/root/.ivy2/jars/a b.jar"), Path("/opt/jars/c.jar")]
    with pytest.raises(ValueError, match="not a local file"):
        jar_paths("https://repo1.maven.org/x.jar")


def test_kept_jars_keep_the_resolvers_order_and_are_used_once_complete(
    cache: Path, tmp_path: Path
) -> None:
    assert resolved_jars_dir() is None
    jars = _jars(tmp_path / "ivy", "z-delta-spark.jar", "a-storage.jar")
    folder = keep(jars, jars_dir())
    assert resolved_jars_dir() == str(folder)
    assert sorted(p.name for p in folder.glob("*.jar")) == [
        "000-z-delta-spark.jar",
        "001-a-storage.jar",
    ]
    assert (folder / "000-z-delta-spark.jar").read_bytes() == jars[0].read_bytes()
    conf = spark_config(SparkSettings(), "local[2]")
    assert conf["spark.jars"].split(",") == [
        str(folder / "000-z-delta-spark.jar"),
        str(folder / "001-a-storage.jar"),
    ]
    assert "spark.jars.packages" not in conf


def test_an_operators_jars_folder_wins_over_the_resolved_one(cache: Path, tmp_path: Path) -> None:
    keep(_jars(tmp_path / "ivy", "delta.jar"), jars_dir())
    own = tmp_path / "own"
    _jars(own, "mine.jar")
    conf = spark_config(SparkSettings(jars_dir=str(own)), "local[2]")
    assert conf["spark.jars"] == str(own / "mine.jar")


def test_without_resolved_jars_drivers_resolve_the_package_themselves(cache: Path) -> None:
    jars_dir().mkdir(parents=True)  # a folder left without its marker is not used
    assert resolved_jars_dir() is None
    conf = spark_config(SparkSettings(), "local[2]")
    assert conf["spark.jars.packages"].startswith("io.delta:delta-spark_")
    assert "spark.jars" not in conf


def test_an_interrupted_copy_leaves_the_previous_folder_and_nothing_half_made(
    cache: Path, tmp_path: Path
) -> None:
    folder = keep(_jars(tmp_path / "ivy", "old.jar"), jars_dir())
    with pytest.raises(FileNotFoundError):
        keep([*_jars(tmp_path / "new", "new.jar"), tmp_path / "new" / "missing.jar"], folder)
    assert resolved_jars_dir() == str(folder)
    assert [p.name for p in folder.glob("*.jar")] == ["000-old.jar"]
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]
    assert (folder / COMPLETE).read_text() == "000-old.jar\n"


def test_the_s3a_connector_matches_the_hadoop_inside_pyspark() -> None:
    import pyspark

    version = hadoop_version()
    jars = Path(pyspark.__file__).parent / "jars"
    assert (jars / f"hadoop-client-api-{version}.jar").is_file()
    assert s3a_package() == f"org.apache.hadoop:hadoop-aws:{version}"


def test_with_spark_home_set_the_connector_matches_the_hadoop_of_that_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A local driver runs from $SPARK_HOME when it is set, so its Hadoop is the one to match.
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))
    folder = re.escape(str(tmp_path / "jars"))
    with pytest.raises(RuntimeError, match=f"no hadoop-client-api jar .*{folder}"):
        hadoop_version()
    _jars(tmp_path / "jars", "hadoop-client-api-3.9.1.jar", "hadoop-client-runtime-3.9.1.jar")
    assert s3a_package() == "org.apache.hadoop:hadoop-aws:3.9.1"


def test_extra_packages_get_a_folder_of_their_own_beside_deltas(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert spark_jars_cli.main(["--s3a", "--print-path"]) == 0
    folder = Path(capsys.readouterr().out.strip())
    assert folder == jars_dir(packages([s3a_package()]))
    assert folder != jars_dir()
    assert folder.parent == jars_dir().parent
    assert "hadoop-aws" in folder.name and "delta-spark" in folder.name
    assert spark_jars_cli.main(["--package", "org.example:extra:1.0", "--print-path"]) == 0
    assert capsys.readouterr().out.strip().endswith("org.example_extra_1.0")
