"""The message log's hash chain and its anchors, on a real landing zone (no Spark)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from datetime import UTC, datetime

import pytest

from sis_platform.landing import GENESIS_LINK, LandingZone, MovedAside
from sis_platform.logchain import (
    Anchor,
    ChainRecord,
    chain_link,
    encode,
    verify_messages,
)
from sis_platform.queues.base import ReceivedMessage, new_message_id

T0 = datetime(2026, 11, 21, 14, 30, tzinfo=UTC)
RECORD = ChainRecord(
    batch_seq=3,
    msg_seq=7,
    message_id="ID:" + "ab" * 24,
    put_time_us=1_700_000_000_000_000,
    received_at_us=1_700_000_001_000_000,
    delivery_count=1,
    properties_json='{"a": 1}',
    body_size=12,
    body_sha256=hashlib.sha256(b"<m n='1'/>  ").hexdigest(),
    body_location=None,
)
CHANGED = {
    "batch_seq": 4,
    "msg_seq": 8,
    "message_id": "ID:" + "ac" * 24,
    "put_time_us": None,
    "received_at_us": 1_700_000_001_000_001,
    "delivery_count": 2,
    "properties_json": None,
    "body_size": 13,
    "body_sha256": hashlib.sha256(b"other").hexdigest(),
    "body_location": "overflow/x.body",
}


def _messages(n: int, start: int = 0) -> list[ReceivedMessage]:
    return [
        ReceivedMessage(
            new_message_id(),
            f"<m n='{start + i}'/>".encode(),
            T0,
            1 + (i % 2),
            {"JMSXGroupID": "g"} if i % 3 == 0 else {},
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("field", sorted(CHANGED))
def test_changing_any_logged_field_changes_the_link(field):
    changed = dataclasses.replace(RECORD, **{field: CHANGED[field]})
    assert chain_link(GENESIS_LINK, changed) != chain_link(GENESIS_LINK, RECORD)


def test_the_encoding_keeps_fields_apart_and_null_apart_from_empty():
    split_a = dataclasses.replace(RECORD, message_id="ab", properties_json="c")
    split_b = dataclasses.replace(RECORD, message_id="a", properties_json="bc")
    assert encode(split_a) != encode(split_b)
    assert encode(dataclasses.replace(RECORD, properties_json=None)) != encode(
        dataclasses.replace(RECORD, properties_json="")
    )


def test_each_batch_is_anchored_in_its_file_and_in_an_append_only_anchor_file(tmp_path):
    zone = LandingZone(tmp_path)
    first = zone.land(_messages(2))
    second = zone.land(_messages(3, 2))
    a1, a2 = zone.anchors.read(first.key), zone.anchors.read(second.key)
    assert a1 == Anchor(first.key, 2, GENESIS_LINK.hex(), first.last_link)
    assert a2 == Anchor(second.key, 3, first.last_link, second.last_link)
    assert zone.anchor_from_file(first.key) == a1 and zone.anchor_from_file(second.key) == a2
    assert stat.S_IMODE(os.stat(zone.anchors.path(first.key)).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(first.path).st_mode) == 0o600
    with pytest.raises(FileExistsError):
        zone.anchors.write(dataclasses.replace(a1, head=GENESIS_LINK.hex()))
    assert zone.anchors.read(first.key) == a1


def test_a_batch_whose_file_was_removed_keeps_its_number_and_head(tmp_path):
    zone = LandingZone(tmp_path)
    zone.land(_messages(1))
    removed = zone.land(_messages(2, 1))
    removed.path.unlink()
    after = zone.land(_messages(1, 3))
    assert after.seq == 3
    assert zone.anchors.read(after.key).first_prev == removed.last_link


def test_a_missing_anchor_is_restored_from_the_landing_files_metadata(tmp_path):
    zone = LandingZone(tmp_path)
    batch = zone.land(_messages(2))
    anchor = zone.anchors.read(batch.key)
    zone.anchors.path(batch.key).unlink()  # a crash between the claim and the anchor
    assert zone.ensure_anchor(batch.key) == anchor
    assert zone.anchors.read(batch.key) == anchor


def test_a_moved_aside_body_is_logged_by_size_digest_and_location(tmp_path):
    zone = LandingZone(tmp_path)
    big = b"<m>" + b"x" * 5000 + b"</m>"
    message = _messages(1)[0]
    aside = zone.move_aside(big)
    batch = zone.land([MovedAside(dataclasses.replace(message, body=b""), aside), *_messages(1)])
    row = zone.read(batch.key).to_pylist()[0]
    assert (row["body"], row["body_size"], row["body_sha256"], row["body_location"]) == (
        b"",
        len(big),
        hashlib.sha256(big).hexdigest(),
        aside.location,
    )
    overflow = tmp_path / aside.location
    assert overflow.read_bytes() == big
    assert overflow.parent == zone.overflow_dir
    assert stat.S_IMODE(os.stat(overflow).st_mode) == 0o600
    assert batch.bytes == len(_messages(1)[0].body)  # the moved-aside body is not in the batch
    report = verify_messages(
        batch.key,
        zone.stored_messages(batch.key),
        first_prev=GENESIS_LINK.hex(),
        source="landing file",
        anchor=zone.anchors.read(batch.key),
    )
    assert report.intact, report.problems

    overflow.write_bytes(big + b"!")
    report = verify_messages(
        batch.key,
        zone.stored_messages(batch.key),
        first_prev=GENESIS_LINK.hex(),
        source="landing file",
        anchor=zone.anchors.read(batch.key),
    )
    assert [p.message_id for p in report.problems] == [message.message_id]


def test_verifying_a_landing_file_names_each_kind_of_damage(tmp_path):
    zone = LandingZone(tmp_path)
    batch = zone.land(_messages(4))
    anchor = zone.anchors.read(batch.key)
    stored = list(zone.stored_messages(batch.key))

    def problems(messages):
        report = verify_messages(
            batch.key, messages, first_prev=GENESIS_LINK.hex(), source="test", anchor=anchor
        )
        return [(p.msg_seq, p.text.split(" (")[0]) for p in report.problems]

    assert problems(stored) == []
    changed = dataclasses.replace(
        stored[1], record=dataclasses.replace(stored[1].record, delivery_count=9)
    )
    assert problems([stored[0], changed, *stored[2:]]) == [
        (1, "its link does not match its fields")
    ]
    assert (2, "at position 1: a message was deleted, inserted or moved") in problems(
        [stored[0], *stored[2:]]
    )
    assert problems(stored[:3])[-1][1].startswith("the last link")
