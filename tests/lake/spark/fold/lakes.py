"""Small Delta lakes for the fold's unit tests: batches logged straight into raw_messages,
message_items and batch_log (classified by the domain's `classify_message`, as the message_items
asset does, without Dagster, a landing zone or the hash chain)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import SparkSession

from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.domain.pipeline import LoggedMessage, classify_message
from sis_platform.lake.delta import Lake
from sis_platform.lake.tables import BATCH_LOG, MESSAGE_ITEMS, RAW_MESSAGES
from sis_platform.log.landing import batch_key
from sis_platform.queues.base import new_message_id

NOW = datetime(2026, 11, 21, 12, tzinfo=UTC)


def new_lake(spark: SparkSession, tmp_path: Path) -> Lake:
    return Lake(spark, str(tmp_path / "lake"))


def message(body: bytes, message_id: str | None = None, delivery_count: int = 1) -> LoggedMessage:
    return LoggedMessage(message_id or new_message_id(), body, delivery_count)


def _item_rows(seq: int, messages: list[LoggedMessage], limits: Limits) -> list[tuple]:
    key = batch_key(seq)
    rows: list[tuple] = []
    for msg_seq, m in enumerate(messages):
        head = (key, seq, msg_seq, m.message_id, m.delivery_count)
        classified = classify_message(m, limits=limits)
        if isinstance(classified, list):
            rows += [
                (*head, "item", i.position, i.master_id, i.category, i.type, i.payload, None, None)
                for i in classified
            ]
        else:
            reason = str(classified.reason)
            rows.append((*head, "invalid", None, None, None, None, None, reason, classified.detail))
    return rows


def log_batch(
    lake: Lake, seq: int, messages: list[LoggedMessage], *, limits: Limits = DEFAULT_LIMITS
) -> None:
    """Write (or rewrite) batch `seq`: its raw_messages once, its message_items as classified
    under `limits`, then its batch_log row with a digest of those items."""
    spark = lake.spark
    key = batch_key(seq)
    lake.ensure(RAW_MESSAGES, MESSAGE_ITEMS, BATCH_LOG)
    where = f"batch_key = '{key}'"
    if lake.read(RAW_MESSAGES).where(where).isEmpty():
        raw = [
            (key, seq, i, m.message_id, NOW, NOW, m.delivery_count, None, m.body)
            + (hashlib.sha256(m.body).hexdigest(), len(m.body), None, "0" * 64, "0" * 64)
            for i, m in enumerate(messages)
        ]
        lake.append(RAW_MESSAGES, spark.createDataFrame(raw, RAW_MESSAGES.schema()))
    items = _item_rows(seq, messages, limits)
    lake.replace_where(MESSAGE_ITEMS, spark.createDataFrame(items, MESSAGE_ITEMS.schema()), where)
    digest = hashlib.sha256(repr(sorted(items, key=repr)).encode()).hexdigest()
    invalid = sum(1 for r in items if r[5] == "invalid")
    log = (key, seq, len(messages), len(items) - invalid, invalid, digest, NOW, None)
    lake.merge_rows(
        BATCH_LOG, spark.createDataFrame([log], BATCH_LOG.schema()), keys=("batch_key",)
    )
