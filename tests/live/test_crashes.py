"""sis-live SIGKILLed at each of its crash points (sis_platform/runtime/faults.py: live.after_get,
live.after_land, live.store_commit, live.before_queue_commit, live.after_queue_commit), then
restarted clean and drained: nothing lost, nothing applied twice, the store equal to the
reference over the landed log; and SIGKILLed at random moments while a mixed feed arrives."""

from __future__ import annotations

import os
import random
import signal

import pytest

from sis_platform.log.landing import START_POSITION
from sis_platform.runtime.faults import LIVE_POINTS
from sis_platform.serving import open_writer
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

pytestmark = [pytest.mark.faults, pytest.mark.cost(60)]


@pytest.mark.parametrize("point", LIVE_POINTS)
@pytest.mark.parametrize("arrival", [1, 4])
def test_a_kill_at_a_crash_point_loses_nothing_and_applies_nothing_twice(tmp_path, point, arrival):
    place = Place(tmp_path / "data")
    feed = list(generate_feed(31, 300, invalid=INVALID, duplicates=0.02))
    place.put(feed)
    log = tmp_path / "sis-live.log"
    proc = start_live(place.root, log, SIS_CRASH_AT=f"{point}@{arrival}")
    code = finish(proc, BOUND_SECONDS, log)
    assert code == SIGKILLED, log.read_text(errors="replace")[-4000:]
    killed_at = place.zone.catalog.last_position()
    store = open_writer(place.url)
    try:
        applied = store.position()
    finally:
        store.close()
    if point in ("live.after_get",) and arrival == 1:
        assert killed_at == START_POSITION  # nothing landed before the kill
    if point in ("live.after_land", "live.store_commit"):
        assert applied < killed_at  # the last group landed, not applied
    if point in ("live.before_queue_commit", "live.after_queue_commit"):
        assert applied == killed_at  # the store commits before the queue does

    with running(place) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
    assert_live_equals_reference(place, feed)
    logged = place.zone.catalog.landed_after(START_POSITION, CONFIG.message_limits)
    came_back = any(m.message.delivery_count > 1 for m in logged)
    # Killed anywhere before the queue commit, the group got came back (and if it was
    # landed, its second copies were landed too, to end `duplicate`).
    assert came_back == (point != "live.after_queue_commit")


@pytest.mark.parametrize("point", ["live.after_land@3", "live.store_commit@2"])
def test_a_kill_with_a_pipelined_group_in_flight_loses_nothing(tmp_path, point):
    # Groups of 300: with the fold worker started (sis-live folds alone until it has), each is
    # committed during the next one's apply, so the third land and the second store commit
    # come with a group in flight. Whichever way the process got there, the restart converges.
    place = Place(tmp_path / "data")
    feed = list(generate_feed(37, 1500, invalid=INVALID, duplicates=0.05))
    place.put(feed)
    log = tmp_path / "sis-live.log"
    groups = {"SIS_LIVE_GROUP_MAX_MESSAGES": "300", "SIS_BATCH_MAX_MESSAGES": "3000"}
    proc = start_live(place.root, log, SIS_CRASH_AT=point, **groups)
    code = finish(proc, BOUND_SECONDS, log)
    assert code == SIGKILLED, log.read_text(errors="replace")[-4000:]
    store = open_writer(place.url)
    try:
        assert store.position() < place.zone.catalog.last_position()
    finally:
        store.close()
    with running(place) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
    assert_live_equals_reference(place, feed)


KILLS = 6


def test_random_kills_while_a_mixed_feed_arrives_leave_the_store_equal_to_the_reference(
    tmp_path,
):
    """sis-live SIGKILLed at seeded random moments (after a random number of store commits,
    each awaited on the store's doorbell) while a feed of valid, invalid and duplicate
    messages arrives in chunks, restarted each time; then drained: the store equals the
    reference over the whole feed, nothing lost and nothing applied twice."""
    rng = random.Random(43)
    place = Place(tmp_path / "data")
    feed = list(generate_feed(43, 700, invalid=INVALID, duplicates=0.05))
    cuts = sorted(rng.sample(range(60, len(feed) - 60), KILLS))
    chunks = [feed[a:b] for a, b in zip([0, *cuts], [*cuts, len(feed)], strict=True)]
    log = tmp_path / "sis-live.log"
    store = open_writer(place.url)
    try:
        seen = store.last_seq()
        for chunk in chunks[:-1]:
            proc = start_live(place.root, log)
            place.put(chunk)  # arrives while sis-live starts, recovers and catches up
            for _ in range(rng.randint(1, 3)):
                last = store.wait_for_changes(seen, BOUND_SECONDS)
                assert last > seen, log.read_text(errors="replace")[-4000:]
                seen = last
            os.killpg(proc.pid, signal.SIGKILL)
            assert finish(proc, BOUND_SECONDS, log) == SIGKILLED
    finally:
        store.close()
    place.put(chunks[-1])
    with running(place) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
    assert_live_equals_reference(place, feed)
