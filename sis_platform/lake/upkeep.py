"""Delta upkeep of the fold's and the model's tables: compaction (OPTIMIZE), removal of the files
they no longer list (VACUUM) and the retention both go by, run inside their steps, and the count
of a table's files that the `files_within_bound` check compares with its bound; and of the
message log's tables, compacted by block of batches, whose bound is per settled block.

Every fold step appends a file or two, and a deletion vector, to each of its tables, and so does
every model refresh: without upkeep a table holds one file per step, and a step's reads and
commits slow down with the number of files (docs/operations.md, "The lake's files").

Upkeep runs inside the step that writes the tables, after its writes and before its commit point
(the fold's fold_steps row, the model's model_steps row), so the step's recovery covers it as it
covers the step's writes: an OPTIMIZE or a VACUUM is a commit like any other, the fold step's row
records each table's version after it, and a step that dies before its row is undone whole by
the next step's `recover` (it restores the tables to the last committed versions, whose files the
retention keeps) and done again. The model's refresh rebuilds its rows and redoes its upkeep.
The step number decides when: a step whose number passes a multiple of `optimize_every`
compacts, one that passes a multiple of `vacuum_every` vacuums as well, so a step retried after
a crash does the same upkeep again.

OPTIMIZE bin-packs the files under `COMPACT_BELOW_BYTES` (a table's own `compact_bytes` where it
has one) into files of at most that size, and so rewrites at most that much per table and
compaction however old the table is; it purges the
deletion vectors of the files it rewrites. It changes no row (`dataChange=false`). It runs with
Spark's generated expressions even where SIS_SPARK_CONF turns them off for a run
(BULK_WRITE_SQL): the rows it rewrites are a table's, not a step's. VACUUM goes by the tables' own
`delta.deletedFileRetentionDuration` (set here from SIS_LAKE_RETAIN_HOURS: Delta 4 ignores a
RETAIN shorter than it), and `delta.logRetentionDuration` (the same) bounds the transaction log:
Delta writes a checkpoint every `delta.checkpointInterval` (10) commits and then drops log
entries older than it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sis_platform.lake.driver.conf import BULK_WRITE_SQL
from sis_platform.lake.tables import (
    BATCH_BLOCK,
    BATCH_LOG,
    BATCHES_PER_BLOCK,
    CLASSIFY_FAILURES,
    DEAD_LETTERS,
    EVENTS,
    FIRST_BLOCK,
    FOLD_FAILURES,
    FOLD_STEPS,
    MARKETS,
    MASTER_DOCUMENTS,
    MASTER_INDEX,
    MASTER_VERSIONS,
    MESSAGE_ITEMS,
    MESSAGE_OUTCOMES,
    MODEL_FAILURES,
    MODEL_STEPS,
    RAW_MESSAGES,
    SELECTIONS,
    Table,
    batch_block,
)
from sis_platform.runtime.faults import crash_point
from sis_platform.settings import LakeUpkeepSettings

if TYPE_CHECKING:
    from sis_platform.lake.delta import Lake

# What a fold step keeps compact: the tables it writes, its ledger's, and the batch log every
# batch run appends a row to (its reader, the fold's plan, reads its latest version).
FOLD_UPKEEP_TABLES = (
    MASTER_VERSIONS,
    MASTER_DOCUMENTS,
    MASTER_INDEX,
    DEAD_LETTERS,
    MESSAGE_OUTCOMES,
    FOLD_FAILURES,
    FOLD_STEPS,
    BATCH_LOG,
    CLASSIFY_FAILURES,
)
MODEL_UPKEEP_TABLES = (EVENTS, MARKETS, SELECTIONS, MODEL_FAILURES, MODEL_STEPS)
# Every table `files_within_bound` watches against SIS_LAKE_MAX_FILES.
UPKEEP_TABLES = FOLD_UPKEEP_TABLES + MODEL_UPKEEP_TABLES
# The message log's tables, compacted by block of batches (`compact_blocks`) and kept for good:
# they gain a block's files every 500 batches, so their bound is per block (`blocks_compact`).
BLOCK_TABLES = (RAW_MESSAGES, MESSAGE_ITEMS)

# A block of raw_messages and message_items is compacted when the batch this many into the next
# block is written (`settled_blocks`).
BLOCK_SETTLE_BATCHES = 10

# OPTIMIZE's bins: files under this size are compacted into files of at most this size. Delta's
# default (1 GiB) would rewrite a growing append-only table (master_versions, message_outcomes)
# whole at every compaction until it passes 1 GiB: a cost growing with the lake's age. At
# 128 MiB a compaction rewrites at most that much per table, and a year's table stays at tens
# of files.
COMPACT_BELOW_BYTES = 128 * 1024 * 1024


def bin_bytes(table: Table) -> int:
    """The size of the files OPTIMIZE writes for `table` (`Table.compact_bytes`, else
    COMPACT_BELOW_BYTES)."""
    return table.compact_bytes or COMPACT_BELOW_BYTES


def compaction_sql(table: Table) -> dict[str, str]:
    """The session's settings while the upkeep compacts `table`, put back after it: its bins
    (`bin_bytes`), and generated code for the rows it rewrites (BULK_WRITE_SQL, whatever
    SIS_SPARK_CONF sets for a run)."""
    size = str(bin_bytes(table))
    return {
        "spark.databricks.delta.optimize.minFileSize": size,
        "spark.databricks.delta.optimize.maxFileSize": size,
        **BULK_WRITE_SQL,
    }


RETENTION_PROPERTIES = ("delta.deletedFileRetentionDuration", "delta.logRetentionDuration")


@dataclass(frozen=True)
class UpkeepDone:
    """What one step's upkeep did."""

    optimized: tuple[str, ...] = ()  # tables compacted (OPTIMIZE ran)
    files_removed: int = 0  # files OPTIMIZE took out of the tables (now tombstones)
    files_added: int = 0  # the files it wrote in their place
    vacuumed: tuple[str, ...] = ()  # tables vacuumed


