"""Rewind (docs/design.md invariant 3): masters whose input changed go back to their last good
version and are refolded from there, in the same step as any new batches.

When a batch already folded has different items now (its message_items were re-materialized
after a fix, so its digest in batch_log differs from the one folded), the masters it touches,
before or after, are rewound: each goes back to its last version before the first changed
batch, taken from master_versions (right after an applied version a master is neither stale
nor filtered, so the version is its whole state), its later rows are deleted, and its items from
that point on are refolded. A step may also be asked for the same explicitly (master id ->
batch to refold from): dead-letter replay after a fold fix, where the items are the same.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING

from pyspark.errors import AnalysisException
from pyspark.sql import Window
from pyspark.sql import functions as F

from sis_platform.lake.delta import sql_in
from sis_platform.lake.spark.fold.worker import FOLD_OUT_SCHEMA, STATE
from sis_platform.lake.tables import (
    DEAD_LETTERS,
    MASTER_VERSIONS,
    MESSAGE_ITEMS,
    MESSAGE_OUTCOMES,
)
from sis_platform.runtime.faults import crash_point, kill_during_write

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pyspark.sql import Column, DataFrame

    from sis_platform.lake.delta import Lake
    from sis_platform.lake.spark.fold.ledger import FoldedBatch

log = logging.getLogger(__name__)

# The columns of message_items whose change makes an item's master rewind.
_ITEM_COLUMNS = (
    "batch_seq",
    "msg_seq",
    "position",
    "master_id",
    "status",
    "category",
    "type",
    "payload",
    "reason",
)

_TOUCHED = "master_id string, batch_seq long"


def after_point(t: str, p: str) -> str:
    """SQL: row `t` comes after the rewind point `p` in feed order (batch, message, position).
    A master without a point (p_batch = -1) is refolded from its first item."""
    return (
        f"({t}.batch_seq > {p}.p_batch OR ({t}.batch_seq = {p}.p_batch AND "
        f"({t}.msg_seq > {p}.p_msg OR ({t}.msg_seq = {p}.p_msg AND "
        f"coalesce({t}.position, -1) > {p}.p_pos))))"
    )


def changed_items(
    lake: Lake, now: DataFrame, changed: list[int], folded: dict[int, FoldedBatch]
) -> DataFrame:
    """(master_id, batch_seq) of every item that differs between what was folded and what the
    changed batches hold now: the masters to rewind, and from which batch. Where the folded
    version of message_items is gone (vacuumed, or not recorded), every master of the batch,
    then or now, counts as changed."""
    parts: list[DataFrame] = []
    by_version: dict[int | None, list[int]] = {}
    for seq in changed:
        by_version.setdefault(folded[seq].items_version, []).append(seq)
    for version, seqs in by_version.items():
        current = now.where(F.col("batch_seq").isin(seqs)).select(*_ITEM_COLUMNS)
        if version is not None:
            try:
                before = (
                    lake.read(MESSAGE_ITEMS, version=version)
                    .where(F.col("batch_seq").isin(seqs))
                    .select(*_ITEM_COLUMNS)
                )
                diff = before.exceptAll(current).unionByName(current.exceptAll(before))
                parts.append(diff.select("master_id", "batch_seq").localCheckpoint())
                continue
            except AnalysisException as error:
                log.warning(
                    f"message_items version {version} unavailable ({error}); "
                    f"rewinding every master of batches {seqs}"
                )
        outcomes = lake.read(MESSAGE_OUTCOMES).where(F.col("batch_seq").isin(seqs))
        parts.append(
            outcomes.select("master_id", "batch_seq").unionByName(
                current.select("master_id", "batch_seq")
            )
        )
    return reduce(lambda a, b: a.unionByName(b), parts).where(F.col("master_id").isNotNull())


def rewind_points(versions: DataFrame, touched: DataFrame) -> DataFrame:
    """Per master in `touched` (master_id, batch_seq): its last version before the first
    touched batch (version, document; null if none) and that version's place in the feed
    (p_batch, p_msg, p_pos; -1 if none, so every item of the master comes after it).
    `versions`: master_versions as committed. Materialized (localCheckpoint)."""
    from_batch = touched.groupBy("master_id").agg(F.min("batch_seq").alias("from_batch"))
    last_before = Window.partitionBy("master_id").orderBy(
        F.col("batch_seq").desc(), F.col("msg_seq").desc(), F.col("position").desc()
    )
    points = (
        versions.join(from_batch, "master_id")
        .where(F.col("batch_seq") < F.col("from_batch"))
        .withColumn("n", F.row_number().over(last_before))
        .where("n = 1")
        .select(
            "master_id",
            "version",
            "document",
            F.col("batch_seq").alias("p_batch"),
            F.col("msg_seq").alias("p_msg"),
            F.col("position").alias("p_pos"),
        )
    )
    return (
        from_batch.join(points, "master_id", "left")
        .select(
            "master_id",
            "version",
            "document",
            F.coalesce("p_batch", F.lit(-1).cast("long")).alias("p_batch"),
            F.coalesce("p_msg", F.lit(-1)).alias("p_msg"),
            F.coalesce("p_pos", F.lit(-1)).alias("p_pos"),
        )
        .localCheckpoint()
    )


@dataclass(frozen=True)
class Rewind:
    """The masters one step rewinds, each with its point (see `rewind_points`)."""

    points: DataFrame  # master_id, version, document, p_batch, p_msg, p_pos
    changed: list[int]  # the changed batches that caused it (may be empty)
    changed_keys: list[str]  # their batch keys

    @property
    def ids(self) -> DataFrame:
        return self.points.select("master_id")

    @classmethod
    def plan(
        cls,
        lake: Lake,
        *,
        log_items: DataFrame,
        versions: DataFrame,
        changed: list[int],
        changed_keys: list[str],
        folded: dict[int, FoldedBatch],
        explicit: Mapping[str, int] | None,
    ) -> Rewind:
        """The masters the `changed` batches touch, and those asked for `explicit`ly."""
        spark = lake.spark
        touched = (
            changed_items(lake, log_items, changed, folded)
            if changed
            else spark.createDataFrame([], _TOUCHED)
        )
        if explicit:
            asked = [(m, int(b)) for m, b in explicit.items()]
            touched = touched.unionByName(spark.createDataFrame(asked, _TOUCHED))
        return cls(rewind_points(versions, touched), changed, changed_keys)

    def step_items(self, log_items: DataFrame, new_items: DataFrame) -> DataFrame:
        """The step's rows: those of the new batches of masters not rewound, every item of a
        rewound master from its point on (new batches included), and the message-level rows
        (invalid messages) of the changed batches."""
        refold = (
            log_items.where(F.col("status") == "item")
            .alias("t")
            .join(self.points.alias("p"), "master_id")
            .where(after_point("t", "p"))
            .select("t.*")
        )
        changed_rows = log_items.where(
            F.col("batch_key").isin(self.changed_keys) & (F.col("status") != "item")
        )
        return (
            new_items.join(self.ids, "master_id", "left_anti")
            .unionByName(refold)
            .unionByName(changed_rows)
        )

    def starting_states(self, documents: DataFrame) -> DataFrame:
        """master_documents (committed) with each rewound master at its point instead: its
        version before the change, neither stale nor filtered, or no state at all."""
        return documents.join(self.ids, "master_id", "left_anti").unionByName(
            self.points.where("version IS NOT NULL").select(
                "master_id",
                "version",
                "document",
                F.lit(False).alias("stale"),
                F.lit(False).alias("filtered"),
                F.lit(0).cast("long").alias("fold_step"),
            )
        )

    def with_tombstones(self, states: DataFrame, documents: DataFrame, step: Column) -> DataFrame:
        """The step's `state` rows of the fold, plus a tombstone (no document, not stale, not
        filtered) for every rewound master that existed and no longer does, so the model drops
        its rows; readers treat it as absent. Materialized."""
        existing = documents.select("master_id")
        nulls = [F.lit(None).cast(f.dataType).alias(f.name) for f in FOLD_OUT_SCHEMA.fields[3:11]]
        tombstones = (
            self.ids.join(existing, "master_id", "left_semi")
            .join(states.select("master_id"), "master_id", "left_anti")
            .select(
                F.lit(STATE).alias("kind"),
                "master_id",
                F.lit(0).alias("version"),
                *nulls,
                F.lit(False).alias("stale"),
                F.lit(False).alias("filtered"),
                F.lit(None).cast("long").alias("batch_seq"),
                F.lit(None).cast("int").alias("msg_seq"),
                F.lit(None).cast("int").alias("priority_class"),
                step.alias("fold_step"),
            )
        )
        return states.unionByName(tombstones).localCheckpoint()

    def delete_replaced_rows(self, lake: Lake) -> None:
        """Delete the rewound masters' rows from their point on, and the message-level rows of
        changed batches: this step writes them again (before its commit: `recover` undoes
        this)."""
        source = kill_during_write(self.points, "write.rewind")  # test hook: dies mid-delete
        condition = f"t.master_id = s.master_id AND {after_point('t', 's')}"
        for table in (MASTER_VERSIONS, MESSAGE_OUTCOMES, DEAD_LETTERS):
            lake.delete_matching(table, source, condition)
        if self.changed:
            seqs = sql_in("batch_seq", self.changed)
            for table in (MESSAGE_OUTCOMES, DEAD_LETTERS):
                lake.delete(table, f"master_id IS NULL AND {seqs}")
        crash_point("fold.after_rewind")
