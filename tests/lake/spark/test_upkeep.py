"""Delta upkeep inside the fold's and the model's steps (sis_platform/lake/upkeep.py): a step
that is due compacts its tables before its commit point, the next step's recovery keeps the
compaction, VACUUM removes what is past the retention and nothing younger, and the lake still
equals the reference fold."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest

from sis_platform.domain.limits import DEFAULT_LIMITS
from sis_platform.lake.delta import Lake
from sis_platform.lake.spark.fold import fold_step
from sis_platform.lake.spark.items import logged_condition, write_items
from sis_platform.lake.spark.model import refresh_model
from sis_platform.lake.tables import (
    BATCHES_PER_BLOCK,
    EVENTS,
    FOLD_STEPS,
    MASTER_DOCUMENTS,
    MASTER_VERSIONS,
    MESSAGE_ITEMS,
    MESSAGE_OUTCOMES,
    RAW_MESSAGES,
)
from sis_platform.lake.upkeep import (
    BLOCK_SETTLE_BATCHES,
    FOLD_UPKEEP_TABLES,
    RETENTION_PROPERTIES,
    block_file_bound,
    blocks_compact,
    compact_blocks,
    compaction_sql,
    due,
    files_within_bound,
    retention_value,
    settled_blocks,
    table_files,
)
from sis_platform.log.landing import batch_key
from sis_platform.settings import LakeUpkeepSettings
from tests.domain.sportsdata_fixtures import (
    ASCOT_1430,
    ASCOT_1500,
    GO_SOFT,
    PRICE_7_TO_9,
    event,
    master,
    update,
)
from tests.lake.spark.fold.lakes import log_batch, message
from tests.reference import assert_lake_matches_reference, reference_for


def test_due_when_a_step_passes_a_multiple():
    assert [s for s in range(1, 10) if due(3, s - 1, s)] == [3, 6, 9]
    assert due(3, 2, 7)  # a step over several batches passes 3 and 6
    assert not due(3, 3, 5)
    assert not due(0, 0, 100)  # 0: never
    assert not due(3, 3, 3)  # nothing new


FACTORY_MODE = "spark.sql.codegen.factoryMode"


@pytest.fixture
def interpreted(spark) -> Iterator[None]:
    """The session evaluates without generated code during the test, as an operator's
    SIS_SPARK_CONF may set for a run; set back after it, so the worker's later tests run with
    the suite's settings."""
    before = spark.conf.get(FACTORY_MODE)
    spark.conf.set(FACTORY_MODE, "NO_CODEGEN")
    yield
    spark.conf.set(FACTORY_MODE, before)


class _CodegenAtOptimize:
    """Stands in for `spark.sql`: notes the code generation setting each OPTIMIZE runs under."""

    def __init__(self, spark) -> None:
        self.spark, self.sql, self.seen = spark, spark.sql, []

    def __call__(self, statement: str, *args, **kwargs):
        if statement.startswith("OPTIMIZE"):
            self.seen.append(self.spark.conf.get(FACTORY_MODE, None))
        return self.sql(statement, *args, **kwargs)


def _operations(lake: Lake, table) -> list[str]:
    history = lake.spark.sql(f"DESCRIBE HISTORY {lake.sql_table(table)}")
    return [r["operation"] for r in history.orderBy("version").collect()]


def _feed() -> list[list]:
    first = [message(master(event(ASCOT_1430))), message(master(event(ASCOT_1500)))]
    return [
        first,
        [message(update(ASCOT_1430, GO_SOFT))],
        [message(update(ASCOT_1430, PRICE_7_TO_9)), message(b"<not-xml")],
        [message(update(ASCOT_1500, GO_SOFT))],
    ]


