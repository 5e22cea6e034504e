"""sis-live expiring old landed batches in its idle turns (sis_platform/log/landing/expiry.py):
only up to the store's live == lake gate, reading the kept log as before; and a serving store
behind the expired range (an empty one, or a backup too old) halts with the reason instead of
skipping the messages it can no longer read."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from sis_platform.live.service import LiveService
from sis_platform.log.landing import batch_key
from sis_platform.serving import open_writer
from sis_platform.simulator.generator import generate_feed
from tests.live.feed import INVALID
from tests.live.running import (
    BOUND_SECONDS,
    CONFIG,
    Place,
    assert_live_equals_reference,
    drained,
    running,
)
from tests.live.test_merge import merged
from tests.log.grouped import read_back, sealed_zone

pytestmark = [pytest.mark.cost(40)]

# 300 messages in batches of 70: four sealed batches and an open one, which a restart seals.
MERGING = dataclasses.replace(CONFIG, merge_grace_seconds=0.0)
EXPIRING = dataclasses.replace(MERGING, landing_retain=timedelta(0))


def expired_through(service: LiveService, seq: int) -> bool:
    expiry = service.zone.catalog.expiry()
    return (
        expiry is not None
        and expiry.through_seq == seq
        and not any(
            service.zone.catalog.anchors.path(batch_key(s)).exists() for s in range(1, seq + 1)
        )
    )


def test_sis_live_expires_checked_batches_and_a_store_behind_them_halts(tmp_path):
    place = Place(tmp_path / "data")
    feed = list(generate_feed(47, 300, invalid=INVALID, duplicates=0.02))
    place.put(feed)
    zone = sealed_zone(place.root)
    with running(place, MERGING, zone=zone) as service:
        assert service.wait_until(
            lambda s: drained(s) and s.zone.catalog.batch_path(batch_key(4)).is_file(),
            BOUND_SECONDS,
        )
    # Restarted, it seals the open batch and merges it; without a gate nothing goes, whatever
    # the retention.
    with running(place, EXPIRING, zone=zone) as service:
        assert service.wait_until(merged, BOUND_SECONDS)
    assert zone.catalog.expiry() is None
    assert_live_equals_reference(place, feed)
    logged = read_back(zone)

    store = open_writer(place.url)
    store.record_checked(3)  # live_matches_lake passed at batch 3
    store.close()
    with running(place, EXPIRING, zone=zone) as service:
        assert service.wait_until(lambda s: expired_through(s, 3), BOUND_SECONDS)
    expiry = zone.catalog.expiry()
    assert expiry is not None
    kept = [m for m in logged if m[0] > expiry.end]
    assert read_back(zone, expiry.end) == kept
    assert zone.catalog.keys() == [batch_key(4), batch_key(5)]

    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    with running(place, EXPIRING, open_writer_=lambda: open_writer(empty), zone=zone) as service:
        assert service.wait_until(lambda s: s.applier.halted is not None, BOUND_SECONDS)
        assert "restore a newer backup" in (service.applier.halted or "")
