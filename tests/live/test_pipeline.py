"""sis-live's pipelined groups (sis_platform/live/applier.py): with a fold worker, each long group
of a backlog is committed during the next group's `apply`, after that one is landed and
classified and while the worker folds it. The store still ends equal to the reference (a
redelivery in the group after its first copy's ends `duplicate`), a planned stop commits the
group in flight, and a store failure with a group in flight loses nothing: the store catches up
from the landed log. Real spawned fold workers throughout."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sis_platform.live.budget import BudgetConfig
from sis_platform.live.workers import FoldWorkers
from sis_platform.log.landing import START_POSITION
from sis_platform.serving import ServingUnavailable, ServingWriter, open_writer
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
from tests.live.store_view import assert_store_matches_reference
from tests.live.test_workers import BUDGET_SECONDS, START_SECONDS
from tests.reference import reference_for

pytestmark = [pytest.mark.faults, pytest.mark.cost(40)]

# Groups of 300 (long enough to share), in batches that do not cut them short.
PIPELINED = replace(
    CONFIG,
    group_max_messages=300,
    batch_max_messages=3000,
    fold_workers=1,
    retry_first_seconds=0.05,
    retry_last_seconds=0.2,
)


@pytest.fixture(autouse=True)
def workers_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fold worker is waited for when first asked for: sis-live folds alone while its
    workers start, which would leave a random number of the first groups unpipelined."""
    ready = FoldWorkers.ready

    def waiting(self: FoldWorkers, wait_seconds: float = 0.0) -> bool:
        return ready(self, max(wait_seconds, START_SECONDS))

    monkeypatch.setattr(FoldWorkers, "ready", waiting)


def _budget(root: Path) -> BudgetConfig:
    return BudgetConfig(root / "inflight", BUDGET_SECONDS)


def _feed(seed: int, messages: int) -> list[Any]:
    return list(generate_feed(seed, messages, invalid=INVALID, duplicates=0.05))


def test_a_backlog_folded_in_pipelined_groups_equals_the_reference(tmp_path: Path):
    place = Place(tmp_path / "data")
    feed = _feed(41, 2400)
    place.put(feed)
    with running(place, PIPELINED, budget=_budget(tmp_path)) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
        pipelined = service.applier.pipelined
    assert pipelined == 8  # every group of 300
    assert_live_equals_reference(place, feed)


def test_a_stop_commits_the_group_in_flight(tmp_path: Path):
    place = Place(tmp_path / "data")
    place.put(_feed(43, 6000))
    with running(place, PIPELINED, budget=_budget(tmp_path)) as service:
        assert service.wait_until(lambda s: s.applier.in_flight, BOUND_SECONDS)
        service.request_stop()  # with groups still on the queue: one is in flight at the stop
    landed = place.zone.catalog.last_position()
    store = open_writer(place.url)
    try:
        assert store.position() == landed  # not one group behind
    finally:
        store.close()
    log = [
        m.message for m in place.zone.catalog.landed_after(START_POSITION, CONFIG.message_limits)
    ]
    assert len(log) < 6000
    assert_store_matches_reference(place.db, reference_for(log))


class _FailingCommits:
    """Opens the place's store; the `fail_at`-th commit through any of them raises
    ServingUnavailable (the store lost mid-backlog, a group in flight)."""

    def __init__(self, url: str, fail_at: int) -> None:
        self.url = url
        self.fail_at = fail_at
        self.commits = 0
        self.opened = 0

    def open(self) -> ServingWriter:
        self.opened += 1
        return _Store(open_writer(self.url), self)  # type: ignore[return-value]


class _Store:
    def __init__(self, store: ServingWriter, counter: _FailingCommits) -> None:
        self._store, self._counter = store, counter

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def commit(self, group: Any) -> None:
        self._counter.commits += 1
        if self._counter.commits == self._counter.fail_at:
            raise ServingUnavailable("the store is lost (the test)")
        self._store.commit(group)


def test_a_store_failure_with_a_group_in_flight_loses_nothing(tmp_path: Path):
    place = Place(tmp_path / "data")
    feed = _feed(47, 2400)
    place.put(feed)
    # The second commit is the second group's, made after the third group was launched.
    stores = _FailingCommits(place.url, fail_at=2)
    with running(place, PIPELINED, stores.open, budget=_budget(tmp_path)) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
    assert stores.commits > 2
    assert_live_equals_reference(place, feed)
    # One failure, then a clean catch-up on the store opened again: the group in flight was
    # abandoned with its worker's reply taken, so no later fold read a reply meant for it
    # (which fails that fold, and the store is dropped and opened again each time).
    assert stores.opened == 2
