"""The local Spark driver's configuration: the JVM class-data archive
(lake/driver/jvm_archive.py)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from sis_platform.cli import spark_archive
from sis_platform.lake.driver import jvm_archive
from sis_platform.lake.driver.conf import SHORT_LIVED_SQL, delta_spark_config
from sis_platform.resources.config import ConfigurationError, resources
from tests.harness import SUITE_SPARK_SQL


def _java_options(env: dict[str, str]) -> str:
    return resources(env)["spark"].spark_config["spark.driver.extraJavaOptions"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_local_driver_uses_the_built_archive_when_there_is_one(tmp_path, cache):
    env = {"SIS_DATA_DIR": str(tmp_path / "data")}
    assert "SharedArchiveFile" not in _java_options(env)  # none built yet
    built = jvm_archive.archive_path()
    assert built.is_relative_to(cache / "sis-platform" / "jvm")
    built.parent.mkdir(parents=True)
    built.write_bytes(b"archive")
    assert f"-XX:SharedArchiveFile={built}" in _java_options(env)
    assert "-XX:TieredStopAtLevel=1" in _java_options(env)
    assert "SharedArchiveFile" not in _java_options({**env, "SIS_SPARK_CLASS_ARCHIVE": "off"})


def test_an_explicit_archive_must_exist(tmp_path, cache):
    env = {"SIS_DATA_DIR": str(tmp_path / "data")}
    chosen = tmp_path / "mine.jsa"
    with pytest.raises(ConfigurationError, match="SIS_SPARK_CLASS_ARCHIVE=.*is not a file"):
        _java_options({**env, "SIS_SPARK_CLASS_ARCHIVE": str(chosen)})
    chosen.write_bytes(b"archive")
    options = _java_options({**env, "SIS_SPARK_CLASS_ARCHIVE": str(chosen)})
    assert f"-XX:SharedArchiveFile={chosen}" in options


def test_the_archive_name_changes_with_the_virtualenv(cache, monkeypatch):
    first = jvm_archive.archive_path()
    monkeypatch.setattr("sys.prefix", "/elsewhere/.venv")
    assert jvm_archive.archive_path() != first
    assert jvm_archive.archive_path().parent == first.parent


def test_the_archive_name_changes_when_the_jars_are_reinstalled_at_the_same_path(
    cache, tmp_path, monkeypatch
):
    # The JVM refuses an archive whose class path jars have another size or modification time
    # ("Unable to use shared archive"): a fresh virtualenv at the same path needs a new one.
    jars = tmp_path / "spark" / "jars"
    jars.mkdir(parents=True)
    (jars / "spark-core.jar").write_bytes(b"jar")
    monkeypatch.setenv("SPARK_HOME", str(jars.parent))
    first = jvm_archive.archive_path()
    assert jvm_archive.archive_path() == first  # nothing changed, same archive
    os.utime(jars / "spark-core.jar", (1, 1))  # the same jar, installed again
    reinstalled = jvm_archive.archive_path()
    assert reinstalled != first
    assert jvm_archive.superseded(reinstalled, first)  # same installation place, older jars
    (jars / "delta.jar").write_bytes(b"jar")
    assert jvm_archive.archive_path() not in (first, reinstalled)
    monkeypatch.setattr("sys.prefix", "/elsewhere/.venv")
    assert not jvm_archive.superseded(reinstalled, jvm_archive.archive_path())


def test_a_build_removes_the_archives_its_reinstalled_jars_superseded(
    cache, tmp_path, monkeypatch, capsys
):
    jars = tmp_path / "spark" / "jars"
    jars.mkdir(parents=True)
    (jars / "spark-core.jar").write_bytes(b"jar")
    monkeypatch.setenv("SPARK_HOME", str(jars.parent))
    stale = jvm_archive.archive_path()
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"archive")  # used a minute ago, but for the jars as they were
    unstamped = stale.with_name(f"{stale.name.rsplit('-', 1)[0]}.jsa")
    unstamped.write_bytes(b"archive")  # named after its place alone, as archives once were
    other_place = stale.with_name("spark-driver-0123456789abcdef-0123456789abcdef.jsa")
    other_place.write_bytes(b"archive")  # another virtualenv's
    os.utime(jars / "spark-core.jar", (1, 1))
    built = []
    monkeypatch.setattr(
        spark_archive, "build", lambda path: built.append(path) or path.write_bytes(b"new")
    )
    assert spark_archive.main(["--if-missing"]) == 0
    current = jvm_archive.archive_path()
    assert built == [current]
    assert sorted(p.name for p in current.parent.iterdir()) == sorted(
        [current.name, other_place.name]
    )
    printed = capsys.readouterr().out
    assert f"removed {stale}: built for jars or a JDK since reinstalled" in printed
    assert f"removed {unstamped}: built for jars or a JDK since reinstalled" in printed


RUN_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseParallelGC -XX:ReservedCodeCacheSize=240m"


def test_a_runs_jvms_get_a_runs_java_options_on_a_cluster_too():
    remote = delta_spark_config(master="sc://spark:15002", class_archive="/a.jsa")
    assert not [key for key in remote if key.endswith("JavaOptions")]
    local = delta_spark_config(master="local[2]", class_archive=None)
    assert local["spark.driver.extraJavaOptions"] == RUN_JVM
    assert "spark.executor.extraJavaOptions" not in local  # the driver is the executor
    # On a cluster the run's process is still the driver (client mode); its executors live as
    # long. The class-data archive is a local driver's.
    cluster = delta_spark_config(master="spark://10.0.0.5:7077", class_archive="/a.jsa")
    assert cluster["spark.driver.extraJavaOptions"] == RUN_JVM
    assert cluster["spark.executor.extraJavaOptions"] == RUN_JVM
    # A long-lived driver's executors live as long as it does: they keep the full JIT.
    server = delta_spark_config(master="spark://10.0.0.5:7077", long_lived=True)
    assert (
        server["spark.driver.extraJavaOptions"]
        == server["spark.executor.extraJavaOptions"]
        == "-XX:+UseParallelGC -XX:ReservedCodeCacheSize=240m"
    )


def test_a_long_lived_driver_keeps_the_full_jit():
    # A run's driver stops at C1 (it lives for one run); a driver that serves run after run
    # repays C2's compile time.
    local = delta_spark_config(master="local[2]", class_archive=None, long_lived=True)
    assert (
        local["spark.driver.extraJavaOptions"]
        == "-XX:+UseParallelGC -XX:ReservedCodeCacheSize=240m"
    )
    remote = delta_spark_config(master="sc://spark:15002", long_lived=True)
    assert "spark.driver.extraJavaOptions" not in remote


def test_a_runs_driver_compiles_expressions_but_not_whole_stages():
    # Whole-stage code generation costs a run's driver more than it saves on batch-sized data;
    # expressions stay compiled (the scans that grow with the lake go through them); a
    # long-lived driver and a Spark Connect client keep Spark's defaults, and an operator's
    # SIS_SPARK_CONF has the last word.
    local = delta_spark_config(master="local[2]", class_archive=None)
    cluster = delta_spark_config(master="spark://10.0.0.5:7077")
    assert (
        {k: local[k] for k in SHORT_LIVED_SQL}
        == {k: cluster[k] for k in SHORT_LIVED_SQL}
        == SHORT_LIVED_SQL
        == {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "FALLBACK"}
    )
    long_lived = delta_spark_config(master="local[2]", class_archive=None, long_lived=True)
    long_lived_on_a_cluster = delta_spark_config(master="spark://10.0.0.5:7077", long_lived=True)
    remote = delta_spark_config(master="sc://spark:15002")
    for conf in (long_lived, long_lived_on_a_cluster, remote):
        assert not set(SHORT_LIVED_SQL) & set(conf)
    overridden = delta_spark_config(
        master="local[2]", class_archive=None, extra={"spark.sql.codegen.wholeStage": "true"}
    )
    assert overridden["spark.sql.codegen.wholeStage"] == "true"


@pytest.mark.spark
def test_the_test_session_runs_without_whole_stage_code_generation(spark):
    # The suite's session is a run's driver, except that it interprets expressions
    # (SUITE_SPARK_SQL), which the suite's tiny tables run faster than compiled ones.
    expected = {**SHORT_LIVED_SQL, **SUITE_SPARK_SQL}
    assert expected["spark.sql.codegen.wholeStage"] == "false"
    for key, value in expected.items():
        assert spark.conf.get(key) == value


@pytest.mark.spark
def test_the_test_sessions_driver_collects_with_the_throughput_collector(spark):
    # Asked of the running driver: its collectors are ParallelGC's, not G1's.
    beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory
    names = {bean.getName() for bean in beans.getGarbageCollectorMXBeans()}
    assert names == {"PS Scavenge", "PS MarkSweep"}


def test_a_c1_only_local_driver_keeps_a_code_cache_the_size_of_a_tiered_jvms():
    # Alone, TieredStopAtLevel=1 shrinks the code cache to 48 MB, which Spark and Delta fill
    # within a run: the JIT is then disabled, and the driver can die ("Out of space in
    # CodeCache for adapters"). Asked of the JVM itself, with the options the driver gets.
    options = delta_spark_config(master="local[2]")["spark.driver.extraJavaOptions"].split()
    flags = subprocess.run(
        ["java", *options, "-XX:+PrintFlagsFinal", "-version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # Each line of the table: type, name, "=", value, origin.
    final = {
        parts[1]: parts[3]
        for parts in map(str.split, flags.splitlines())
        if len(parts) >= 4 and parts[2] == "="
    }
    assert int(final["ReservedCodeCacheSize"]) == 240 * 1024 * 1024
    assert (final["UseParallelGC"], final["UseG1GC"]) == ("true", "false")


def test_if_missing_builds_nothing_when_the_archive_exists(cache, monkeypatch):
    built = jvm_archive.archive_path()
    built.parent.mkdir(parents=True)
    built.write_bytes(b"archive")
    monkeypatch.setattr(spark_archive, "build", lambda path=None: pytest.fail("rebuilt"))
    assert spark_archive.main(["--if-missing"]) == 0


def test_old_archives_and_dead_builds_are_pruned_and_a_used_one_is_kept(cache, capsys):
    current = jvm_archive.archive_path()
    current.parent.mkdir(parents=True)
    now = time.time()
    days = 86400

    def made(name: str, age: float) -> Path:
        path = current.parent / name
        path.write_bytes(b"archive")
        os.utime(path, (now - age, now - age))
        return path

    made(current.name, 30 * days)
    unused = made("spark-driver-0000000000000000.jsa", 15 * days)
    recent = made("spark-driver-1111111111111111.jsa", 13 * days)
    dead_build = made(".spark-driver-2222222222222222.jsa.41.partial", 7 * 3600)
    building = made(".spark-driver-3333333333333333.jsa.42.partial", 60)
    # A driver choosing the current archive marks it used, however old its build.
    assert jvm_archive.configured_archive(None) == str(current)
    assert now - current.stat().st_mtime < 60

    assert spark_archive.main(["--if-missing"]) == 0
    assert sorted(p.name for p in current.parent.iterdir()) == sorted(
        [current.name, recent.name, building.name]
    )
    printed = capsys.readouterr().out
    assert f"removed {unused}: no Spark driver has used it for 14 days" in printed
    assert f"removed {dead_build}: a build that did not finish" in printed


def test_further_spark_settings_override_the_platforms(tmp_path):
    env = {
        "SIS_DATA_DIR": str(tmp_path / "data"),
        "SIS_SPARK_CONF": "spark.eventLog.enabled=true  spark.sql.shuffle.partitions=8",
    }
    conf = resources(env)["spark"].spark_config
    assert conf["spark.eventLog.enabled"] == "true"
    assert conf["spark.sql.shuffle.partitions"] == "8"
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"


@pytest.mark.parametrize("bad", ["spark.ui.enabled", "ui.enabled=true", "spark.x="])
def test_a_malformed_spark_setting_is_a_configuration_error(tmp_path, bad):
    env = {"SIS_DATA_DIR": str(tmp_path / "data"), "SIS_SPARK_CONF": f"spark.a=1 {bad}"}
    with pytest.raises(ConfigurationError, match=f"SIS_SPARK_CONF: '{bad}' is not"):
        resources(env)


def test_a_local_driver_heap_is_1536m_unless_the_operator_sizes_it(tmp_path):
    # 1.5 GiB holds a step of a full default batch inside the 4 GiB budget (BENCHMARKS.md).
    env = {"SIS_DATA_DIR": str(tmp_path / "data")}
    assert resources(env)["spark"].spark_config["spark.driver.memory"] == "1536m"
    env["SIS_SPARK_DRIVER_MEMORY"] = "3g"
    assert resources(env)["spark"].spark_config["spark.driver.memory"] == "3g"


def test_a_spark_connect_client_sets_only_its_sessions_sql_settings():
    # Delta's extension, memory and jars belong to the server; a client setting them fails
    # (static settings of a running driver).
    remote = delta_spark_config(
        master="sc://spark:15002", shuffle_partitions=2, extra={"spark.sql.ansi.enabled": "false"}
    )
    assert remote == {
        "spark.remote": "sc://spark:15002",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.databricks.delta.snapshotPartitions": "2",
        "spark.sql.files.openCostInBytes": "1048576",
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
        "spark.sql.ansi.enabled": "false",
    }


def test_every_run_of_a_deployment_joins_one_spark_connect_session_named_after_its_lake():
    from sis_platform.resources import config

    def url(env):
        return config.resources(env)["spark"].spark_config["spark.remote"]

    a = url({"SIS_SPARK_MASTER": "sc://spark:15002", "SIS_LAKE_PATH": "/lake/a"})
    assert a.startswith("sc://spark:15002/;session_id=")
    assert a == url({"SIS_SPARK_MASTER": "sc://spark:15002/", "SIS_LAKE_PATH": "/lake/a"})
    assert a != url({"SIS_SPARK_MASTER": "sc://spark:15002", "SIS_LAKE_PATH": "/lake/b"})
    with_params = url(
        {"SIS_SPARK_MASTER": "sc://spark:15002/;use_ssl=true", "SIS_LAKE_PATH": "/lake/a"}
    )
    assert with_params == a.replace("/;", "/;use_ssl=true;")
    chosen = "sc://spark:15002/;session_id=6b1c0c3e-0000-4000-8000-000000000001"
    assert url({"SIS_SPARK_MASTER": chosen}) == chosen


def test_the_spark_connect_server_runs_a_local_delta_driver_on_the_platforms_settings(tmp_path):
    from sis_platform.cli.spark_connect import SERVER_CLASS, server_command

    command = server_command(
        "127.0.0.1",
        15099,
        {"SIS_SPARK_DRIVER_MEMORY": "3g", "SIS_SPARK_CONF": "spark.x.y=z"},
        scratch=tmp_path,
    )
    assert command[0].endswith("/bin/spark-submit") and command[-1] == "spark-internal"
    assert command[command.index("--class") + 1] == SERVER_CLASS
    conf = dict(
        arg.split("=", 1)
        for flag, arg in zip(command, command[1:], strict=False)
        if flag == "--conf"
    )
    assert conf["spark.master"] == "local[*]"
    assert conf["spark.driver.memory"] == "3g"
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert conf["spark.connect.grpc.binding.port"] == "15099"
    assert conf["spark.x.y"] == "z"
    assert "spark.remote" not in conf
    assert conf["spark.local.dir"] == str(tmp_path)
    # The server is a long-lived driver: the full JIT, not a run's C1 only.
    assert "TieredStopAtLevel" not in conf["spark.driver.extraJavaOptions"]
