"""sis-live prunes the serving store's history in its idle turns (ServingWriter.prune), only up to
the batch live == lake passed at; SIGKILLed in the middle of a prune (its crash points), it is
restarted and the store resumes: current state whole, live == lake still true at the gate."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from datetime import timedelta

import pytest

from sis_platform.log.landing import START_POSITION
from sis_platform.runtime.faults import PRUNE_POINTS
from sis_platform.serving import ChangesPruned, ServingWriter, open_writer
from sis_platform.simulator.generator import generate_feed
from tests.live.feed import INVALID
from tests.live.processes import SIGKILLED, finish, start_live
from tests.live.running import BOUND_SECONDS, CONFIG, Place, drained, running
from tests.reference import reference_for
from tests.serving.groups import table

pytestmark = [pytest.mark.faults, pytest.mark.cost(60)]

GATE = 2  # the batch live == lake passed at (batches of 70 messages: 1 and 2 are sealed)
# No window: everything committed before the newest commit and checked may go.
PRUNING = replace(CONFIG, serving_history=timedelta(0))


def _reference_versions_at(place: Place, batch_seq: int) -> dict[str, tuple[int, str]]:
    """What the lake folds up to the end of `batch_seq`: each existing master's version and
    document sha256 (the reference pipeline is the domain fold both paths run)."""
    log = place.zone.catalog.landed_after(START_POSITION, CONFIG.message_limits)
    ref = reference_for([m.message for m in log if m.position.batch_seq <= batch_seq])
    return {
        m: (s.version, hashlib.sha256(s.document).hexdigest())
        for m, s in ref.masters.items()
        if s.document is not None
    }


def _live_equals_lake_at(store: ServingWriter, place: Place, batch_seq: int) -> None:
    """The live side of live_matches_lake at `batch_seq`, for every master the lake has."""
    lake = _reference_versions_at(place, batch_seq)
    live = store.versions_at(batch_seq)
    assert lake and {m: live.get(m) for m in lake} == lake


def _pruned(place: Place) -> bool:
    with open_writer(place.url) as store:
        return store.retention().changes_pruned_seq > 0


def _put_and_checked(place: Place) -> None:
    """A feed of five batches put on the queue, and live == lake recorded as passed at GATE
    (standing in for the lake, which would fold and check batches 1 and 2 meanwhile)."""
    place.put(list(generate_feed(53, 300, invalid=INVALID, duplicates=0.02)))
    with open_writer(place.url) as store:
        store.record_checked(GATE)


def test_sis_live_prunes_checked_history_in_idle_turns(tmp_path):
    place = Place(tmp_path / "data")
    _put_and_checked(place)
    with running(place, PRUNING) as service:
        assert service.wait_until(lambda s: drained(s) and _pruned(place), BOUND_SECONDS)
    with open_writer(place.url) as store:
        held = store.retention()
        assert held.changes_pruned_batch == GATE and held.dead_letters_pruned_seq > 0
        with pytest.raises(ChangesPruned):
            store.changes(0)
        # Below the floor one change per master; after it every change of the later batches.
        kept = [r for r in table(store, "changes", "seq") if r[0] <= held.changes_pruned_seq]
        assert len(kept) == len({r[1] for r in kept})
        assert min(c.batch_seq for c in store.changes(held.changes_pruned_seq)) > GATE
        _live_equals_lake_at(store, place, GATE)
        _live_equals_lake_at(store, place, store.position().batch_seq)


@pytest.mark.parametrize("point", PRUNE_POINTS)
def test_sis_live_killed_in_a_prune_resumes_with_live_equal_to_lake(tmp_path, point):
    place = Place(tmp_path / "data")
    _put_and_checked(place)
    log = tmp_path / "sis-live.log"
    proc = start_live(place.root, log, SIS_CRASH_AT=point, SIS_SERVING_HISTORY_DAYS="0")
    code = finish(proc, BOUND_SECONDS, log)
    assert code == SIGKILLED, log.read_text(errors="replace")[-4000:]
    with open_writer(place.url) as store:
        assert store.position() == place.zone.catalog.last_position()  # idle: everything applied
        assert (store.retention().changes_pruned_seq > 0) == (point == "serving.after_prune")
        _live_equals_lake_at(store, place, GATE)
    with running(place, PRUNING) as service:
        assert service.wait_until(lambda s: drained(s) and _pruned(place), BOUND_SECONDS)
    with open_writer(place.url) as store:
        assert store.retention().changes_pruned_batch == GATE
        kept = [r for r in table(store, "changes", "seq")]
        floor = store.retention().changes_pruned_seq
        below = [r for r in kept if r[0] <= floor]
        assert len(below) == len({r[1] for r in below})
        _live_equals_lake_at(store, place, GATE)
        _live_equals_lake_at(store, place, store.position().batch_seq)