def due(every: int, before: int, after: int) -> bool:
    """A step that moves a table's steps from `before` to `after` passes a multiple of `every`
    (0: never). The model may skip fold steps, so it is a crossing, not `after % every`."""
    return every > 0 and after > before and after // every > before // every


def run_upkeep(
    lake: Lake,
    tables: Sequence[Table],
    *,
    role: str,
    before: int,
    after: int,
    settings: LakeUpkeepSettings,
) -> UpkeepDone:
    """The upkeep a step from `before` to `after` owes `tables` (see the module docstring).
    `role` names its crash points: `<role>.mid_optimize` (the first table compacted, the others
    not), `<role>.after_optimize`, `<role>.after_vacuum`."""
    if not due(settings.optimize_every, before, after) and not due(
        settings.vacuum_every, before, after
    ):
        return UpkeepDone()
    present = [t for t in tables if lake.exists(t)]
    optimized: list[str] = []
    removed = added = 0
    for i, table in enumerate(present):
        with lake.sql_settings(compaction_sql(table)):
            _retention(lake, table, settings.retain_hours)
            files_removed, files_added = optimize(lake, table)
        if files_removed:
            optimized.append(table.name)
        removed += files_removed
        added += files_added
        if i == 0:
            crash_point(f"{role}.mid_optimize")
    crash_point(f"{role}.after_optimize")
    vacuumed: list[str] = []
    if due(settings.vacuum_every, before, after):
        for table in present:
            vacuum(lake, table)
            vacuumed.append(table.name)
        crash_point(f"{role}.after_vacuum")
    return UpkeepDone(tuple(optimized), removed, added, tuple(vacuumed))


def optimize(lake: Lake, table: Table, where: str | None = None) -> tuple[int, int]:
    """Bin-pack the table's small files (one commit, none when there is nothing to compact),
    or those of the partitions `where` selects. Returns the files removed and added."""
    statement = f"OPTIMIZE {lake.sql_table(table)}" + (f" WHERE {where}" if where else "")
    rows = lake.retrying_conflicts(
        f"{table.name} optimize" + (f" where {where}" if where else ""),
        lambda: lake.spark.sql(statement).collect(),
    )
    metrics = rows[0]["metrics"] if rows else None
    if metrics is None:
        return 0, 0
    return int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"])


def settles(block: int, seq: int) -> bool:
    """Whether a table holding batch `seq` has settled `block` (see `settled_blocks`)."""
    return seq >= (block + 1) * BATCHES_PER_BLOCK + BLOCK_SETTLE_BATCHES


