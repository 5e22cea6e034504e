"""Exactly once (docs/design.md invariant 2): which messages of a fold step are duplicates.

The rule is sis_platform/domain/dedup.py's, which sis-live applies too: a copy is a duplicate
when the nearest earlier copy of its id in landing order (batch, then message), in the same step
or in a batch folded before, lies within the dedup window before it (SIS_DEDUP_WINDOW_BATCHES).
It is decided afresh for every message the step emits rows for, rewinds included.

One algorithm serves both a plain step and a rewind. The copies of a step's message ids are the
step's own messages and those already folded; every folded message has at least one row in
message_outcomes carrying its (batch_seq, msg_seq) (a valid message lists at least one master
id, so it has an item and each item an outcome; an invalid or duplicate message has its
message-level row). So ordering the step's messages together with the outcome rows of the same
ids, read at the version pinned before the step writes (a rewind deletes some of them), gives
each copy the same nearest earlier copy as ordering every copy in message_items, without
reading the whole log.

Only the window's batches of message_outcomes are read, from the window of the step's first
batch on: a literal bound on batch_seq, by which Delta skips the files before it (the table is
appended in batch order), so what a step reads does not grow with the lake's age. Only the
step's own ids are looked up there: broadcast, they filter the outcomes' message_id column where
it lies. A step catching up on many batches (after a missing one arrived), or refolding rewound
masters' items of earlier batches, may hold too many ids to broadcast: Spark plans that join.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import Window
from pyspark.sql import functions as F

from sis_platform.domain.dedup import DedupWindow

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# The most message ids a step broadcasts to look up in message_outcomes: ~40 MB of ids, a few
# batches' worth (SIS_BATCH_MAX_MESSAGES, 50,000 by default), well inside a 1.5 GiB driver.
BROADCAST_STEP_IDS_MAX = 500_000

COPY = ("message_id", "batch_seq", "msg_seq")


def duplicate_keys(
    items: DataFrame,
    outcomes: DataFrame,
    *,
    step_messages: int | None,
    window: DedupWindow,
    first_batch: int | None,
) -> DataFrame:
    """(batch_seq, msg_seq, duplicate = true) of every message among `items` (rows with
    message_id, batch_seq and msg_seq) whose nearest earlier copy is within `window`.
    `outcomes`: message_outcomes as committed before the step. `step_messages`: how many
    messages the step holds, when known without a job (None: unknown, never broadcast).
    `first_batch`: the lowest batch among `items`, when known without a job (None: one job
    finds it)."""
    messages = items.select(*COPY).distinct()
    step_ids = messages.select("message_id").distinct()
    if step_messages is not None and step_messages <= BROADCAST_STEP_IDS_MAX:
        step_ids = F.broadcast(step_ids)
    folded = outcomes.select(*COPY)
    if window.bounded:
        if first_batch is None:
            lowest = items.agg(F.min("batch_seq")).first()
            first_batch = int(lowest[0]) if lowest is not None and lowest[0] is not None else 0
        folded = folded.where(F.col("batch_seq") >= F.lit(window.oldest(first_batch)))
    folded = folded.join(step_ids, "message_id", "left_semi")
    in_log_order = Window.partitionBy("message_id").orderBy("batch_seq", "msg_seq")
    copies = (
        messages.unionByName(folded)
        .distinct()
        .withColumn("earlier", F.lag("batch_seq").over(in_log_order))
    )
    duplicate = F.col("earlier").isNotNull()
    if window.bounded:
        duplicate &= F.col("earlier") >= F.col("batch_seq") - F.lit(window.batches)
    return (
        copies.where(duplicate).select("batch_seq", "msg_seq").withColumn("duplicate", F.lit(True))
    )


def tag_duplicates(
    items: DataFrame,
    outcomes: DataFrame,
    *,
    step_messages: int | None,
    window: DedupWindow,
    first_batch: int | None,
) -> DataFrame:
    """`items` with a `duplicate` column (true, or null for a first copy), materialized once
    (localCheckpoint): every output of the step derives from it."""
    duplicates = duplicate_keys(
        items, outcomes, step_messages=step_messages, window=window, first_batch=first_batch
    )
    return items.join(duplicates, ["batch_seq", "msg_seq"], "left").localCheckpoint()
