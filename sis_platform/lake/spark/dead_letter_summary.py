"""The dead letters by reason: how many, and the latest of each, for an operator's first look.

`dead_letter_summary(lake, committed_step)` aggregates the `dead_letters` rows of committed fold
steps (an interrupted step's rows are not counted, as everywhere else) in one query: per reason
the count, and the latest dead letter's time, message id, master id and detail. The fold's asset
shows it as a table on each materialization of `dead_letters` (assets/masters.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from sis_platform.lake.tables import DEAD_LETTERS
from sis_platform.lake.trace import spark_utc

if TYPE_CHECKING:
    from sis_platform.lake.delta import Lake


@dataclass(frozen=True)
class ReasonSummary:
    """The dead letters of one reason code."""

    reason: str
    count: int
    latest_at: datetime
    latest_message_id: str
    latest_master_id: str | None  # None: the whole message was dead-lettered
    latest_detail: str | None


def dead_letter_summary(lake: Lake, committed_step: int) -> list[ReasonSummary]:
    """Per reason, most frequent first (then by name)."""
    if not lake.exists(DEAD_LETTERS):
        return []
    latest = F.struct("dead_lettered_at", "batch_seq", "msg_seq", "position")
    rows = (
        lake.read(DEAD_LETTERS)
        .where(F.col("fold_step") <= F.lit(committed_step))
        .groupBy("reason")
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.max("dead_lettered_at").alias("latest_at"),
            F.max_by("message_id", latest).alias("message_id"),
            F.max_by("master_id", latest).alias("master_id"),
            F.max_by("detail", latest).alias("detail"),
        )
        .collect()
    )
    summaries = [
        ReasonSummary(
            reason=str(r["reason"]),
            count=int(r["count"]),
            latest_at=spark_utc(r["latest_at"]),
            latest_message_id=str(r["message_id"]),
            latest_master_id=r["master_id"],
            latest_detail=r["detail"],
        )
        for r in rows
    ]
    return sorted(summaries, key=lambda s: (-s.count, s.reason))
