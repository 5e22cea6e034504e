"""message_items: parse, validate and split one batch of the message log, on Spark executors.

Each raw message goes through the domain's `classify_message` (the same function the reference
pipeline uses), so Spark and the reference agree by construction on what a message means; what
Spark adds is running it in parallel, next to the data.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sis_platform.domain.limits import Limits
from sis_platform.lake.tables import BATCH_LOG, MESSAGE_ITEMS, RAW_MESSAGES
from sis_platform.landing import batch_seq_of
from sis_platform.spark.arrow import record_batches

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from sis_platform.lake.delta import Lake


def _classify_batches(
    batches: Iterator[pa.RecordBatch], *, limits: Limits, redelivery_limit: int
) -> Iterator[pa.RecordBatch]:
    """Raw message rows to message_items rows, Arrow batches both ways (`mapInArrow`): no
    pandas frame per batch, and the bodies reach `classify_message` as the bytes Arrow holds."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from sis_platform.domain.pipeline import DeadLetter, LoggedMessage, classify_message

    schema = to_arrow_schema(MESSAGE_ITEMS.schema())
    for batch in batches:
        rows: list[tuple[object, ...]] = []
        columns = batch.to_pydict()
        for key, batch_seq, msg_seq, message_id, delivery_count, body, size, location in zip(
            columns["batch_key"], columns["batch_seq"], columns["msg_seq"],
            columns["message_id"], columns["delivery_count"], columns["body"],
            columns["body_size"], columns["body_location"], strict=True,
        ):
            base = (key, batch_seq, msg_seq, message_id, delivery_count)
            outcome = classify_message(
                LoggedMessage(message_id, body, delivery_count, size, location),
                limits=limits,
                redelivery_limit=redelivery_limit,
            )
            if isinstance(outcome, DeadLetter):
                rows.append(
                    (*base, "invalid", None, None, None, None, None, str(outcome.reason),
                     outcome.detail)
                )
            else:
                for item in outcome:
                    rows.append(
                        (*base, "item", item.position, item.master_id, item.category, item.type,
                         item.payload, None, None)
                    )
        yield from record_batches(rows, schema)


def classify_batch(raw: DataFrame, *, limits: Limits, redelivery_limit: int) -> DataFrame:
    """Raw message rows (one batch) to message_items rows."""
    from functools import partial

    return raw.select(
        "batch_key", "batch_seq", "msg_seq", "message_id", "delivery_count", "body",
        "body_size", "body_location",
    ).mapInArrow(
        partial(_classify_batches, limits=limits, redelivery_limit=redelivery_limit),
        schema=MESSAGE_ITEMS.schema(),
    )


@dataclass(frozen=True)
class ItemsSummary:
    digest: str
    messages: int
    items: int
    invalid_by_reason: dict[str, int]


def items_summary(items: DataFrame) -> ItemsSummary:
    """Counts and a digest of a batch's items in feed order, in one pass over the batch. The
    fold records the digest of what it folded, so a batch re-materialized with different
    content (a backfill after a fix) is noticed."""
    from pyspark.sql import functions as F

    row_hash = F.sha2(
        F.concat_ws(
            "\x1f",
            F.col("msg_seq").cast("string"),
            F.coalesce(F.col("position").cast("string"), F.lit("")),
            F.col("message_id"),
            F.col("status"),
            F.coalesce(F.col("master_id"), F.lit("")),
            F.coalesce(F.col("category"), F.lit("")),
            F.coalesce(F.col("type"), F.lit("")),
            F.coalesce(F.sha2(F.col("payload"), 256), F.lit("")),
            F.coalesce(F.col("reason"), F.lit("")),
        ),
        256,
    )
    # One batch's rows (bounded by the batch bounds) come to the driver as one Arrow table, in
    # feed order: no Row object per item.
    rows = (
        items.select(row_hash.alias("h"), "msg_seq", "position", "status", "reason")
        .orderBy("msg_seq", "position")
        .toArrow()
    )
    digest = hashlib.sha256()
    for h in rows.column("h").to_pylist():
        digest.update(bytes.fromhex(h))
    messages = set(rows.column("msg_seq").to_pylist())
    n_items = 0
    invalid: Counter[str] = Counter()
    for status, reason in zip(
        rows.column("status").to_pylist(), rows.column("reason").to_pylist(), strict=True
    ):
        if status == "item":
            n_items += 1
        else:
            invalid[str(reason)] += 1
    return ItemsSummary(digest.hexdigest(), len(messages), n_items, dict(invalid))


def batch_condition(key: str) -> str:
    batch_seq_of(key)  # validates: partition keys are ten digits, safe to inline in SQL
    return f"batch_key = '{key}'"


def log_items(
    lake: Lake, key: str, *, limits: Limits, redelivery_limit: int, run_id: str | None
) -> ItemsSummary:
    """(Re)write one batch's message_items from its raw_messages, then its batch_log row (in
    that order: the fold reads batch_log's version first, see spark/fold.py)."""
    from datetime import UTC, datetime

    lake.ensure(MESSAGE_ITEMS, BATCH_LOG)
    where = batch_condition(key)
    raw = lake.read(RAW_MESSAGES).where(where)
    items = classify_batch(raw, limits=limits, redelivery_limit=redelivery_limit)
    lake.replace_where(MESSAGE_ITEMS, items, where)

    summary = items_summary(lake.read(MESSAGE_ITEMS).where(where))
    log_row = lake.spark.createDataFrame(
        [(key, batch_seq_of(key), summary.messages, summary.items,
          sum(summary.invalid_by_reason.values()), summary.digest, datetime.now(UTC), run_id)],
        BATCH_LOG.schema(),
    )
    lake.merge_rows(BATCH_LOG, log_row, keys=("batch_key",))
    return summary
