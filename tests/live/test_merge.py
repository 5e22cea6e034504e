"""sis-live merging sealed batches in its idle turns (sis_platform/log/landing/merge.py): in a
thread of the test, and SIGKILLed at each of the merge's crash points then restarted. Either way
every sealed batch ends as one file, the open batch stays in parts, nothing is lost or applied
twice, the store equals the reference over the log, and the chain check passes."""

from __future__ import annotations

import dataclasses

import pytest

from sis_platform.live.service import LiveService
from sis_platform.log.landing import batch_key
from sis_platform.log.landing.merge import folder_keys
from sis_platform.runtime.faults import MERGE_POINTS
from sis_platform.simulator.generator import generate_feed
from tests.live.feed import INVALID
from tests.live.processes import SIGKILLED, finish, start_live
from tests.live.running import (
    BOUND_SECONDS,
    CONFIG,
    Place,
    assert_live_equals_reference,
    drained,
    running,
)
from tests.log.grouped import chain_problems, read_back, sealed_zone

pytestmark = [pytest.mark.cost(60)]

# 300 messages in batches of 70: four sealed batches and an open one of 20, which a restart
# seals (GroupWriter.recover).
MERGING = dataclasses.replace(CONFIG, merge_grace_seconds=0.0)


def merged(service: LiveService) -> bool:
    """Drained, and every batch sealed, one file, its parts removed."""
    return drained(service) and folder_keys(service.zone.upkeep) == []


def test_sis_live_merges_sealed_batches_in_idle_turns_and_reads_them_as_before(tmp_path):
    place = Place(tmp_path / "data")
    feed = list(generate_feed(41, 300, invalid=INVALID, duplicates=0.02))
    place.put(feed)
    zone = sealed_zone(place.root)
    keeping = dataclasses.replace(CONFIG, merge_grace_seconds=3600.0)
    with running(place, keeping, zone=zone) as service:
        assert service.wait_until(
            lambda s: drained(s) and s.zone.catalog.batch_path(batch_key(4)).is_file(),
            BOUND_SECONDS,
        )
        assert folder_keys(place.zone.upkeep) == [batch_key(k) for k in range(1, 6)]  # parts kept
    logged = read_back(zone)
    with running(place, MERGING, zone=zone) as service:
        assert service.wait_until(merged, BOUND_SECONDS)
    assert [len(zone.catalog.batch_files(batch_key(k))) for k in range(1, 6)] == [1] * 5
    assert read_back(zone) == logged
    assert_live_equals_reference(place, feed)
    assert chain_problems(zone) == []


@pytest.mark.faults
@pytest.mark.parametrize("point", MERGE_POINTS)
def test_sis_live_killed_while_merging_loses_nothing_and_merges_after_restart(tmp_path, point):
    place = Place(tmp_path / "data")
    feed = list(generate_feed(43, 300, invalid=INVALID, duplicates=0.02))
    place.put(feed)
    log = tmp_path / "sis-live.log"
    proc = start_live(place.root, log, SIS_CRASH_AT=point, SIS_LANDING_MERGE_GRACE_SECONDS="0")
    code = finish(proc, BOUND_SECONDS, log)
    assert code == SIGKILLED, log.read_text(errors="replace")[-4000:]
    zone = sealed_zone(place.root)
    logged = read_back(zone)
    assert len(logged) >= 300

    with running(place, MERGING, zone=zone) as service:
        assert service.wait_until(merged, BOUND_SECONDS)
    assert read_back(zone) == logged
    assert_live_equals_reference(place, feed)
    assert chain_problems(zone) == []
