"""A batch's items summary (sis_platform/lake/spark/items.py, `items_summary`): its counts, and a
digest that is a fixed function of the items in feed order. batch_log keeps the digest of every
folded batch and the fold rewinds a batch whose digest changed, so the digest of the same items
must not change with how Spark happens to partition or order them."""

from __future__ import annotations

import hashlib

import pytest

from sis_platform.lake.spark.items import items_summary
from sis_platform.lake.tables import MESSAGE_ITEMS

pytestmark = [pytest.mark.spark, pytest.mark.cost(10)]


def _item(msg_seq: int, position: int, master_id: str, payload: bytes) -> dict[str, object]:
    return {
        "msg_seq": msg_seq,
        "message_id": f"ID:{msg_seq:048x}",
        "status": "item",
        "position": position,
        "master_id": master_id,
        "category": "update",
        "type": None,
        "payload": payload,
        "reason": None,
        "detail": None,
    }


def _invalid(msg_seq: int, reason: str) -> dict[str, object]:
    return {
        "msg_seq": msg_seq,
        "message_id": f"ID:{msg_seq:048x}",
        "status": "invalid",
        "position": None,
        "master_id": None,
        "category": None,
        "type": None,
        "payload": None,
        "reason": reason,
        "detail": "why",
    }


# Feed order: message 1 (two items), 2 (invalid), 3 (one item), 4 (invalid), 5 (three items).
FEED = [
    _item(1, 0, "A", b"<a/>"),
    _item(1, 1, "B", b"<b/>"),
    _invalid(2, "not-well-formed"),
    _item(3, 0, "A", b"<c/>"),
    _invalid(4, "invalid-schema"),
    _item(5, 0, "C", b"<d/>"),
    _item(5, 1, "A", b"<e/>"),
    _item(5, 2, "B", b"<f/>"),
]


def _expected_digest(rows: list[dict[str, object]]) -> str:
    """The digest as defined: sha256 over each row's sha256 (of its fields joined by U+001F,
    nulls as empty, the payload by its sha256), rows in feed order."""
    digest = hashlib.sha256()
    for r in rows:
        payload = r["payload"]
        fields = [
            str(r["msg_seq"]),
            "" if r["position"] is None else str(r["position"]),
            str(r["message_id"]),
            str(r["status"]),
            str(r["master_id"] or ""),
            str(r["category"] or ""),
            str(r["type"] or ""),
            hashlib.sha256(payload).hexdigest() if isinstance(payload, bytes) else "",
            str(r["reason"] or ""),
        ]
        digest.update(hashlib.sha256("\x1f".join(fields).encode()).digest())
    return digest.hexdigest()


def _frame(spark, rows: list[dict[str, object]], partitions: int):
    full = [
        MESSAGE_ITEMS.row(batch_key="0000000001", batch_seq=1, delivery_count=1, **r) for r in rows
    ]
    return spark.createDataFrame(full, MESSAGE_ITEMS.schema()).repartition(partitions)


@pytest.mark.parametrize("partitions", [1, 3])
def test_the_digest_is_of_the_items_in_feed_order_however_spark_holds_them(spark, partitions):
    shuffled = [FEED[i] for i in (7, 2, 0, 5, 3, 1, 6, 4)]

    summary = items_summary(_frame(spark, shuffled, partitions))

    assert summary.digest == _expected_digest(FEED)
    assert summary.messages == 5
    assert summary.items == 6
    assert summary.invalid_by_reason == {"not-well-formed": 1, "invalid-schema": 1}


def test_the_digest_changes_when_an_item_changes(spark):
    changed = [*FEED[:3], _item(3, 0, "A", b"<c changed='1'/>"), *FEED[4:]]

    assert items_summary(_frame(spark, changed, 1)).digest != _expected_digest(FEED)
