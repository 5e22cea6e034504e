"""What a fold step writes: master_versions, dead_letters, message_outcomes, master_index and
master_documents, built from the fold's output rows and the step's message-level facts, then
appended (each row tagged with the step) and merged into the partitions of the step's masters.
fold_failures is quarantine.py's; fold_steps, the commit point, is ledger.py's.

Every message of a step has at least one outcome row: one per item (applied, filtered or
dead-lettered by the fold, or held back by the quarantine) and one per duplicate or invalid
message (position null). A master whose fold raised has one `failure` row and no other: it
rides with the outcomes (outcome FAILED), so the step's tally, taken before anything is written,
finds it without a job of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from sis_platform.domain.reasons import Outcome, Reason
from sis_platform.lake.spark.fold.homes import blocks_condition
from sis_platform.lake.spark.fold.quarantine import FAILED
from sis_platform.lake.spark.fold.worker import FAILURE, RESULT, STATE, VERSION
from sis_platform.lake.tables import (
    DEAD_LETTERS,
    MASTER_DOCUMENTS,
    MASTER_INDEX,
    MASTER_VERSIONS,
    MESSAGE_OUTCOMES,
)
from sis_platform.runtime.faults import crash_point

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from sis_platform.lake.delta import Lake


@dataclass(frozen=True)
class MessageFacts:
    """The step's input rows that end without being folded, beside the fold's own output."""

    duplicates: DataFrame  # message_id, batch_seq, msg_seq of each duplicate message
    invalid: DataFrame  # message_items rows of invalid messages (reason, detail)
    held: DataFrame  # items of quarantined masters, `detail` the quarantine's


def _message_level(
    rows: DataFrame, outcome: str, reason: str | Column, detail: str | Column
) -> DataFrame:
    """Outcome rows standing for whole messages (no position, no master)."""
    return rows.select(
        "message_id",
        "batch_seq",
        "msg_seq",
        F.lit(None).cast("int").alias("position"),
        F.lit(None).cast("string").alias("master_id"),
        F.lit(outcome).alias("outcome"),
        F.lit(None).cast("int").alias("version"),
        reason,
        detail,
        F.lit(None).cast("string").alias("warning"),
    )


def outcome_rows(folded: DataFrame, facts: MessageFacts, step: Column) -> DataFrame:
    """message_outcomes rows of the step (and its FAILED rows, never written). Materialized:
    the tally, the dead letters and the write all derive from it."""
    results = folded.where(F.col("kind").isin(RESULT, FAILURE)).withColumn(
        "outcome", F.when(F.col("kind") == FAILURE, F.lit(FAILED)).otherwise(F.col("outcome"))
    )
    null = F.lit(None).cast("string")
    return (
        results.select(
            "message_id",
            "batch_seq",
            "msg_seq",
            "position",
            "master_id",
            "outcome",
            "version",
            "reason",
            "detail",
            "warning",
        )
        .unionByName(
            _message_level(
                facts.duplicates,
                str(Outcome.DUPLICATE),
                null.alias("reason"),
                null.alias("detail"),
            )
        )
        .unionByName(_message_level(facts.invalid, str(Outcome.DEAD_LETTERED), "reason", "detail"))
        .unionByName(
            facts.held.select(
                "message_id",
                "batch_seq",
                "msg_seq",
                "position",
                "master_id",
                F.lit(str(Outcome.DEAD_LETTERED)).alias("outcome"),
                F.lit(None).cast("int").alias("version"),
                F.lit(str(Reason.QUARANTINED)).alias("reason"),
                "detail",
                null.alias("warning"),
            )
        )
        .withColumn("fold_step", step)
    ).localCheckpoint()


@dataclass(frozen=True)
class Tally:
    """Every figure of a step, from its outcome rows in one job."""

    messages: int  # messages given an outcome (each has at least one row)
    outcomes: dict[str, int]  # rows per Outcome value
    failed: int  # FAILED rows: masters whose fold raised

    def count(self, outcome: Outcome) -> int:
        return self.outcomes.get(str(outcome), 0)


def tally(outcomes: DataFrame) -> Tally:
    row = outcomes.agg(
        F.count_distinct("batch_seq", "msg_seq").alias("messages"),
        *[F.count_if(F.col("outcome") == str(o)).alias(str(o)) for o in Outcome],
        F.count_if(F.col("outcome") == FAILED).alias(FAILED),
    ).first()
    assert row is not None
    return Tally(
        messages=int(row["messages"]),
        outcomes={str(o): int(row[str(o)]) for o in Outcome},
        failed=int(row[FAILED]),
    )


def failed_masters(outcomes: DataFrame) -> DataFrame:
    """master_id, detail of every FAILED row (the masters named by their rows' master_id
    column, never by an error's text)."""
    return outcomes.where(F.col("outcome") == FAILED).select("master_id", "detail")


def dead_letter_rows(outcomes: DataFrame, raw: DataFrame, now: datetime) -> DataFrame:
    """One dead letter per dead-lettered outcome, with its message's body from raw_messages."""
    raw_cols = raw.select("batch_seq", "msg_seq", "batch_key", "body", "delivery_count")
    return (
        outcomes.where(F.col("outcome") == str(Outcome.DEAD_LETTERED))
        .join(raw_cols, ["batch_seq", "msg_seq"])
        .withColumn("dead_lettered_at", F.lit(now))
    )


def version_rows(folded: DataFrame, step: Column) -> DataFrame:
    return folded.where(F.col("kind") == VERSION).withColumn("fold_step", step)


def state_rows(folded: DataFrame, step: Column) -> DataFrame:
    return folded.where(F.col("kind") == STATE).withColumn("fold_step", step)


@dataclass(frozen=True)
class StepOutputs:
    versions: DataFrame
    dead_letters: DataFrame
    outcomes: DataFrame
    states: DataFrame  # the new state of every master the step changed, with its home block
    index: DataFrame  # master_index rows of the masters the step gives their first state
    blocks: tuple[int, ...]  # the home blocks of the step's masters (homes.Homes.blocks)


def write_outputs(
    lake: Lake, out: StepOutputs, *, dead_lettered: int, priority_classes: int = 0
) -> None:
    """Append the step's rows and merge its states (all before the commit point). With
    `priority_classes` (SIS_PRIORITY's selectors), the states of each class's masters are
    merged first, one commit per class in order, so that readers of master_documents see them
    before the step's other writes; an interrupted step's recovery restores these commits too."""
    columns = [f.name for f in MASTER_DOCUMENTS.schema().fields]
    states = out.states
    # The merges read the step's masters' partitions only (their home blocks, as literals).
    homes = blocks_condition(out.blocks, "t")
    for priority_class in range(priority_classes):
        ahead = states.where(F.col("priority_class") == priority_class)
        if not ahead.isEmpty():
            lake.merge_rows(
                MASTER_DOCUMENTS, ahead.select(*columns), keys=("master_id",), where=homes
            )
    if priority_classes:
        rest = F.col("priority_class").isNull() | (F.col("priority_class") >= priority_classes)
        states = states.where(rest)
    for table, rows in (
        (MASTER_VERSIONS, out.versions),
        (DEAD_LETTERS, out.dead_letters),
        (MESSAGE_OUTCOMES, out.outcomes),
        (MASTER_INDEX, out.index),
    ):
        if table is DEAD_LETTERS and not dead_lettered:
            # One dead letter per dead-lettered outcome: none to write, so no commit (a Delta
            # commit, ~1 s, in most steps). The table stays at the version `recover` expects.
            continue
        lake.append(table, rows, txn_app_id=f"sis-fold:{table.name}")
        if table is MASTER_VERSIONS:
            crash_point("fold.after_versions")
    lake.merge_rows(MASTER_DOCUMENTS, states.select(*columns), keys=("master_id",), where=homes)
    crash_point("fold.after_documents")
