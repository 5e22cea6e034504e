"""What the Spark Connect tests run in a child process (`python -m tests.connect.scenarios NAME
URL DATA_DIR`): a Spark Connect session switches PySpark into Connect mode for the whole
process (SPARK_CONNECT_MODE_ENABLED), so it must not share one with the suite's local driver."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

from tests.harness import Harness


def pipeline(url: str, data_dir: Path) -> None:
    """Two batches through the per-batch job over Spark Connect fold exactly as the reference."""
    from sis_platform.lake.tables import EVENTS, MASTER_DOCUMENTS
    from tests.assets.test_process_batch import every_outcome
    from tests.domain.sportsdata_fixtures import ASCOT_1430, ASCOT_1500
    from tests.reference import assert_lake_matches_reference, reference_for

    h = Harness(data_dir, {"SIS_SPARK_MASTER": url})
    batches = every_outcome()
    keys = [h.zone.writer.land(b).key for b in batches]
    h.instance.add_dynamic_partitions("batches", keys)
    h.run_requested(keys)
    spark = h.resources["spark"].spark_session
    assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
    lake = h.lake(spark)
    assert_lake_matches_reference(lake, reference_for(h.logged_messages()))
    docs = {r["master_id"]: r for r in lake.read(MASTER_DOCUMENTS).collect()}
    assert docs[ASCOT_1430]["version"] == 3 and docs[ASCOT_1500]["stale"]
    events = {r["master_id"]: r["going"] for r in lake.read(EVENTS).collect()}
    assert events == {ASCOT_1430: "soft", ASCOT_1500: "soft"}, events


def _lake(url: str, data_dir: Path):  # type: ignore[no-untyped-def]
    from sis_platform.resources import config

    resources = config.resources({"SIS_DATA_DIR": str(data_dir), "SIS_SPARK_MASTER": url})
    return resources["lake"].lake(resources["spark"].spark_session)


def orphan_writer(url: str, data_dir: Path) -> None:
    """A fold writer whose append is still running on the server (its Python worker writes its
    pid to `started`, then sleeps): the test kills this process while it waits."""
    from sis_platform.lake.spark.fold import FOLD_WRITER
    from sis_platform.lake.tables import MODEL_STEPS

    lake = _lake(url, data_dir)
    lake.ensure(MODEL_STEPS)
    lake.claim_writer(FOLD_WRITER)
    started = str(data_dir / "started")

    def stall(batches):  # type: ignore[no-untyped-def]
        import os
        import time

        with open(started, "w") as f:  # a named pipe the test reads
            f.write(str(os.getpid()))
        time.sleep(600)  # ended by the interrupt (or the test's timeout), never by itself
        yield from batches

    rows = lake.spark.createDataFrame([(1, 1, datetime.now(UTC))], MODEL_STEPS.schema())
    lake.append(MODEL_STEPS, rows.mapInArrow(stall, rows.schema))


def next_writer(url: str, data_dir: Path) -> None:
    """The next fold writer: claiming the role interrupts the orphan's append."""
    from sis_platform.lake.spark.fold import FOLD_WRITER

    interrupted = _lake(url, data_dir).claim_writer(FOLD_WRITER)
    assert len(interrupted) == 1, interrupted


def unauthenticated(url: str, data_dir: Path) -> None:
    """A client without the server's token (none in its environment, or another one) is
    refused before it runs anything."""
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    try:
        SparkSession.builder.remote(url).getOrCreate().range(1).collect()
    except PySparkException as error:
        message = str(error)
        assert "UNAUTHENTICATED" in message, message
        print("refused:", message.splitlines()[0][:300])
    else:
        raise AssertionError("the server ran a query for a client without its token")


SCENARIOS = {
    "pipeline": pipeline,
    "orphan_writer": orphan_writer,
    "next_writer": next_writer,
    "unauthenticated": unauthenticated,
}

if __name__ == "__main__":
    name, url, data = sys.argv[1:4]
    SCENARIOS[name](url, Path(data))
    print(f"{name}: ok")
