"""sis-live's fold workers (sis_platform/live/workers.py): a long stretch's masters folded partly
in worker processes end exactly as the reference pipeline folds them, and a worker's failures
end as sis-live's own do: a fold that raises counts against its master until it is
quarantined, an item over its budget (the worker's watchdog kills the worker) is dead-lettered
`too-complex`, a worker that dies on a master counts as a death on it.

The failures are injected into the workers only (SIS_INJECT_FOLD_FAILURE is set after sis-live's
own budget has read it, before the workers start), so the test process never folds the poison
itself. Real spawned processes throughout."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from sis_platform.domain.dedup import Copies, DedupWindow
from sis_platform.domain.pipeline import classify_stretch
from sis_platform.domain.poison import budget_detail, quarantine_detail
from sis_platform.live.budget import DIED_FOLDING, FOLD, BudgetConfig, LiveBudget
from sis_platform.live.classify import Classify
from sis_platform.live.config import FoldOptions
from sis_platform.live.fold import Fold
from sis_platform.live.workers import (
    Folded,
    FoldTask,
    FoldWorkers,
    WorkerFoldError,
    split_shares,
)
from sis_platform.log.landing import LandedMessage
from sis_platform.serving import ServingWriter, open_writer
from sis_platform.standards.selector import Selector
from tests.live.feed import groups_of_varying_size, landed_feed
from tests.live.store_view import assert_store_matches_reference
from tests.live.test_budget import Expected, ReferenceWithFailures
from tests.reference import reference_for

pytestmark = [pytest.mark.faults, pytest.mark.cost(40)]

# The test process folds its own share under its guard, whose watchdog SIGKILLs the process
# that overruns: pytest's own worker here. So its budget is generous; only the hang test gives
# its fold workers a short one (a loaded machine stalls an item for a second at times).
BUDGET_SECONDS = 60.0
HANG_BUDGET_SECONDS = 2.0
START_SECONDS = 60.0  # a spawned worker imports the domain: seconds on a loaded machine


def test_split_shares_cuts_masters_in_order_into_runs_of_about_equal_items():
    sizes = {"a": 5, "b": 1, "c": 1, "d": 3, "e": 2}
    assert split_shares(sizes, 2) == [["a", "b"], ["c", "d", "e"]]
    assert split_shares(sizes, 3) == [["a"], ["b", "c", "d"], ["e"]]
    assert split_shares({"a": 10}, 3) == [["a"]]
    assert split_shares({}, 2) == []
    assert sum(split_shares({f"m{i}": 1 for i in range(10)}, 2), []) == [f"m{i}" for i in range(10)]


class Place:
    """A store, a budget and workers in a temporary folder."""

    def __init__(self, root: Path, quarantine_after: int = 2) -> None:
        self.db = root / "serving.db"
        self.store: ServingWriter = open_writer(f"sqlite:///{self.db}")
        config = BudgetConfig(root / "inflight", BUDGET_SECONDS, quarantine_after)
        self.budget = LiveBudget.open(config)
        self.folder = config.folder / FOLD

    def workers(
        self, count: int, options: FoldOptions, budget_seconds: float = BUDGET_SECONDS
    ) -> FoldWorkers:
        setup = self.budget.worker_setup(selector=options.selector, limits=options.limits)
        setup = dataclasses.replace(setup, budget_seconds=budget_seconds)
        workers = FoldWorkers(count, setup)
        assert workers.ready(wait_seconds=START_SECONDS), "the fold workers did not start"
        return workers

    def close(self) -> None:
        self.budget.close()
        self.store.close()


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Place]:
    made = Place(tmp_path)
    yield made
    made.close()


@pytest.mark.parametrize("selector", [None, "sport = 'horse-racing'"], ids=["all", "selector"])
@pytest.mark.parametrize("count", [1, 2])
def test_a_log_folded_with_workers_equals_the_reference(place: Place, count, selector):
    log = landed_feed(seed=11, messages=2400)
    compiled = Selector.compile(selector) if selector else None
    options = FoldOptions(selector=compiled, max_masters=40)
    workers = place.workers(count, options)
    try:
        classify = Classify(place.store, options, place.budget)
        fold = Fold(place.store, options, place.budget, workers)
        for group in groups_of_varying_size(log, seed=5, largest=900):
            place.store.commit(fold(classify(group)))
    finally:
        workers.close()
    assert workers.shared > 50  # most stretches were long enough to share
    ref = reference_for([m.message for m in log], selector=compiled)
    assert_store_matches_reference(place.db, ref)


def test_a_reply_left_unread_is_never_taken_for_a_later_requests(place: Place):
    classified = classify_stretch(
        [m.message for m in landed_feed(seed=17, messages=600)], Copies(DedupWindow())
    )
    first, second = split_shares({m: len(i) for m, i in classified.groups.items()}, 2)
    workers = place.workers(1, FoldOptions())
    try:
        # The first request's stretch is abandoned before its reply is read.
        for share in (first, second):
            [pending] = workers.fold([[FoldTask(m, None, classified.groups[m]) for m in share]], {})
        reply = pending.reply()
    finally:
        workers.close()
    assert isinstance(reply, Folded)
    assert [result.state.master_id for result in reply.results] == second


def _poisoned(log: list[LandedMessage]) -> tuple[str, str, int]:
    """A master the worker folds when the whole log is one stretch, and an item of it that is
    its message's only item (an injected hang strikes every item of its message)."""
    classified = classify_stretch([m.message for m in log], Copies(DedupWindow()))
    items = [i for group in classified.groups.values() for i in group]
    per_message = Counter(i.message_id for i in items)
    sizes = {master_id: len(group) for master_id, group in classified.groups.items()}
    for master_id in split_shares(sizes, 2)[1]:
        for item in classified.groups[master_id]:
            if per_message[item.message_id] == 1:
                return master_id, item.message_id, item.position
    raise AssertionError("no single-item message in the worker's share")


