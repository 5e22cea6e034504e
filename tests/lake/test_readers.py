"""Readers outside Spark: every table docs/readers.md lists for Opportunity Management reads the
same rows in polars as in Spark, on a lake whose tables carry deletion vectors (a master folded
twice is rewritten in place), and delta-rs' Python binding refuses the tables docs/readers.md
says it cannot read (should it start reading them, the docs must change, and this fails).

One small lake is built once for the module by the real pipeline: messages put on the embedded
queue, landed by the sensor in two batches, each run through the Dagster job.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import deltalake
import polars as pl
import pytest

from sis_platform.lake.delta import Lake
from sis_platform.lake.tables import (
    DEAD_LETTERS,
    EVENTS,
    MARKETS,
    MASTER_DOCUMENTS,
    MASTER_INDEX,
    MASTER_VERSIONS,
    MESSAGE_OUTCOMES,
    SELECTIONS,
    Table,
)
from tests.domain.sportsdata_fixtures import (
    ASCOT_1430,
    ASCOT_1500,
    GO_SOFT,
    PRICE_7_TO_9,
    event,
    master,
    update,
)
from tests.harness import Harness

pytestmark = [pytest.mark.spark, pytest.mark.dagster, pytest.mark.cost(90)]

# What docs/readers.md promises for each table Opportunity Management reads.
READ_BY_POLARS = (
    MASTER_DOCUMENTS,
    EVENTS,
    MARKETS,
    SELECTIONS,
    MASTER_VERSIONS,
    MASTER_INDEX,
    DEAD_LETTERS,
    MESSAGE_OUTCOMES,
)
# Rewritten in place (MERGE, deletion vectors): delta-rs' Python binding cannot read them.
NOT_READ_BY_DELTA_RS = (MASTER_DOCUMENTS, EVENTS, MARKETS, SELECTIONS)


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory, spark) -> Lake:
    h = Harness(tmp_path_factory.mktemp("readers") / "data")
    queue = h.resources["queue"].open()
    # Batch 1: two races in one message, so each fold table's first file holds both.
    with queue.producer() as producer:
        producer.put(master(event(ASCOT_1430), event(ASCOT_1500)))
    h.drain()
    # Batch 2: one race's price changes, and an update for no known race: every rewritten
    # table replaces one of the two rows in its file (a deletion vector), dead_letters gets one.
    with queue.producer() as producer:
        producer.put(update(ASCOT_1430, PRICE_7_TO_9))
        producer.put(update("NOPE-1", GO_SOFT))
    h.drain()
    assert h.requested == ["0000000001", "0000000002"]
    h.run_requested()
    return h.lake(spark)


def test_the_rewritten_tables_carry_deletion_vectors(lake: Lake):
    # Otherwise the comparison below would not prove a reader applies them.
    for table in NOT_READ_BY_DELTA_RS:
        assert _has_deletion_vectors(Path(lake.path(table))), table.name


@pytest.mark.parametrize("table", READ_BY_POLARS, ids=lambda t: t.name)
def test_polars_reads_the_rows_spark_reads(lake: Lake, table: Table):
    spark_df = lake.read(table)
    columns = spark_df.columns
    by_spark = _rows(tuple(r[c] for c in columns) for r in spark_df.collect())
    by_polars = _rows(pl.read_delta(lake.path(table)).select(columns).rows())
    assert by_polars == by_spark
    assert by_spark


@pytest.mark.parametrize("table", NOT_READ_BY_DELTA_RS, ids=lambda t: t.name)
def test_delta_rs_refuses_the_tables_with_deletion_vectors(lake: Lake, table: Table):
    with pytest.raises(Exception, match="deletionVectors"):
        deltalake.DeltaTable(lake.path(table)).to_pyarrow_table()


def _rows(rows: Any) -> list[tuple[Any, ...]]:
    """Rows as comparable values, in one order: instants in UTC (Spark returns local naive
    datetimes, polars UTC ones), bytes for binary."""
    return sorted((tuple(_value(v) for v in row) for row in rows), key=repr)


def _value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC)  # a naive value is local time
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value


def _has_deletion_vectors(table: Path) -> bool:
    for entry in sorted((table / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            add = json.loads(line).get("add")
            if add and add.get("deletionVector"):
                return True
    return False
