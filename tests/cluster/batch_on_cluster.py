"""The child process of tests/cluster/test_standalone.py: the platform's batch runs with their
Spark driver on a standalone cluster and their Delta tables on S3 (s3a://), then the lake
compared with the reference fold.

    python -m tests.cluster.batch_on_cluster

Its settings are the SIS_* variables of its environment (the master's URL, the lake's path,
the S3A connector's jars and settings), its object store's keys in SIS_SPARK_SECRET_CONF as
a deployment gives them. A child, because a process has one Spark driver and the suite's own
is local. Prints `REPORT {json}`: the batches run, the application's master and the executors
it ran on, and the Delta log store the lake's tables used. It then keeps the application (its
driver and executors) running until a line or the end of its standard input, so the test can
read their command lines while they certainly exist.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from sis_platform.lake.tables import MASTER_DOCUMENTS
from sis_platform.simulator.generator import generate_feed
from sis_platform.testing.inprocess import InProcessPlatform
from tests.delta_log import log_store_class
from tests.reference import assert_lake_matches_reference, reference_for

MESSAGES = 120
BATCH = "60"


def main() -> None:
    settings = {k: v for k, v in os.environ.items() if k.startswith("SIS_")}
    settings.pop("SIS_SPARK_SECRET_CONF", None)  # read from the environment by the resource
    h = InProcessPlatform(
        Path(settings.pop("SIS_DATA_DIR")),
        overrides={**settings, "SIS_BATCH_MAX_MESSAGES": BATCH},
    )
    with h.resources["queue"].open().producer() as producer:
        for m in generate_feed(seed=5, messages=MESSAGES, duplicates=0.02):
            producer.put(m.body, message_id=m.message_id)
    h.drain()
    h.run_requested()
    spark = h.resources["spark"].spark_session
    lake = h.lake(spark)
    assert_lake_matches_reference(lake, reference_for(h.logged_messages()))
    context = spark.sparkContext
    # The log store Delta chose for the lake's scheme (S3SingleDriverLogStore for s3a).
    log_store = log_store_class(spark, lake.path(MASTER_DOCUMENTS))
    # Every block manager: the driver's and one per executor.
    managers = context._jsc.sc().getExecutorMemoryStatus().size()
    report = {
        "batches": h.requested,
        "master": context.master,
        "application": context.applicationId,
        "executors": managers - 1,
        "lake": lake.base_path,
        "log_store": log_store,
    }
    print("REPORT " + json.dumps(report), flush=True)
    sys.stdin.readline()
    spark.stop()


if __name__ == "__main__":
    main()
