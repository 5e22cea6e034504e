"""The child process of tests/cluster/test_standalone.py: the platform's batch runs with their
Spark driver on a standalone cluster, then the lake compared with the reference fold.

    python -m tests.cluster.batch_on_cluster SPARK_URL DATA_DIR

A child, because a process has one Spark driver and the suite's own is local. Prints
`REPORT {json}`: the batches run, the application's master and the executors it ran on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sis_platform.inprocess import InProcessPlatform
from sis_platform.simulator.generator import generate_feed
from tests.reference import assert_lake_matches_reference, reference_for

MESSAGES = 120
BATCH = "60"


def main(url: str, data: Path) -> None:
    h = InProcessPlatform(
        data,
        overrides={
            "SIS_SPARK_MASTER": url,
            # The executors connect back to the driver: on loopback, as the cluster listens.
            "SIS_SPARK_CONF": "spark.driver.host=127.0.0.1 spark.driver.bindAddress=127.0.0.1 "
            "spark.executor.memory=1g spark.executor.cores=1",
            "SIS_BATCH_MAX_MESSAGES": BATCH,
        },
    )
    with h.resources["queue"].open().producer() as producer:
        for m in generate_feed(seed=5, messages=MESSAGES, duplicates=0.02):
            producer.put(m.body, message_id=m.message_id)
    h.drain()
    h.run_requested()
    spark = h.resources["spark"].spark_session
    assert_lake_matches_reference(h.lake(spark), reference_for(h.logged_messages()))
    context = spark.sparkContext
    # Every block manager: the driver's and one per executor.
    managers = context._jsc.sc().getExecutorMemoryStatus().size()
    report = {
        "batches": h.requested,
        "master": context.master,
        "application": context.applicationId,
        "executors": managers - 1,
    }
    print("REPORT " + json.dumps(report), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
