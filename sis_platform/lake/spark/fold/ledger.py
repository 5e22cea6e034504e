"""The fold's ledger: fold_steps, the commit point of every step, and what the model, replay and
trace read of it.

A step appends to master_versions, dead_letters and message_outcomes (every row tagged with the
step), merges the new states into master_documents, and finally appends its row to fold_steps:
that last append is the commit point, and it records the Delta version of every table the step
wrote. Before each step, `recover` undoes whatever an interrupted step left behind: it restores
each of those tables to the version the last committed step recorded. So a crash anywhere in a
step leaves no trace once the next step starts, and the refold produces the same rows
(docs/design.md invariant 2).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

from sis_platform.lake.tables import (
    BATCH_LOG,
    DEAD_LETTERS,
    FIRST_BLOCK,
    FOLD_APPEND_TABLES,
    FOLD_STEPS,
    MASTER_DOCUMENTS,
    MASTER_INDEX,
    MASTER_VERSIONS,
    MESSAGE_ITEMS,
    MESSAGE_OUTCOMES,
)

if TYPE_CHECKING:
    from sis_platform.lake.delta import Lake

# The role of the fold's single writer (the Dagster pool "sis_fold": fold steps, model refreshes,
# dead-letter replays), claimed on the Lake before anything is read: see Lake.claim_writer.
FOLD_WRITER = "sis-fold-writer"

FOLD_TABLES = (
    MASTER_VERSIONS,
    MASTER_DOCUMENTS,
    MASTER_INDEX,
    DEAD_LETTERS,
    MESSAGE_OUTCOMES,
    FOLD_STEPS,
)

# One row of fold_steps as the fold reads it (column name -> value).
StepRow = Mapping[str, Any]

# The tables a step writes before committing; recovery restores each to its committed version.
STEP_TABLES = (*FOLD_APPEND_TABLES, MASTER_DOCUMENTS)


@dataclass(frozen=True)
class CommittedStep:
    fold_step: int  # 0 before the first step
    last_batch_seq: int  # the last batch folded; 0 before the first step
    master_documents_version: int
    table_versions: dict[str, int]  # Delta version of each fold table after the step

    @property
    def log_version(self) -> int | None:
        """The batch_log version the step planned from (None: before the first step, or a step
        that did not record it): the next step reads only what changed after it."""
        return self.table_versions.get(BATCH_LOG.name)


@dataclass(frozen=True)
class FoldStepResult:
    fold_step: int | None  # None when nothing could be folded
    first_batch_seq: int | None = None
    last_batch_seq: int | None = None
    messages: int = 0  # messages given an outcome by this step
    applied: int = 0
    duplicates: int = 0
    filtered: int = 0
    dead_lettered: int = 0
    masters_changed: int = 0
    waiting_for: int | None = None  # the missing batch number that blocks the fold, if any
    rewound_masters: int = 0  # masters rewound and refolded (their input changed)
    changed_batches: tuple[int, ...] = ()  # folded batches whose items changed since


def fold_step_rows(lake: Lake) -> list[StepRow]:
    """Every committed step's row of fold_steps (one small row per step), through Arrow (a Row
    object per step cost the driver ~60 us a row: scripts/bench_step_reads.py). Read whole only
    when a step must know what an already-folded batch was when folded (`folded_batches`): a
    batch changed since, or a lake whose planning state is not recorded (plan.py)."""
    lake.ensure(FOLD_STEPS)
    table = lake.read(FOLD_STEPS).select(*_STEP_COLUMNS).toArrow()
    return table.to_pylist()


_STEP_COLUMNS = (
    "fold_step",
    "first_batch_seq",
    "last_batch_seq",
    "master_documents_version",
    "table_versions",
    "items_digest",
)


# What `committed_step` reads of every row: the top-1 scans the whole table, so only the
# columns it returns; never `items_digest`, a digest per batch the step folded (incompressible,
# the largest column of the table after a season).
_COMMITTED_COLUMNS = ("fold_step", "last_batch_seq", "master_documents_version", "table_versions")


def committed_step(lake: Lake) -> CommittedStep:
    """The last committed step: the one row of fold_steps with the highest step number (a
    top-1 over one column, whatever the table's length; the rows never reach the driver)."""
    lake.ensure(FOLD_STEPS)
    rows = (
        lake.read(FOLD_STEPS)
        .select(*_COMMITTED_COLUMNS)
        .orderBy(F.col("fold_step").desc())
        .limit(1)
        .toArrow()
        .to_pylist()
    )
    if not rows:
        # Before the first step every table is as `ensure` created it: version 0.
        return CommittedStep(0, 0, 0, {t.name: 0 for t in STEP_TABLES})
    (last,) = rows
    return CommittedStep(
        int(last["fold_step"]),
        int(last["last_batch_seq"]),
        int(last["master_documents_version"]),
        {k: int(v) for k, v in json.loads(last["table_versions"]).items()},
    )


def written_blocks(lake: Lake, after: int, through: int) -> tuple[int, ...] | None:
    """The home blocks of the masters the steps after..through wrote (fold_steps'
    `master_blocks`), or None when a step did not record them."""
    if not lake.exists(FOLD_STEPS):
        return None
    rows = (
        lake.read(FOLD_STEPS)
        .where((F.col("fold_step") > after) & (F.col("fold_step") <= through))
        .select("master_blocks")
        .toArrow()
        .to_pylist()
    )
    blocks: set[int] = set()
    for row in rows:
        if row["master_blocks"] is None:
            return None
        blocks.update(int(b) for b in row["master_blocks"])
    return tuple(sorted(blocks))


@dataclass(frozen=True)
class FoldProgress:
    """Where the fold stands, as monitoring reads it: the last committed step, the last batch
    it folded, when it committed, and the dead letters every committed step wrote, summed."""

    fold_step: int
    last_batch_seq: int
    committed_at: datetime
    dead_letters: int


def fold_progress(lake: Lake) -> FoldProgress | None:
    """The fold's progress from fold_steps (None before the first step): the last step's row
    and the sum of one column, computed by Spark (one row reaches the driver). Only committed
    steps have a row, so an interrupted step counts nothing."""
    lake.ensure(FOLD_STEPS)
    steps = lake.read(FOLD_STEPS)
    rows = (
        steps.select("fold_step", "last_batch_seq", "committed_at")
        .orderBy(F.col("fold_step").desc())
        .limit(1)
        .crossJoin(steps.agg(F.sum("dead_lettered").alias("dead_letters")))
        .toArrow()
        .to_pylist()
    )
    if not rows:
        return None
    (last,) = rows
    committed_at: datetime = last["committed_at"]
    return FoldProgress(
        int(last["fold_step"]),
        int(last["last_batch_seq"]),
        committed_at.replace(tzinfo=UTC) if committed_at.tzinfo is None else committed_at,
        int(last["dead_letters"]),
    )


def recover(lake: Lake) -> tuple[CommittedStep, dict[str, int]]:
    """Undo an interrupted step (see the module docstring). Returns the last committed step
    (fold_steps is the commit point, so recovery never changes it) and the current version of
    each step table (to read them pinned)."""
    refuse_unplaced_state(lake)
    lake.ensure(*FOLD_TABLES)
    committed = committed_step(lake)
    current: dict[str, int] = {}
    for table in STEP_TABLES:
        version = lake.version(table)
        committed_version = committed.table_versions[table.name]
        if version != committed_version:
            # A step wrote here and died before its fold_steps row: its writes never happened.
            lake.restore(table, committed_version)
            version = lake.version(table)
        current[table.name] = version
    return committed, current


class UnplacedStateError(RuntimeError):
    """The lake's current state was written before it was partitioned by home block."""


def refuse_unplaced_state(lake: Lake) -> None:
    """Refuse a lake whose master_documents has no home blocks (FIRST_BLOCK): its masters'
    partitions cannot be found, and a step would write each of them beside its old row. Such a
    lake is rebuilt from its log (docs/operations.md, "Upgrading a lake")."""
    if lake.exists(MASTER_DOCUMENTS) and FIRST_BLOCK not in lake.read(MASTER_DOCUMENTS).columns:
        raise UnplacedStateError(
            f"{lake.path(MASTER_DOCUMENTS)} has no {FIRST_BLOCK} column: it was written by an "
            "earlier version, before the current state was partitioned by each master's home "
            "block. Rebuild the fold's and the model's tables from the message log (see "
            'docs/operations.md, "Upgrading a lake"); nothing was written.'
        )


@dataclass(frozen=True)
class FoldedBatch:
    digest: str  # items digest of the batch when it was last folded (or refolded)
    items_version: int | None  # message_items version that fold read (None: not recorded)


def folded_batches(rows: list[StepRow]) -> dict[int, FoldedBatch]:
    """What each batch's items were when last folded, from the rows of fold_steps."""
    folded: dict[int, FoldedBatch] = {}
    rows = sorted(rows, key=lambda r: int(r["fold_step"]))
    for row in rows:
        items_version = json.loads(row["table_versions"]).get(MESSAGE_ITEMS.name)
        digests = {int(k): v for k, v in json.loads(str(row["items_digest"])).items()}
        folded.update({s: FoldedBatch(d, items_version) for s, d in digests.items()})
    return folded


def commit_step(
    lake: Lake,
    result: FoldStepResult,
    *,
    first_batch_seq: int,
    digests: dict[int, str],
    items_version: int,
    log_version: int,
    run_id: str | None,
    committed_at: datetime,
    master_blocks: tuple[int, ...] | None,
) -> None:
    """Append the step's row to fold_steps: the commit point. It records the version of every
    step table as written, the message_items version the step read (never restored: a later
    change of these batches is diffed against it, see rewind.changed_items), the batch_log
    version it planned from (the next step reads batch_log's changes after it), the items
    digest of every batch the step folded or refolded, and the home blocks of the masters it
    wrote (`master_blocks`; None: unknown, the model then reads every partition)."""
    assert result.fold_step is not None and result.last_batch_seq is not None
    written = {t.name: lake.version(t) for t in STEP_TABLES}
    written[MESSAGE_ITEMS.name] = items_version
    written[BATCH_LOG.name] = log_version
    row = FOLD_STEPS.row(
        fold_step=result.fold_step,
        first_batch_seq=first_batch_seq,
        last_batch_seq=result.last_batch_seq,
        items_digest=json.dumps({str(s): d for s, d in digests.items()}, sort_keys=True),
        master_documents_version=written[MASTER_DOCUMENTS.name],
        table_versions=json.dumps(written, sort_keys=True),
        messages=result.messages,
        applied=result.applied,
        duplicates=result.duplicates,
        filtered=result.filtered,
        dead_lettered=result.dead_lettered,
        masters_changed=result.masters_changed,
        master_blocks=list(master_blocks) if master_blocks is not None else None,
        run_id=run_id,
        committed_at=committed_at,
    )
    commit = lake.spark.createDataFrame([row], FOLD_STEPS.schema())
    lake.append(FOLD_STEPS, commit, txn_app_id=f"sis-fold:{FOLD_STEPS.name}")