@pytest.mark.spark
@pytest.mark.cost(220)
def test_a_due_step_compacts_before_its_commit_and_the_next_step_keeps_it(
    spark, tmp_path, monkeypatch, interpreted
):
    upkeep = LakeUpkeepSettings(optimize_every=3, vacuum_every=0)
    lake = Lake(spark, str(tmp_path / "lake"), upkeep=upkeep)
    # The session evaluates without generated code (`interpreted`); the compaction rewrites
    # its rows with it (BULK_WRITE_SQL) and gives the session its setting back.
    codegen = _CodegenAtOptimize(spark)
    monkeypatch.setattr(spark, "sql", codegen)
    batches = _feed()
    for seq, batch in enumerate(batches[:3], start=1):
        log_batch(lake, seq, batch)
        assert fold_step(lake, max_batches=1).fold_step == seq
        if seq == 2:  # two steps, not compacted: a file each
            over = files_within_bound(lake, MASTER_VERSIONS, 1)
            assert not over.passed and over.files is not None and over.files.active_files == 2
            assert over.files.log_entries is not None and over.files.log_entries > 2
            assert files_within_bound(lake, MASTER_VERSIONS, 2).passed
    assert codegen.seen and set(codegen.seen) == {"FALLBACK"}
    assert spark.conf.get(FACTORY_MODE) == "NO_CODEGEN"
    assert files_within_bound(lake, MASTER_VERSIONS, 1).passed
    assert files_within_bound(lake, EVENTS, 1).files is None  # no model yet: passes
    # Step 3 compacted each table it writes into one file, deletion vectors purged.
    for table in (MASTER_VERSIONS, MASTER_DOCUMENTS, MESSAGE_OUTCOMES, FOLD_STEPS):
        assert _operations(lake, table)[-1 if table is not FOLD_STEPS else -2] == "OPTIMIZE"
    assert table_files(lake, MASTER_VERSIONS).active_files == 1
    assert table_files(lake, MASTER_DOCUMENTS).active_files == 1
    # Its fold_steps row records the versions after the compaction: recovery sees no
    # interrupted step.
    row = lake.read(FOLD_STEPS).where("fold_step = 3").first()
    recorded = json.loads(row["table_versions"])
    assert recorded[MASTER_DOCUMENTS.name] == lake.version(MASTER_DOCUMENTS)
    assert recorded[MASTER_VERSIONS.name] == lake.version(MASTER_VERSIONS)

    log_batch(lake, 4, batches[3])
    assert fold_step(lake, max_batches=1).fold_step == 4
    for table in (MASTER_VERSIONS, MASTER_DOCUMENTS, MESSAGE_OUTCOMES):
        assert "RESTORE" not in _operations(lake, table)
    assert table_files(lake, MASTER_DOCUMENTS).active_files == 2  # step 4's, not compacted
    assert_lake_matches_reference(lake, reference_for([m for b in batches for m in b]))

    # The model compacts its own tables at its refresh (4 fold steps: one multiple of 3).
    refreshed = refresh_model(lake)
    assert refreshed.fold_step == 4
    assert table_files(lake, EVENTS).active_files == 1


@pytest.mark.spark
@pytest.mark.cost(220)
def test_vacuum_removes_what_is_past_the_retention_and_keeps_the_rest(spark, tmp_path):
    upkeep = LakeUpkeepSettings(optimize_every=1, vacuum_every=2, retain_hours=48)
    lake = Lake(spark, str(tmp_path / "lake"), upkeep=upkeep)
    batches = _feed()
    log_batch(lake, 1, batches[0])
    fold_step(lake)
    # A file no commit lists, as a write killed mid-way leaves one, written three days ago;
    # and one written now.
    folder = tmp_path / "lake" / MASTER_VERSIONS.name
    stale, fresh = folder / "part-killed-old.parquet", folder / "part-killed-new.parquet"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"x")
    old = time.time() - 72 * 3600
    os.utime(stale, (old, old))
    on_disk_before = {p.name for p in folder.glob("*.parquet")}

    log_batch(lake, 2, batches[1])
    assert fold_step(lake).fold_step == 2  # compacts and vacuums
    on_disk = {p.name for p in folder.glob("*.parquet")}
    assert stale.name not in on_disk
    assert fresh.name in on_disk
    # The files the compactions took out of the table are younger than the retention: kept.
    assert on_disk_before - {stale.name} <= on_disk
    assert "VACUUM END" in _operations(lake, MASTER_VERSIONS)
    detail = spark.sql(f"DESCRIBE DETAIL {lake.sql_table(MASTER_VERSIONS)}").first()
    for name in RETENTION_PROPERTIES:
        assert detail["properties"][name] == retention_value(48)
    for table in FOLD_UPKEEP_TABLES:
        if lake.exists(table):
            assert table_files(lake, table).active_files <= 2, table.name
    assert_lake_matches_reference(lake, reference_for(batches[0] + batches[1]))


def test_message_outcomes_compacts_into_files_of_a_month_and_the_others_of_128_mib():
    # The dedupe reads the window's batches of message_outcomes: its growing file stays small.
    bins = "spark.databricks.delta.optimize.maxFileSize"
    assert compaction_sql(MESSAGE_OUTCOMES)[bins] == str(16 * 1024 * 1024)
    assert compaction_sql(MASTER_VERSIONS)[bins] == str(128 * 1024 * 1024)
    for table in (MESSAGE_OUTCOMES, MASTER_VERSIONS):
        sql = compaction_sql(table)
        assert sql["spark.databricks.delta.optimize.minFileSize"] == sql[bins]