def settled_blocks(seqs: Iterable[int]) -> list[int]:
    """The blocks of batches (lake/tables.py) a write of batches `seqs` settles: the block
    before each block whose batch number BLOCK_SETTLE_BATCHES it writes. By then the runs that
    wrote the settled block's last batches have ended (at most SIS_MAX_RUNS_IN_FLIGHT run at
    once, in feed order)."""
    return sorted(
        {
            batch_block(seq) - 1
            for seq in seqs
            if seq % BATCHES_PER_BLOCK == BLOCK_SETTLE_BATCHES and batch_block(seq) >= 1
        }
    )


def compact_blocks(
    lake: Lake, table: Table, seqs: Iterable[int], settings: LakeUpkeepSettings
) -> UpkeepDone:
    """The upkeep of raw_messages or message_items after a write of batches `seqs`: each block
    the write settles compacted (an OPTIMIZE of its partition: one commit, no row changed), then
    the table vacuumed. Nothing to undo if killed anywhere: a killed OPTIMIZE commits nothing
    and leaves files no commit lists (the next VACUUM's), one that committed changed no row.
    A retried write settles the same block again, which is then compact already (OPTIMIZE
    leaves a lone file as it is). A batch written into a settled block later (a backfill) adds
    a file the block keeps. `SIS_LAKE_OPTIMIZE_EVERY=0` turns it off, as it does the steps'."""
    blocks = settled_blocks(seqs)
    if not blocks or settings.optimize_every <= 0 or not lake.exists(table):
        return UpkeepDone()
    removed = added = 0
    with lake.sql_settings(compaction_sql(table)):
        _retention(lake, table, settings.retain_hours)
        for block in blocks:
            files_removed, files_added = optimize(lake, table, f"{BATCH_BLOCK.name} = {block}")
            removed += files_removed
            added += files_added
    crash_point(f"{table.name}.after_compact")
    vacuumed: tuple[str, ...] = ()
    if settings.vacuum_every > 0:
        vacuum(lake, table)
        vacuumed = (table.name,)
    return UpkeepDone((table.name,) if removed else (), removed, added, vacuumed)


def vacuum(lake: Lake, table: Table) -> None:
    """Remove the files the table stopped listing longer ago than its retention (and files no
    commit ever listed, a killed write's, as old). Delta's retention check stays on."""
    lake.retrying_conflicts(
        f"{table.name} vacuum", lambda: lake.spark.sql(f"VACUUM {lake.sql_table(table)}").collect()
    )


def retention_value(hours: float) -> str:
    """A Delta interval of `hours`, in whole seconds."""
    return f"interval {round(hours * 3600)} seconds"


def _retention(lake: Lake, table: Table, hours: float) -> None:
    """Set the table's retention properties to `hours` where they differ (one commit)."""
    wanted = retention_value(hours)
    detail = lake.spark.sql(f"DESCRIBE DETAIL {lake.sql_table(table)}").first()
    properties = dict(detail["properties"] or {}) if detail is not None else {}
    if all(properties.get(p) == wanted for p in RETENTION_PROPERTIES):
        return
    assignments = ", ".join(f"'{p}' = '{wanted}'" for p in RETENTION_PROPERTIES)
    lake.retrying_conflicts(
        f"{table.name} retention",
        lambda: lake.spark.sql(
            f"ALTER TABLE {lake.sql_table(table)} SET TBLPROPERTIES ({assignments})"
        ),
    )


@dataclass(frozen=True)
class TableFiles:
    """A table's files: those its latest version lists, and on a local lake what its folder
    holds besides (files a later VACUUM removes are counted until it does)."""

    active_files: int
    active_bytes: int
    deletion_vector_files: int | None  # on the volume; None where the lake is not local
    log_entries: int | None  # commits, checkpoints and their checksums; None: not local


def table_files(lake: Lake, table: Table) -> TableFiles:
    """The table's file counts: DESCRIBE DETAIL for what its latest version lists, the folder
    for deletion vectors and log entries (a local lake only)."""
    detail = lake.spark.sql(f"DESCRIBE DETAIL {lake.sql_table(table)}").first()
    assert detail is not None
    folder = local_folder(lake.path(table))
    dvs = logs = None
    if folder is not None and folder.is_dir():
        dvs = sum(1 for _ in folder.rglob("deletion_vector_*.bin"))
        log = folder / "_delta_log"
        logs = sum(1 for p in log.iterdir() if not p.name.startswith(".")) if log.is_dir() else 0
    return TableFiles(int(detail["numFiles"]), int(detail["sizeInBytes"]), dvs, logs)


