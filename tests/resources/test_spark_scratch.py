"""A local driver's scratch folder (lake/driver/scratch.py): where it is, what the driver's
configuration says of it, and which folders the sweep removes. That a real driver writes there
and that a killed driver's folder is swept: tests/resources/test_local_driver.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from sis_platform.lake.driver.scratch import (
    driver_scratch,
    sweep,
    with_scratch,
)
from sis_platform.resources.config import resources


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_platforms_driver_keeps_its_scratch_in_the_data_folder_unless_moved(tmp_path):
    env = {"SIS_DATA_DIR": str(tmp_path / "data")}
    assert resources(env)["spark"].scratch_dir == str(tmp_path / "data" / "spark-scratch")
    moved = {**env, "SIS_SPARK_SCRATCH_DIR": "/scratch/sis"}
    assert resources(moved)["spark"].scratch_dir == "/scratch/sis"


def test_a_local_driver_is_given_the_folder_as_local_dir_and_java_tmpdir(tmp_path):
    conf = {"spark.master": "local[2]", "spark.driver.extraJavaOptions": "-XX:Foo"}
    scratch = with_scratch(conf, tmp_path)
    assert scratch["spark.local.dir"] == str(tmp_path)
    assert scratch["spark.driver.extraJavaOptions"] == f"-XX:Foo -Djava.io.tmpdir={tmp_path}"
    assert conf == {"spark.master": "local[2]", "spark.driver.extraJavaOptions": "-XX:Foo"}
    blank = tmp_path / "a folder"
    assert with_scratch({"spark.master": "local"}, blank)["spark.driver.extraJavaOptions"] == (
        f'"-Djava.io.tmpdir={blank}"'
    )


def test_the_operators_own_scratch_settings_win(tmp_path):
    conf = {
        "spark.master": "local[*]",
        "spark.local.dir": "/fast/disk",
        "spark.driver.extraJavaOptions": "-Djava.io.tmpdir=/fast/tmp",
    }
    assert with_scratch(conf, tmp_path) == conf


def test_a_cluster_or_spark_connect_configuration_is_left_alone(tmp_path):
    for master in ("spark://host:7077", "sc://localhost:15002"):
        conf = {"spark.master": master}
        assert with_scratch(conf, tmp_path) == conf
    assert with_scratch({"spark.remote": "sc://x"}, tmp_path) == {"spark.remote": "sc://x"}


def test_the_folder_is_this_process_and_private(tmp_path):
    folder = driver_scratch(tmp_path / "scratch")
    assert folder == tmp_path / "scratch" / f"{socket.gethostname()}-{os.getpid()}"
    assert folder.stat().st_mode & 0o777 == 0o700
    assert folder.parent.stat().st_mode & 0o777 == 0o700
    assert driver_scratch(tmp_path / "scratch") == folder  # a second driver of this process


def test_the_sweep_removes_only_this_hosts_folders_of_processes_that_are_gone(tmp_path):
    host = socket.gethostname()
    dead = tmp_path / f"{host}-{_dead_pid()}"
    (dead / "blockmgr-1" / "0c").mkdir(parents=True)
    (dead / "blockmgr-1" / "0c" / "shuffle_0_0_0.data").write_bytes(b"feed")
    alive = tmp_path / f"{host}-{os.getpid()}"
    other_host = tmp_path / f"elsewhere-{_dead_pid()}"
    unrelated = tmp_path / "notes"
    a_file = tmp_path / f"{host}-{_dead_pid()}.log"
    for folder in (alive, other_host, unrelated):
        folder.mkdir()
    a_file.write_text("x")
    linked = tmp_path / f"{host}-{_dead_pid()}"
    linked.symlink_to(unrelated)

    assert sweep(tmp_path) == [dead]
    assert not dead.exists()
    assert alive.is_dir() and other_host.is_dir() and unrelated.is_dir() and a_file.is_file()
    assert linked.is_symlink()


def test_sweeping_a_missing_root_removes_nothing(tmp_path):
    assert sweep(tmp_path / "missing") == []


def test_a_new_driver_sweeps_before_it_makes_its_own(tmp_path):
    dead = tmp_path / f"{socket.gethostname()}-{_dead_pid()}"
    dead.mkdir()
    driver_scratch(tmp_path)
    assert not dead.exists()
