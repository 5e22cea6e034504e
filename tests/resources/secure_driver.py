"""What tests/resources/test_secure_driver.py runs in a child process (`python -m
tests.resources.secure_driver DATA_DIR`): the code location loaded as Dagster loads it, then the
platform on DATA_DIR with a local Spark driver of its own (its web UI on) and a Dagster instance
on disk under DATA_DIR/dagster, one message through sis-live and one batch run. It prints one
JSON line (`REPORT {...}`) of what it saw of the driver's JVM while the session ran.

A child process: the suite's shared Spark session (tests/conftest.py) would otherwise be reused,
started with another environment and command line than the ones under test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import dagster as dg
import psutil

from tests.domain.sportsdata_fixtures import ASCOT_1430, event, master
from tests.harness import Harness

# A setting that is no secret, so it may reach the configuration: the test finds it where it
# looks for the secret, which proves that it looks in the right places.
VISIBLE_MARKER = "sis-visible-marker-5e1f"


def main(data_dir: Path) -> None:
    from pyspark.sql import SparkSession

    from sis_platform.definitions import defs

    # Loaded as Dagster loads the code location (its code servers and run workers), from this
    # process's environment (SIS_DATA_DIR): from here on, what the process writes is private.
    defs()
    (data_dir / "dagster").mkdir(parents=True)
    instance = dg.DagsterInstance.local_temp(tempdir=str(data_dir / "dagster"))
    h = Harness(
        data_dir,
        {
            "SIS_INTAKE": "live",
            "SIS_SPARK_MASTER": "local[1]",
            "SIS_SPARK_UI": "true",
            "SIS_SPARK_CONF": f"spark.sis.marker={VISIBLE_MARKER}",
        },
        instance=instance,
    )
    with h.resources["queue"].open().producer() as producer:
        producer.put(master(event(ASCOT_1430)))
    assert h.drain() == 1, h.requested
    h.run_requested()
    # The run's session (the process's one session; no settings given, so none changed).
    spark = SparkSession.builder.getOrCreate()
    (jvm,) = [p for p in psutil.Process().children(recursive=True) if p.name() == "java"]
    report = {
        "secret_conf": spark.conf.get("fs.s3a.secret.key", None),
        "marker_conf": spark.conf.get("spark.sis.marker", None),
        "jvm_cmdline": Path(f"/proc/{jvm.pid}/cmdline").read_bytes().decode("utf-8", "replace"),
        # Every TCP socket the JVM listens on (the kernel's table, by the process's inodes).
        "listening": [
            [c.laddr.ip, c.laddr.port]
            for c in jvm.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN
        ],
        "ui_url": spark.sparkContext.uiWebUrl,
        "jvm_pid": jvm.pid,
    }
    print("REPORT", json.dumps(report), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