def local_folder(path: str) -> Path | None:
    """The folder of a lake path on this host (a plain path or `file:`), None for a remote one
    (`s3a://`, ...)."""
    local = path.removeprefix("file:")
    return None if "://" in local else Path(local)


@dataclass(frozen=True)
class FilesFinding:
    """`files_within_bound` for one table: its files counted against the bound."""

    passed: bool
    files: TableFiles | None  # None: the table does not exist yet
    bound: int
    counted: int = 0  # the files counted: all, or those beyond compacted partitions


def files_within_bound(lake: Lake, table: Table, bound: int) -> FilesFinding:
    """The table lists at most `bound` data files (a table not yet written passes). A table of
    the current state, partitioned by home block, keeps a partition per block of batches for
    good, so it counts the files beyond those of its partitions compacted (each partition's
    files over `block_file_bound` of its bytes): what its upkeep has yet to merge."""
    if not lake.exists(table):
        return FilesFinding(True, None, bound)
    files = table_files(lake, table)
    counted = files.active_files
    if FIRST_BLOCK in table.partition_by:
        parts = block_files(lake, table, FIRST_BLOCK)
        counted = sum(max(0, p.files - p.bound) for p in parts)
    return FilesFinding(counted <= bound, files, bound, counted)


@dataclass(frozen=True)
class BlockFiles:
    """The files a block table's latest version lists in one block of batches, the most a
    compacted block of its bytes lists (`block_file_bound`), and its newest batch."""

    block: int
    files: int
    bytes: int
    bound: int
    newest_seq: int


def block_file_bound(size: int, bins: int = COMPACT_BELOW_BYTES) -> int:
    """The most files a compacted block of `size` bytes lists: OPTIMIZE fills a bin until it
    passes the bin size (`bins`), so two bins in a row hold more than that, and the block's
    files are at most twice its bytes over the bin size, rounded up; plus one, a batch written
    into the block after its compaction (a backfill)."""
    return max(1, math.ceil(2 * size / bins)) + 1


@dataclass(frozen=True)
class BlocksFinding:
    """`files_within_bound` for a block table: every settled block within `block_file_bound`."""

    passed: bool
    files: TableFiles | None  # None: the table does not exist yet
    blocks: int  # blocks the table holds
    settled: int  # of which settled, so compacted by the write that settled them
    over: tuple[BlockFiles, ...]  # settled blocks over their bound, oldest first


def block_files(lake: Lake, table: Table, column: str = BATCH_BLOCK.name) -> list[BlockFiles]:
    """Each block's files and bytes, from Spark's file metadata column, and its newest batch
    (0 for a table without batch_seq): one scan, which reads the files' footers and their
    batch_seq column only. `column` names the table's block partition column."""
    from pyspark.sql import functions as F

    rows_of = lake.read(table)
    newest = F.max("batch_seq") if "batch_seq" in rows_of.columns else F.lit(0)
    per_file = rows_of.groupBy(
        F.col(column).alias("block"),
        F.col("_metadata.file_path").alias("path"),
        F.col("_metadata.file_size").alias("size"),
    ).agg(newest.alias("newest"))
    rows = (
        per_file.groupBy("block")
        .agg(
            F.count("*").alias("files"),
            F.sum("size").alias("bytes"),
            F.max("newest").alias("newest"),
        )
        .orderBy("block")
        .collect()
    )
    bins = bin_bytes(table)
    return [
        BlockFiles(
            int(r["block"]),
            int(r["files"]),
            int(r["bytes"]),
            block_file_bound(int(r["bytes"]), bins),
            int(r["newest"]),
        )
        for r in rows
    ]


def blocks_compact(lake: Lake, table: Table) -> BlocksFinding:
    """Every block of `table` (raw_messages, message_items) that its newest batch has settled
    lists at most `block_file_bound` files: the writes that settle blocks compact them. The
    open blocks, one file per batch, are bounded by BATCHES_PER_BLOCK + BLOCK_SETTLE_BATCHES.
    A table not yet written passes."""
    if not lake.exists(table):
        return BlocksFinding(True, None, 0, 0, ())
    blocks = block_files(lake, table)
    top = max((b.newest_seq for b in blocks), default=-1)
    settled = [b for b in blocks if settles(b.block, top)]
    over = tuple(b for b in settled if b.files > b.bound)
    return BlocksFinding(not over, table_files(lake, table), len(blocks), len(settled), over)
