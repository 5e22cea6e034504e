"""The platform's batch runs as a production deployment runs them (docs/deployment.md): their
Spark driver submits to a standalone cluster (a master and two workers started from the pyspark
distribution), the fold executes on the workers' executors, and the Delta tables live on
S3-compatible storage (moto's S3 server, tests/cluster/s3.py) under `s3a://`, through the S3A
connector that `sis-spark-jars --s3a` resolves. The lake equals the reference fold; every
listener is on loopback; the object store's secret key, given as SIS_SPARK_SECRET_CONF, is in
no process's command line and no file the cluster or the runs wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.cluster.s3 import S3Server, s3_server
from tests.cluster.standalone import DRIVER_CONF, StandaloneCluster, standalone_cluster

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.cost(270)]

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "sis-lake"
EXECUTOR = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with standalone_cluster(tmp_path_factory.mktemp("cluster")) as running:
        yield running


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with s3_server(tmp_path_factory.mktemp("s3")) as running:
        running.create_bucket(BUCKET)
        yield running


@pytest.fixture(scope="module")
def s3a_jars() -> Path:
    """Delta's jars and the S3A connector's, resolved once into the user's cache (the first
    time from Maven Central: hadoop-aws and the AWS SDK bundle, about 700 MB)."""
    command = [str(Path(sys.executable).parent / "sis-spark-jars"), "--s3a"]
    subprocess.run([*command, "--if-missing"], check=True, timeout=1200)
    printed = subprocess.run(
        [*command, "--print-path"], check=True, capture_output=True, text=True
    ).stdout
    return Path(printed.strip())


@dataclass(frozen=True)
class Outcome:
    report: dict[str, Any]
    data: Path  # the child's SIS_DATA_DIR
    output: str  # what the child printed
    command_lines: list[str]  # of the cluster's and the child's processes, its application running


def _command_lines(root_pids: list[int]) -> list[str]:
    """The command line of each root process and of every descendant that is still there (one
    that ends or is a zombie while it is read is left out, not the whole tree)."""
    processes: list[psutil.Process] = []
    for pid in root_pids:
        try:
            root = psutil.Process(pid)
            processes += [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
    lines = []
    for process in processes:
        try:
            lines.append(" ".join(process.cmdline()))
        except psutil.Error:
            continue
    return lines


@pytest.fixture(scope="module")
def outcome(
    cluster: StandaloneCluster,
    s3: S3Server,
    s3a_jars: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Outcome:
    data = tmp_path_factory.mktemp("on-cluster") / "data"
    conf = {
        **DRIVER_CONF,
        **{f"spark.hadoop.{key}": value for key, value in s3.hadoop_settings().items()},
    }
    secrets = " ".join(f"{key}={value}" for key, value in s3.secret_settings().items())
    env = {
        **os.environ,
        "SIS_DATA_DIR": str(data),
        "SIS_SPARK_MASTER": cluster.url,
        "SIS_LAKE_PATH": f"s3a://{BUCKET}/lake",
        "SIS_SPARK_JARS_DIR": str(s3a_jars),
        "SIS_SPARK_CONF": " ".join(f"{key}={value}" for key, value in conf.items()),
        "SIS_SPARK_SECRET_CONF": secrets,
    }
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.cluster.batch_on_cluster"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # The child reports once its batches ran on both executors, then keeps its application
    # running until told to stop, so the command lines are read while its driver JVM and the
    # executors the workers launched for it certainly exist.
    command_lines: list[str] = []
    roots = [child.pid, *(p.pid for p in cluster.processes)]
    output: list[str] = []
    assert child.stdin is not None and child.stdout is not None
    try:
        for line in child.stdout:
            output.append(line)
            if line.startswith("REPORT "):
                command_lines = _command_lines(roots)
                child.stdin.close()
    finally:
        child.stdin.close()  # the child stops whatever happened here
    code = child.wait(timeout=1200)
    text = "".join(output)
    assert code == 0, text[-8000:]
    line = next(x for x in text.splitlines() if x.startswith("REPORT "))
    return Outcome(json.loads(line.removeprefix("REPORT ")), data, text, command_lines)


def test_batches_run_on_the_cluster_and_the_lake_on_s3_equals_the_reference(
    cluster: StandaloneCluster, s3: S3Server, outcome: Outcome
):
    # The child compared the lake with the reference fold before reporting.
    report = outcome.report
    assert report["batches"] == ["0000000001", "0000000002"]
    assert report["master"] == cluster.url
    assert report["executors"] == 2  # one per worker
    finished = {app["id"]: app for app in cluster.status()["completedapps"]}
    assert finished[report["application"]]["cores"] == 2
    # The driver and the executors started as a run's JVMs do: C1 only, the throughput
    # collector.
    jvms = [
        line.split()
        for line in outcome.command_lines
        if EXECUTOR in line or "org.apache.spark.deploy.SparkSubmit" in line
    ]
    assert len(jvms) == 3
    for words in jvms:
        assert {"-XX:TieredStopAtLevel=1", "-XX:+UseParallelGC"} <= set(words)
    # The tables are in the bucket, none on the local disk; Delta's single-driver S3 log store.
    assert report["lake"] == f"s3a://{BUCKET}/lake"
    assert report["log_store"] == "io.delta.storage.S3SingleDriverLogStore"
    logs = s3.keys(BUCKET, "lake/master_documents/_delta_log/")
    assert "lake/master_documents/_delta_log/00000000000000000000.json" in logs
    assert not (outcome.data / "lake").exists()


def test_the_object_stores_secret_key_is_in_no_command_line_log_or_file(
    cluster: StandaloneCluster, s3: S3Server, outcome: Outcome
):
    # The child, its driver JVM, the master, the workers and their two executors.
    assert len([line for line in outcome.command_lines if EXECUTOR in line]) == 2
    assert not [line for line in outcome.command_lines if s3.secret_key in line]
    assert s3.secret_key not in outcome.output
    secret = s3.secret_key.encode()
    for folder in (cluster.folder, outcome.data):
        for path in folder.rglob("*"):
            if path.is_file() and path.suffix != ".jar":
                assert secret not in path.read_bytes(), f"the secret key is in {path}"


def test_every_listener_of_the_cluster_is_on_loopback(cluster):
    listeners = [
        conn.laddr
        for process in cluster.processes
        for jvm in [psutil.Process(process.pid), *psutil.Process(process.pid).children(True)]
        for conn in jvm.net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN
    ]
    assert len(listeners) >= 6  # each process's RPC port and web UI
    assert {address.ip for address in listeners} <= {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
