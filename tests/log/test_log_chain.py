"""The message log's hash chain and its anchors, on a real landing zone (no Spark)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from datetime import UTC, datetime

import pytest

from sis_platform.log.chain import (
    Anchor,
    ChainRecord,
    chain_link,
    encode,
    verify_messages,
)
from sis_platform.log.landing import GENESIS_LINK, LandingZone, MovedAside
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
    first = zone.writer.land(_messages(2))
    second = zone.writer.land(_messages(3, 2))
    a1, a2 = zone.catalog.anchors.read(first.key), zone.catalog.anchors.read(second.key)
    assert a1 == Anchor(first.key, 2, GENESIS_LINK.hex(), first.last_link)
    assert a2 == Anchor(second.key, 3, first.last_link, second.last_link)
    assert (
        zone.catalog.anchor_from_file(first.key) == a1
        and zone.catalog.anchor_from_file(second.key) == a2
    )
    assert stat.S_IMODE(os.stat(zone.catalog.anchors.path(first.key)).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(first.path).st_mode) == 0o600
    with pytest.raises(FileExistsError):
        zone.catalog.anchors.write(dataclasses.replace(a1, head=GENESIS_LINK.hex()))
    assert zone.catalog.anchors.read(first.key) == a1


def test_a_batch_whose_file_was_removed_keeps_its_number_and_head(tmp_path):
    zone = LandingZone(tmp_path)
    zone.writer.land(_messages(1))
    removed = zone.writer.land(_messages(2, 1))
    removed.path.unlink()
    after = zone.writer.land(_messages(1, 3))
    assert after.seq == 3
    assert zone.catalog.anchors.read(after.key).first_prev == removed.last_link


def test_a_missing_anchor_is_restored_from_the_landing_files_metadata(tmp_path):
    zone = LandingZone(tmp_path)
    batch = zone.writer.land(_messages(2))
    anchor = zone.catalog.anchors.read(batch.key)
    zone.catalog.anchors.path(batch.key).unlink()  # a crash between the claim and the anchor
    assert zone.writer.ensure_anchor(batch.key) == anchor
    assert zone.catalog.anchors.read(batch.key) == anchor


def test_a_moved_aside_body_is_logged_by_size_digest_and_location(tmp_path):
    zone = LandingZone(tmp_path)
    big = b"<m>" + b"x" * 5000 + b"</m>"
    message = _messages(1)[0]
    aside = zone.writer.move_aside(big)
    batch = zone.writer.land(
        [MovedAside(dataclasses.replace(message, body=b""), aside), *_messages(1)]
    )
    row = zone.catalog.read(batch.key).to_pylist()[0]
    assert (row["body"], row["body_size"], row["body_sha256"], row["body_location"]) == (
        b"",
        len(big),
        hashlib.sha256(big).hexdigest(),
        aside.location,
    )
    overflow = tmp_path / aside.location
    assert overflow.read_bytes() == big
    assert overflow.parent == zone.catalog.overflow_dir
    assert stat.S_IMODE(os.stat(overflow).st_mode) == 0o600
    assert batch.bytes == len(_messages(1)[0].body)  # the moved-aside body is not in the batch
    report = verify_messages(
        batch.key,
        zone.catalog.stored_messages(batch.key),
        first_prev=GENESIS_LINK.hex(),
        source="landing file",
        anchor=zone.catalog.anchors.read(batch.key),
    )
    assert report.intact, report.problems

    overflow.write_bytes(big + b"!")
    report = verify_messages(
        batch.key,
        zone.catalog.stored_messages(batch.key),
        first_prev=GENESIS_LINK.hex(),
        source="landing file",
        anchor=zone.catalog.anchors.read(batch.key),
    )
    assert [p.message_id for p in report.problems] == [message.message_id]


def test_verifying_a_landing_file_names_each_kind_of_damage(tmp_path):
    zone = LandingZone(tmp_path)
    batch = zone.writer.land(_messages(4))
    anchor = zone.catalog.anchors.read(batch.key)
    stored = list(zone.catalog.stored_messages(batch.key))

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


# -- the log key and the witness (sis_platform/log/seal.py) -----------------------------------


def _sealed_zone(tmp_path, **variables):
    """The platform's own landing zone on `tmp_path / "data"`: signed and witnessed as
    configured (the default key file and witness under the session's config folder)."""
    from sis_platform.resources import config

    env = {"SIS_DATA_DIR": str(tmp_path / "data"), **variables}
    return config.resources(env)["landing"].zone()


def _edit_part(path, delivery_count: int) -> None:
    """Rewrite a landing part with its first row's delivery count changed, its metadata (the
    signed running anchor) kept: an edit of the open batch before it is sealed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    counts = table.column("delivery_count").to_pylist()
    counts[0] = delivery_count
    index = table.schema.get_field_index("delivery_count")
    pq.write_table(
        table.set_column(index, table.schema.field(index), pa.array(counts, pa.int32())), path
    )


def test_sealing_names_an_open_batch_edited_before_sealing_and_anchors_nothing(tmp_path):
    from sis_platform.log.landing import ClosedBy, GroupWriter

    zone = _sealed_zone(tmp_path)
    writer = GroupWriter(zone.writer)
    first = writer.land(_messages(2))
    writer.land(_messages(2, 2))
    _edit_part(first.path, 7)
    with pytest.raises(Exception, match=r"batch 0000000001: not sealed: .*edited before sealing"):
        writer.seal(ClosedBy.MESSAGES)
    assert zone.catalog.anchors.read("0000000001") is None
    with pytest.raises(Exception, match=r"batch 0000000001: not sealed"):
        GroupWriter(zone.writer).recover()  # nor after a restart
    assert zone.catalog.keys() == []


def test_sealing_names_a_removed_last_part_of_the_open_batch(tmp_path):
    from sis_platform.log.landing import ClosedBy, GroupWriter

    zone = _sealed_zone(tmp_path)
    writer = GroupWriter(zone.writer)
    writer.land(_messages(2))
    last = writer.land(_messages(2, 2))
    last.path.unlink()
    with pytest.raises(Exception, match=r"batch 0000000001: not sealed: .*a part was removed"):
        writer.seal(ClosedBy.MESSAGES)


def test_anchors_and_parts_are_signed_with_a_default_key_file_outside_the_data_folder(
    tmp_path, private_config_home
):
    from sis_platform.log.landing import ClosedBy, GroupWriter
    from sis_platform.log.landing.signed import signature_problems, tail_problems

    zone = _sealed_zone(tmp_path)
    batch = zone.writer.land(_messages(2))
    writer = GroupWriter(zone.writer)
    writer.land(_messages(1, 2))
    sealed = writer.seal(ClosedBy.DRAINED)
    key_file = private_config_home / "sis-platform" / "log.key"
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert not key_file.is_relative_to(tmp_path / "data")
    for key in (batch.key, sealed.key):
        anchor = zone.catalog.anchors.read(key)
        assert anchor.signature and anchor.key_id == zone.catalog.signer.log_key().key_id
        assert signature_problems(zone.catalog, key, anchor) == []
    assert (
        zone.catalog.signer.seal.witness.read().unsigned()
        == zone.catalog.anchors.read(sealed.key).unsigned()
    )
    assert tail_problems(zone.catalog) == []


def test_a_signed_batch_landed_in_groups_verifies_against_its_landing_files(tmp_path):
    """The last part's metadata carries the part's signature and the anchor the batch's: the
    two claims agree on the chain, and the batch is intact (what the lake's chain check and
    sis-verify-log read for every batch sis-live lands)."""
    from sis_platform.lake.spark.chain import verify_landing_file
    from sis_platform.log.landing import ClosedBy, GroupWriter

    zone = _sealed_zone(tmp_path)
    writer = GroupWriter(zone.writer)
    writer.land(_messages(2))
    writer.land(_messages(1, 2))
    sealed = writer.seal(ClosedBy.DRAINED)
    anchor = zone.catalog.anchors.read(sealed.key)
    assert verify_landing_file(zone, sealed.key, GENESIS_LINK.hex(), anchor) == []
    changed = dataclasses.replace(anchor, head="ab" * 32)
    assert [p.text for p in verify_landing_file(zone, sealed.key, anchor.first_prev, changed)][
        0
    ] == "its landing file's chain metadata differs from its anchor"


def test_a_consistent_rewrite_of_an_anchor_without_the_key_is_named(tmp_path):
    from sis_platform.log.landing.signed import signature_problems

    zone = _sealed_zone(tmp_path)
    batch = zone.writer.land(_messages(2))
    forged = dataclasses.replace(zone.catalog.anchors.read(batch.key), head="ab" * 32)
    zone.catalog.anchors.path(batch.key).unlink()
    zone.catalog.anchors.write(forged)
    (problem,) = signature_problems(zone.catalog, batch.key, zone.catalog.anchors.read(batch.key))
    assert "consistent rewrite without the log key" in problem.text
    unsigned = dataclasses.replace(forged, signature=None, key_id=None)
    (problem,) = signature_problems(zone.catalog, batch.key, unsigned)
    assert "unsigned" in problem.text


def test_deleting_the_last_batches_with_their_anchors_is_named_by_the_witness(tmp_path):
    from sis_platform.log.landing.signed import tail_problems

    zone = _sealed_zone(tmp_path)
    zone.writer.land(_messages(1))
    for batch in (zone.writer.land(_messages(1, 1)), zone.writer.land(_messages(1, 2))):
        batch.path.unlink()
        zone.catalog.anchors.path(batch.key).unlink()
    (problem,) = tail_problems(zone.catalog)
    assert problem.batch_key == "0000000003"
    assert "truncated or rolled back" in problem.text
    assert "its last anchored batch: 0000000001" in problem.text


def test_a_folder_restored_from_an_earlier_copy_is_named_and_never_sealed_over(tmp_path):
    import shutil

    from sis_platform.log.landing.signed import tail_problems

    zone = _sealed_zone(tmp_path)
    zone.writer.land(_messages(1))
    copy = tmp_path / "copy"
    shutil.copytree(zone.catalog.root, copy)
    zone.writer.land(_messages(2, 1))
    shutil.rmtree(zone.catalog.root)
    shutil.copytree(copy, zone.catalog.root)  # the whole folder rolled back
    assert "truncated or rolled back" in tail_problems(zone.catalog)[0].text
    with pytest.raises(Exception, match=r"batch 0000000002: not sealed: .*rolled back"):
        zone.writer.land(_messages(1, 9))
    assert zone.catalog.keys() == ["0000000001"]


def test_a_data_folder_removed_whole_starts_a_new_log_once_its_witness_is_retired(tmp_path):
    import shutil
    from datetime import UTC, datetime

    from sis_platform.log.landing.signed import retire_witness, tail_problems

    zone = _sealed_zone(tmp_path)
    zone.writer.land(_messages(1))
    zone.writer.land(_messages(2, 1))
    witness = zone.catalog.signer.seal.witness
    earlier = witness.read()
    shutil.rmtree(tmp_path / "data")  # removed on purpose, to start again
    zone = _sealed_zone(tmp_path)
    # The witness cannot tell this from a rollback, and says what to do in either case.
    with pytest.raises(Exception, match=r"batch 0000000001: not sealed: .*sis-live new-log"):
        zone.writer.land(_messages(1, 9))

    retired = retire_witness(zone.catalog, datetime(2026, 12, 5, 12, 0, 1, tzinfo=UTC))
    assert retired is not None and retired.witnessed == earlier
    assert retired.path.name == f"{witness.path.stem}.retired-20261205T120001Z.json"
    assert retired.path.parent == witness.path.parent and not witness.path.exists()
    batch = zone.writer.land(_messages(1, 9))
    assert batch.key == "0000000001"
    assert witness.read().unsigned() == zone.catalog.anchors.read(batch.key).unsigned()
    assert tail_problems(zone.catalog) == []
    # The new log removed in the same second: its witness retired beside the first one.
    shutil.rmtree(tmp_path / "data")
    again = retire_witness(
        _sealed_zone(tmp_path).catalog, datetime(2026, 12, 5, 12, 0, 1, tzinfo=UTC)
    )
    assert again is not None and again.path.name.endswith("-20261205T120001Z-2.json")
    assert retired.path.exists() and again.witnessed.batch_key == "0000000001"
    # Nothing left to retire for a zone with no witness.
    assert retire_witness(_sealed_zone(tmp_path).catalog, datetime.now(UTC)) is None


@pytest.mark.parametrize("left", ["a batch", "the open batch's part", "the expiry record"])
def test_the_witness_of_a_zone_that_still_holds_any_of_its_log_is_never_retired(tmp_path, left):
    from datetime import UTC, datetime

    from sis_platform.log.landing import GroupWriter
    from sis_platform.log.landing.expiry import expire_through
    from sis_platform.log.landing.signed import LogNotNew, retire_witness

    zone = _sealed_zone(tmp_path)
    first = zone.writer.land(_messages(1))
    second = zone.writer.land(_messages(1, 1))
    witness = zone.catalog.signer.seal.witness
    seen = witness.path.read_bytes()
    if left == "a batch":  # the tail truncated: what a rollback leaves
        second.path.unlink()
        zone.catalog.anchors.path(second.key).unlink()
    elif left == "the open batch's part":
        for batch in (first, second):
            batch.path.unlink()
            zone.catalog.anchors.path(batch.key).unlink()
        GroupWriter(zone.writer).land(_messages(1, 2))
    else:  # every batch expired: the record holds the log's head
        expire_through(zone.catalog, zone.catalog.anchors.read(second.key))
        assert zone.catalog.keys() == []
    with pytest.raises(LogNotNew, match=r"holds a log through batch 000000000[12]"):
        retire_witness(zone.catalog, datetime.now(UTC))
    assert witness.path.read_bytes() == seen
    assert list(witness.path.parent.glob(f"{witness.path.stem}.retired-*")) == []


def test_a_missing_or_wrong_key_is_an_error_not_a_pass(tmp_path):
    from sis_platform.log.landing.signed import signature_problems
    from sis_platform.log.seal import LogKeyError

    key_file = tmp_path / "keys" / "log.key"
    key_file.parent.mkdir()
    key_file.write_text("k" * 40)
    key_file.chmod(0o600)
    zone = _sealed_zone(tmp_path, SIS_LOG_KEY_FILE=str(key_file))
    batch = zone.writer.land(_messages(1))
    anchor = zone.catalog.anchors.read(batch.key)

    key_file.unlink()
    (problem,) = signature_problems(
        _sealed_zone(tmp_path, SIS_LOG_KEY_FILE=str(key_file)).catalog, batch.key, anchor
    )
    assert "the log key cannot be loaded" in problem.text and "does not exist" in problem.text
    with pytest.raises(LogKeyError, match="does not exist"):  # an explicit key file is never made
        _sealed_zone(tmp_path, SIS_LOG_KEY_FILE=str(key_file)).writer.land(_messages(1, 1))

    key_file.write_text("w" * 40)
    key_file.chmod(0o600)
    (problem,) = signature_problems(
        _sealed_zone(tmp_path, SIS_LOG_KEY_FILE=str(key_file)).catalog, batch.key, anchor
    )
    assert "not with the log key" in problem.text
    key_file.chmod(0o644)
    (problem,) = signature_problems(
        _sealed_zone(tmp_path, SIS_LOG_KEY_FILE=str(key_file)).catalog, batch.key, anchor
    )
    assert "readable by other users" in problem.text
    (problem,) = signature_problems(
        _sealed_zone(tmp_path, SIS_LOG_KEY="short").catalog, batch.key, anchor
    )
    assert "needs 32 or more" in problem.text
    (problem,) = signature_problems(LandingZone(zone.catalog.root).catalog, batch.key, anchor)
    assert "no log key configured" in problem.text


@pytest.mark.parametrize("variable", ["SIS_LOG_KEY_FILE", "SIS_LOG_WITNESS"])
def test_a_key_file_or_witness_inside_the_data_folder_is_a_configuration_error(tmp_path, variable):
    from sis_platform.settings import ConfigurationError, load_settings

    env = {"SIS_DATA_DIR": str(tmp_path / "data"), variable: str(tmp_path / "data" / "x")}
    with pytest.raises(ConfigurationError, match=f"{variable}=.* lies inside SIS_DATA_DIR"):
        load_settings(env)