def _fold_until_committed(
    place: Place, fold: Fold, workers: FoldWorkers, log
) -> list[WorkerFoldError]:
    """Fold the log as one stretch until it commits (the applier retries a failed stretch);
    the failures on the way."""
    failures = []
    for _ in range(5):
        assert workers.ready(wait_seconds=START_SECONDS)
        try:
            commit = fold(Classify(place.store, fold.options, place.budget)(log))
        except WorkerFoldError as error:
            failures.append(error)
            continue
        place.store.commit(commit)
        return failures
    raise AssertionError(f"never committed: {failures}")


@pytest.mark.parametrize("how", ["raise", "crash", "hang"])
def test_a_workers_failure_ends_as_sis_lives_own(
    place: Place, monkeypatch: pytest.MonkeyPatch, how: str
):
    log = landed_feed(seed=13, messages=900)
    master_id, message_id, position = _poisoned(log)
    options = FoldOptions()
    # The budget (the place's) read the variable before it was set: only the worker fails. A
    # hang strikes one item; the others, the master's every item.
    target = message_id if how == "hang" else master_id
    monkeypatch.setenv("SIS_INJECT_FOLD_FAILURE", f"{target}:{how}")
    workers = place.workers(1, options, HANG_BUDGET_SECONDS if how == "hang" else BUDGET_SECONDS)
    fold = Fold(place.store, options, place.budget, workers)
    try:
        failures = _fold_until_committed(place, fold, workers, log)
    finally:
        workers.close()

    facts = place.budget.failures
    if how == "hang":
        # Killed by its watchdog once; the item is skipped from then on.
        assert len(failures) == 1 and "died" in str(failures[0])
        assert failures[0].master_id is None  # a death names no master: its marker does
        assert facts.timed_out_items == {(message_id, position): budget_detail(HANG_BUDGET_SECONDS)}
        expected = Expected(timed_out=facts.timed_out_items)
    else:
        # Two failures (SIS_QUARANTINE_AFTER here), then the master is held back.
        assert len(failures) == 2
        assert facts.fold[master_id].count == 2
        # The applier's log line names the master (sis_platform/runtime/logs.py).
        named = master_id if how == "raise" else None
        assert [f.master_id for f in failures] == [named, named]
        if how == "crash":
            assert facts.fold[master_id].last_error == DIED_FOLDING
        else:
            assert facts.fold[master_id].last_error.startswith("ZeroDivisionError")
        detail = quarantine_detail(2, facts.fold[master_id].last_error)
        expected = Expected(quarantined={master_id: detail})
    # Every dead worker's marker was taken in (only this process's own is left).
    assert [p.name for p in place.folder.iterdir()] == [f"{os.getpid()}.inflight"]
    ref = ReferenceWithFailures(expected)
    ref.process([m.message for m in log])
    assert_store_matches_reference(place.db, ref)
