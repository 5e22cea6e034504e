"""A Spark standalone cluster on this machine, from the pyspark distribution's own launcher: a
master and workers started with `bin/spark-class` (the classes `sbin/start-master.sh` and
`start-worker.sh` run), every port on loopback, logs and work folders under the test's folder.

`standalone_cluster` yields once every worker is registered ALIVE with the master (read from the
master's JSON status page) and stops the processes on the way out, killing what SIGTERM left.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark

from sis_platform.lake.driver.conf import delta_spark_config
from tests.ports import free_port

SPARK_HOME = Path(pyspark.__file__).parent
START_SECONDS = 180
# The Spark settings of a driver that submits to this cluster: the executors connect back to
# it on loopback, as the cluster listens; one executor per worker, with its whole share.
DRIVER_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.executor.memory": "1g",
    "spark.executor.cores": "1",
}


@dataclass(frozen=True)
class StandaloneCluster:
    url: str  # spark://127.0.0.1:PORT
    status_url: str  # the master's JSON status page
    processes: tuple[subprocess.Popen[bytes], ...]
    folder: Path  # its logs and the workers' work folders

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.status_url, timeout=5) as answer:
            return json.load(answer)


@contextmanager
def standalone_cluster(
    folder: Path, workers: int = 2, worker_memory: str = "1500m"
) -> Iterator[StandaloneCluster]:
    folder.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        # Every listener, the web UIs included, on loopback.
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(folder / "logs"),
        # No REST submission server: it takes a fixed port (6066) and accepts applications
        # without authentication.
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        # The master and workers live for one test module and schedule a handful of tasks:
        # the JIT and collector of a run's driver (sis_platform/lake/driver/conf.py).
        "SPARK_DAEMON_JAVA_OPTS": delta_spark_config(master="local[1]")[
            "spark.driver.extraJavaOptions"
        ],
    }
    launcher = str(SPARK_HOME / "bin" / "spark-class")
    port, ui_port = free_port(), free_port()
    commands = [
        [
            launcher,
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1",
            "--port", str(port),
            "--webui-port", str(ui_port),
        ]
    ] + [
        [
            launcher,
            "org.apache.spark.deploy.worker.Worker",
            f"spark://127.0.0.1:{port}",
            "--host", "127.0.0.1",
            "--cores", "1",
            "--memory", worker_memory,
            "--webui-port", str(free_port()),
            "--work-dir", str(folder / f"worker-{n}"),
        ]
        for n in range(workers)
    ]  # fmt: skip
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for n, command in enumerate(commands):
            with open(folder / f"process-{n}.log", "wb") as log:
                processes.append(
                    subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
                )
        cluster = StandaloneCluster(
            url=f"spark://127.0.0.1:{port}",
            status_url=f"http://127.0.0.1:{ui_port}/json/",
            processes=tuple(processes),
            folder=folder,
        )
        _await_workers(cluster, workers, folder)
        yield cluster
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _await_workers(cluster: StandaloneCluster, workers: int, folder: Path) -> None:
    # The master offers no event to wait on from outside: its status page is polled, bounded.
    deadline = time.monotonic() + START_SECONDS
    while True:
        for process in cluster.processes:
            if process.poll() is not None:
                raise AssertionError(f"a cluster process exited early: see {folder}/process-*.log")
        try:
            alive = [w for w in cluster.status().get("workers", []) if w.get("state") == "ALIVE"]
            if len(alive) == workers:
                return
        except (OSError, ValueError):
            # The master's web UI is not up yet, or only partly: while it starts, /json/ can
            # answer with the HTML status page.
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{workers} workers not ALIVE after {START_SECONDS}s: {folder}")
        time.sleep(0.5)
