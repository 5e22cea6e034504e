"""The platform's batch runs on a Spark standalone cluster (a master and two workers started from
the pyspark distribution; docs/deployment.md, "Spark"): the runs' driver submits to
`spark://`, the fold executes on the workers' executors, and the lake equals the reference fold.
Every listener of the cluster is on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.cluster.standalone import StandaloneCluster, standalone_cluster

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.cost(450)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with standalone_cluster(tmp_path_factory.mktemp("cluster")) as running:
        yield running


@pytest.fixture(scope="module")
def report(cluster: StandaloneCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data = tmp_path_factory.mktemp("on-cluster") / "data"
    done = subprocess.run(
        [sys.executable, "-m", "tests.cluster.batch_on_cluster", cluster.url, str(data)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    line = next(x for x in done.stdout.splitlines() if x.startswith("REPORT "))
    return json.loads(line.removeprefix("REPORT "))


def test_batches_run_on_the_cluster_and_the_lake_equals_the_reference(cluster, report):
    # The child compared the lake with the reference fold before reporting.
    assert report["batches"] == ["0000000001", "0000000002"]
    assert report["master"] == cluster.url
    assert report["executors"] == 2  # one per worker
    finished = {app["id"]: app for app in cluster.status()["completedapps"]}
    assert finished[report["application"]]["cores"] == 2


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