def test_a_compacted_block_lists_two_files_per_bin_and_a_backfill():
    size = 128 * 1024 * 1024
    assert block_file_bound(0) == block_file_bound(1) == 2
    assert block_file_bound(size // 2) == 2
    assert block_file_bound(size) == 3
    assert block_file_bound(5 * size) == 11


def test_settled_blocks_are_the_blocks_before_the_settling_batch():
    settling = BATCHES_PER_BLOCK + BLOCK_SETTLE_BATCHES
    assert settled_blocks([BLOCK_SETTLE_BATCHES]) == []  # block 0 has no block before it
    assert settled_blocks([settling - 1]) == []
    assert settled_blocks([settling]) == [0]
    assert settled_blocks(range(1, 3 * BATCHES_PER_BLOCK + 20)) == [0, 1, 2]


@pytest.mark.spark
def test_a_write_that_settles_a_block_compacts_it_and_every_batch_reads_the_same(spark, tmp_path):
    lake = Lake(spark, str(tmp_path / "lake"), upkeep=LakeUpkeepSettings(retain_hours=24))
    first = [message(master(event(ASCOT_1430)))]
    for seq in (1, 2, 3):
        log_batch(lake, seq, first if seq == 1 else [message(update(ASCOT_1430, GO_SOFT))])
    settling = BATCHES_PER_BLOCK + BLOCK_SETTLE_BATCHES
    log_batch(lake, settling, [message(update(ASCOT_1430, PRICE_7_TO_9))])

    def block_files(table) -> dict[int, int]:
        files = lake.spark.read.format("delta").load(lake.path(table)).inputFiles()
        blocks = [int(f.split("batch_block=")[1].split("/")[0]) for f in files]
        return {b: blocks.count(b) for b in set(blocks)}

    def rows(table, seq) -> list:
        return sorted(
            map(tuple, lake.read(table).where(logged_condition(batch_key(seq))).collect())
        )

    seqs = (1, 2, 3, settling)
    before = {t.name: {s: rows(t, s) for s in seqs} for t in (RAW_MESSAGES, MESSAGE_ITEMS)}
    assert block_files(RAW_MESSAGES) == {0: 3, 1: 1}
    # Block 0 is settled and not compacted: the check names it; block 1 is open.
    finding = blocks_compact(lake, RAW_MESSAGES)
    assert not finding.passed and (finding.blocks, finding.settled) == (2, 1)
    assert [(b.block, b.files) for b in finding.over] == [(0, 3)]
    assert finding.files is not None and finding.files.active_files == 4
    # A write of batches that settles nothing compacts nothing.
    assert compact_blocks(lake, RAW_MESSAGES, [3], lake.upkeep).optimized == ()
    for table in (RAW_MESSAGES, MESSAGE_ITEMS):
        done = compact_blocks(lake, table, [settling], lake.upkeep)
        assert done.optimized == (table.name,) and done.vacuumed == (table.name,)
        assert block_files(table) == {0: 1, 1: 1}
        assert blocks_compact(lake, table).passed
        assert {s: rows(table, s) for s in seqs} == before[table.name]
        # Settled again (a retried write): already compact, nothing rewritten.
        assert compact_blocks(lake, table, [settling], lake.upkeep).optimized == ()


@pytest.mark.spark
def test_message_items_of_a_settling_batch_compact_the_block_before(spark, tmp_path):
    lake = Lake(spark, str(tmp_path / "lake"), upkeep=LakeUpkeepSettings(retain_hours=24))
    log_batch(lake, 1, [message(master(event(ASCOT_1430)))])
    log_batch(lake, 2, [message(update(ASCOT_1430, GO_SOFT))])
    settling = BATCHES_PER_BLOCK + BLOCK_SETTLE_BATCHES
    log_batch(lake, settling, [message(update(ASCOT_1430, PRICE_7_TO_9))])
    before = sorted(map(tuple, lake.read(MESSAGE_ITEMS).collect()))
    assert sum("batch_block=0/" in f for f in lake.read(MESSAGE_ITEMS).inputFiles()) == 2
    # The message_items asset's write of the settling batch: its items again, then the upkeep.
    write_items(lake, [batch_key(settling)], limits=DEFAULT_LIMITS, redelivery_limit=5, run_id=None)
    assert sum("batch_block=0/" in f for f in lake.read(MESSAGE_ITEMS).inputFiles()) == 1
    assert sorted(map(tuple, lake.read(MESSAGE_ITEMS).collect())) == before


@pytest.mark.spark
@pytest.mark.cost(30)
def test_a_state_table_counts_only_the_files_its_compaction_has_yet_to_merge(spark, tmp_path):
    # A partition per home block, kept for good: a compacted partition's files are not
    # counted against the bound, those beyond them are.
    lake = Lake(spark, str(tmp_path / "lake"))
    lake.ensure(MASTER_DOCUMENTS)

    def write(master_id: str, block: int) -> None:
        row = MASTER_DOCUMENTS.row(
            master_id=master_id,
            version=1,
            document="<event/>",
            stale=False,
            filtered=False,
            fold_step=1,
            first_block=block,
        )
        rows = spark.createDataFrame([row], MASTER_DOCUMENTS.schema()).coalesce(1)
        lake.append(MASTER_DOCUMENTS, rows)

    for i in range(4):
        write(f"M{i}", 0)  # four files in block 0: two more than a compacted block lists
    write("N", 1)
    finding = files_within_bound(lake, MASTER_DOCUMENTS, 1)
    assert finding.files is not None and finding.files.active_files == 5
    assert (finding.counted, finding.passed) == (4 - block_file_bound(1), False)
    assert files_within_bound(lake, MASTER_DOCUMENTS, 2).passed
