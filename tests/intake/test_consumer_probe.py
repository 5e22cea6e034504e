"""A landing outage is found before anything is got off the queue, so it never raises a
message's backout count (invariant 4: a transient failure never dead-letters a valid message),
on the real embedded queue and landing zone."""

from __future__ import annotations

import dataclasses
import os
import shutil

import pytest

from sis_platform.domain.limits import DEFAULT_LIMITS
from sis_platform.intake.consumer import BatchLimits, consume_batch
from sis_platform.log.landing import LandingZone
from sis_platform.queues.embedded import EmbeddedQueue
from tests.tmpfs import BLOCK, fill, mounted_tmpfs

LIMITS = BatchLimits(get_wait_seconds=0.05)


def _break(zone: LandingZone) -> None:
    # A file where the temporary folder belongs: every write under it fails, for root too.
    shutil.rmtree(zone.catalog.tmp_dir, ignore_errors=True)
    zone.catalog.tmp_dir.parent.mkdir(parents=True, exist_ok=True)
    zone.catalog.tmp_dir.write_bytes(b"")


def test_a_landing_outage_gets_nothing_and_leaves_the_backout_count_alone(tmp_path):
    queue = EmbeddedQueue(tmp_path / "queue", backout_threshold=2)
    zone = LandingZone(tmp_path / "landing")
    with queue.producer() as producer:
        message_id = producer.put(b"<a/>")
    _break(zone)
    for _ in range(5):  # more failed ticks than the backout threshold
        with queue.connect() as session, pytest.raises(OSError):
            consume_batch(session, zone.writer, LIMITS)
    assert queue.depth() == 1

    zone.catalog.tmp_dir.unlink()
    with queue.connect() as session:
        batch = consume_batch(session, zone.writer, LIMITS)
    assert batch is not None
    (row,) = zone.catalog.read(batch.key).to_pylist()
    assert (row["message_id"], row["delivery_count"]) == (message_id, 1)


def test_the_probe_leaves_no_file_behind(tmp_path):
    zone = LandingZone(tmp_path / "landing")
    zone.writer.probe()
    assert list(zone.catalog.tmp_dir.iterdir()) == []


def test_a_full_landing_disk_gets_nothing_and_leaves_no_partial_file(tmp_path):
    # The probe's few bytes fit in a nearly full file system; a batch does not.
    queue = EmbeddedQueue(tmp_path / "queue", backout_threshold=2)
    zone = LandingZone(tmp_path / "landing")
    limits = BatchLimits(max_messages=20, max_bytes=64 * 1024, get_wait_seconds=0.05)
    message_limits = dataclasses.replace(DEFAULT_LIMITS, max_message_bytes=64 * 1024)
    bodies = [b"<a>" + os.urandom(6000).hex().encode() + b"</a>" for _ in range(8)]
    with queue.producer() as producer:
        for body in bodies:
            producer.put(body)
    with mounted_tmpfs(zone.catalog.root, 1024 * 1024):
        zone.writer.ensure()
        ballast = fill(zone.catalog.root)
        ballast.write_bytes(b"\0" * (ballast.stat().st_size - 2 * BLOCK))  # 2 blocks free
        for _ in range(5):  # more failed ticks than the backout threshold
            with queue.connect() as session, pytest.raises(OSError):
                consume_batch(session, zone.writer, limits, message_limits=message_limits)
            assert list(zone.catalog.tmp_dir.iterdir()) == []
        assert queue.depth() == len(bodies)

        ballast.unlink()
        with queue.connect() as session:
            while consume_batch(session, zone.writer, limits, message_limits=message_limits):
                pass
        rows = [row for key in zone.catalog.keys() for row in zone.catalog.read(key).to_pylist()]
    assert [r["delivery_count"] for r in rows] == [1] * len(bodies)
