"""Exactly once (docs/design.md invariant 2): which messages of a fold step are duplicates.

The first copy of a message id in landing order (batch, then message) counts; every later copy,
in the same step or in a batch folded before, ends `duplicate`. It is a fact of the whole log,
decided afresh for every message the step emits rows for, rewinds included.

One algorithm serves both a plain step and a rewind. The copies of a step's message ids are the
step's own messages and those already folded; every folded message has at least one row in
message_outcomes carrying its (batch_seq, msg_seq) (a valid message lists at least one master
id, so it has an item and each item an outcome; an invalid or duplicate message has its
message-level row). So ranking the step's messages together with the outcome rows of the same
ids, read at the version pinned before the step writes (a rewind deletes some of them), gives
the same first copy as ranking every copy in message_items, without reading the whole log.

Only the step's own ids are looked up in the history: broadcast, they filter the outcomes'
message_id column where it lies. A distinct of every id ever logged was a shuffle of the whole
history per step, a cost that grew with the lake. A step catching up on many batches (after a
missing one arrived), or refolding rewound masters' items of earlier batches, may hold too many ids
to broadcast: Spark plans that join.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import Window
from pyspark.sql import functions as F

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# The most message ids a step broadcasts to look up in message_outcomes: ~40 MB of ids, a few
# batches' worth (SIS_BATCH_MAX_MESSAGES, 50,000 by default), well inside a 1.5 GiB driver.
BROADCAST_STEP_IDS_MAX = 500_000

COPY = ("message_id", "batch_seq", "msg_seq")


def duplicate_keys(
    items: DataFrame, outcomes: DataFrame, *, step_messages: int | None
) -> DataFrame:
    """(batch_seq, msg_seq, duplicate = true) of every message among `items` (rows with
    message_id, batch_seq and msg_seq) that is not its id's first copy. `outcomes`:
    message_outcomes as committed before the step. `step_messages`: how many messages the step
    holds, when known without a job (None: unknown, never broadcast)."""
    messages = items.select(*COPY).distinct()
    step_ids = messages.select("message_id").distinct()
    if step_messages is not None and step_messages <= BROADCAST_STEP_IDS_MAX:
        step_ids = F.broadcast(step_ids)
    folded = outcomes.select(*COPY).join(step_ids, "message_id", "left_semi")
    first_copy = Window.partitionBy("message_id").orderBy("batch_seq", "msg_seq")
    ranked = (
        messages.unionByName(folded).distinct().withColumn("copy", F.row_number().over(first_copy))
    )
    return (
        ranked.where("copy > 1").select("batch_seq", "msg_seq").withColumn("duplicate", F.lit(True))
    )


def tag_duplicates(
    items: DataFrame, outcomes: DataFrame, *, step_messages: int | None
) -> DataFrame:
    """`items` with a `duplicate` column (true, or null for a first copy), materialized once
    (localCheckpoint): every output of the step derives from it."""
    duplicates = duplicate_keys(items, outcomes, step_messages=step_messages)
    return items.join(duplicates, ["batch_seq", "msg_seq"], "left").localCheckpoint()
