"""The step's masters' home blocks: which partitions of master_documents (and of the model's
tables) hold them, so the step reads, merges and hands on those partitions only.

A master's home is the block of batches in which the fold first gave it a state (lake/tables.py,
FIRST_BLOCK), recorded in master_index when that step writes the master and never changed. A
master the index does not name is new: its home is the block of its first item in the step. The
index is two narrow columns, one row per master ever folded (about a million after a year of the
feed, a few MB), read with the step's ids broadcast; the documents are read from their homes'
partitions only, a few blocks' races instead of every race the lake has kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from sis_platform.lake.delta import sql_in
from sis_platform.lake.tables import BATCHES_PER_BLOCK, FIRST_BLOCK, MASTER_INDEX

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from sis_platform.lake.delta import Lake


def blocks_condition(blocks: tuple[int, ...], alias: str | None = None) -> str:
    """A SQL condition selecting the partitions of `blocks` (none: false), with literals, so
    that Delta prunes the others before it lists a file of them."""
    return sql_in(f"{alias}.{FIRST_BLOCK}" if alias else FIRST_BLOCK, blocks)


@dataclass(frozen=True)
class Homes:
    """Every master of the step with its home block, and whether the index names it yet."""

    rows: DataFrame  # master_id, first_block, new (materialized)
    blocks: tuple[int, ...]  # the distinct home blocks of the step's masters

    @classmethod
    def find(cls, lake: Lake, masters: DataFrame, *, index_version: int) -> Homes:
        """The homes of `masters` (master_id, first_seq: the batch of its first item in the
        step, null when it has none), from master_index as of `index_version`."""
        wanted = F.broadcast(masters.select("master_id").distinct())
        known = (
            lake.read(MASTER_INDEX, version=index_version)
            .join(wanted, "master_id", "left_semi")
            .groupBy("master_id")
            .agg(F.min(FIRST_BLOCK).alias("known_block"))
        )
        rows = (
            masters.groupBy("master_id")
            .agg(F.min("first_seq").alias("first_seq"))
            .join(known, "master_id", "left")
            .select(
                "master_id",
                F.coalesce(F.col("known_block"), F.floor(F.col("first_seq") / BATCHES_PER_BLOCK))
                .cast("long")
                .alias(FIRST_BLOCK),
                F.col("known_block").isNull().alias("new"),
            )
            .where(F.col(FIRST_BLOCK).isNotNull())
            .localCheckpoint()
        )
        blocks = tuple(
            sorted(int(r[FIRST_BLOCK]) for r in rows.select(FIRST_BLOCK).distinct().collect())
        )
        return cls(rows, blocks)

    def documents(self, documents: DataFrame) -> DataFrame:
        """The rows of master_documents in the step's masters' partitions."""
        return documents.where(blocks_condition(self.blocks))

    def placed(self, states: DataFrame) -> DataFrame:
        """`states` (rows of the step's masters) with each master's home block. A left join: a
        state without a home (a bug) is refused by the NOT NULL column, never dropped."""
        return states.drop(FIRST_BLOCK).join(
            F.broadcast(self.rows.select("master_id", FIRST_BLOCK)), "master_id", "left"
        )

    def index_rows(self, states: DataFrame, step: Column) -> DataFrame:
        """master_index rows for the masters the step gives their first state."""
        return (
            self.rows.where("new")
            .join(states.select("master_id"), "master_id", "left_semi")
            .select("master_id", FIRST_BLOCK, step.alias("fold_step"))
        )
