"""sis-live's classify and fold stages: folding a landed log in groups into a real SQLite serving
store gives exactly the reference pipeline's masters, versions, dead letters and outcomes."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from sis_platform.domain.dedup import DedupWindow
from sis_platform.domain.reasons import Outcome, Reason
from sis_platform.live.classify import Classified, Classify
from sis_platform.live.config import FoldOptions
from sis_platform.live.fold import Fold
from sis_platform.log.landing import LandedMessage
from sis_platform.serving import open_writer
from sis_platform.serving.records import GroupCommit
from sis_platform.standards.selector import Selector
from tests.live.feed import groups_of_varying_size, landed_again, landed_feed
from tests.live.store_view import assert_store_matches_reference
from tests.reference import reference_for

SELECTOR = "sport = 'horse-racing'"

pytestmark = pytest.mark.cost(25)


def _fold_into_store(
    db: Path, groups: list[list[LandedMessage]], options: FoldOptions, restart_every: int = 0
) -> None:
    store = open_writer(f"sqlite:///{db}")
    try:
        classify, fold = Classify(store, options), Fold(store, options)
        for number, group in enumerate(groups, 1):
            store.commit(fold(classify(group)))
            assert store.position() == group[-1].position
            if restart_every and number % restart_every == 0:
                fold = Fold(store, options)  # a restart: nothing but the store is kept
    finally:
        store.close()


@pytest.mark.parametrize(
    ("largest", "max_masters", "restart_every"),
    [(40, 20_000, 0), (7, 3, 0), (120, 1, 5)],
    ids=["groups-up-to-40", "tiny-cache", "one-master-cached-and-restarts"],
)
def test_live_fold_in_groups_equals_the_reference(tmp_path, largest, max_masters, restart_every):
    log = landed_feed(seed=11, messages=1500)
    groups = groups_of_varying_size(log, seed=largest, largest=largest)
    _fold_into_store(
        tmp_path / "serving.db", groups, FoldOptions(max_masters=max_masters), restart_every
    )
    ref = reference_for([m.message for m in log])
    outcomes = ref.outcome_counts()
    # The feed exercises what the comparison is about.
    assert outcomes[Outcome.DUPLICATE] > 0 and outcomes[Outcome.DEAD_LETTERED] > 10
    reasons = Counter(d.reason for d in ref.dead_letters)
    assert reasons[Reason.REDELIVERY_LIMIT] and reasons[Reason.MASTER_STALE]
    assert_store_matches_reference(tmp_path / "serving.db", ref)


def test_each_group_folded_before_the_one_before_it_is_committed_equals_the_reference(tmp_path):
    # The pipelined groups' order (live/applier.py): the next group is classified and folded
    # onto the fold's own results for the one before, which the store commits only then.
    log = landed_feed(seed=14, messages=900)
    db = tmp_path / "serving.db"
    store = open_writer(f"sqlite:///{db}")
    try:
        classify, fold = Classify(store, FoldOptions()), Fold(store, FoldOptions())
        previous: Classified | None = None
        waiting: GroupCommit | None = None
        for group in groups_of_varying_size(log, seed=4, largest=30):
            classified = classify(group, also_seen=previous.copies if previous else None)
            commit = fold(classified)
            if waiting is not None:
                store.commit(waiting)
            previous, waiting = classified, commit
        assert waiting is not None
        store.commit(waiting)
    finally:
        store.close()
    ref = reference_for([m.message for m in log])
    assert ref.outcome_counts()[Outcome.DUPLICATE] > 0
    assert_store_matches_reference(db, ref)


def test_live_fold_with_a_dedup_window_equals_the_reference_with_it(tmp_path):
    # Copies of the first 30 messages (batches 1-3) landed again after batch 60: beyond a
    # window of 5 batches, so processed as first copies anew; copies of the last 20 (batches
    # 59-60) are within it: duplicates.
    log = landed_feed(seed=13, messages=600, batch_size=10)
    log = landed_again(log, log[:30] + log[-20:], batch_size=10)
    window = DedupWindow(5)
    groups = groups_of_varying_size(log, seed=5, largest=40)
    _fold_into_store(tmp_path / "serving.db", groups, FoldOptions(max_masters=50, window=window))
    ref = reference_for([m.message for m in log], window=window)
    unbounded = reference_for([m.message for m in log], window=DedupWindow(0))
    duplicates = ref.outcome_counts()[Outcome.DUPLICATE]
    # The 30 old copies are duplicates only without the window (30 message-level results).
    assert unbounded.outcome_counts()[Outcome.DUPLICATE] - duplicates == 30
    assert_store_matches_reference(tmp_path / "serving.db", ref)


def test_live_fold_with_a_selector_equals_the_reference(tmp_path):
    log = landed_feed(seed=12, messages=900)
    selector = Selector.compile(SELECTOR)
    groups = groups_of_varying_size(log, seed=3, largest=25)
    _fold_into_store(tmp_path / "serving.db", groups, FoldOptions(selector=selector, max_masters=5))
    ref = reference_for([m.message for m in log], selector=selector)
    assert any(s.filtered for s in ref.masters.values())
    assert_store_matches_reference(tmp_path / "serving.db", ref)


def test_the_model_leaves_out_filtered_masters_and_keeps_stale_ones(tmp_path):
    log = landed_feed(seed=12, messages=900)
    selector = Selector.compile(SELECTOR)
    db = tmp_path / "serving.db"
    _fold_into_store(db, [log], FoldOptions(selector=selector))
    ref = reference_for([m.message for m in log], selector=selector)
    conn = sqlite3.connect(db)
    try:
        events = dict(conn.execute("SELECT master_id, stale FROM events"))
    finally:
        conn.close()
    expected = {
        m: int(s.stale) for m, s in ref.masters.items() if s.document is not None and not s.filtered
    }
    assert {m: int(s) for m, s in events.items()} == expected


def test_a_cached_master_is_not_reloaded_and_a_miss_is_loaded_once_per_group(tmp_path):
    log = landed_feed(seed=13, messages=300)
    store = open_writer(f"sqlite:///{tmp_path / 'serving.db'}")
    calls: list[list[str]] = []
    real = store.masters_state

    def counting(ids):
        ids = list(ids)
        calls.append(ids)
        return real(ids)

    store.masters_state = counting  # type: ignore[method-assign]
    try:
        classify, fold = Classify(store, FoldOptions()), Fold(store, FoldOptions())
        for group in groups_of_varying_size(log, seed=1, largest=30):
            store.commit(fold(classify(group)))
    finally:
        store.close()
    loaded = [i for ids in calls for i in ids]
    assert len(loaded) == len(set(loaded))  # never a master twice: the cache holds them


def test_an_empty_stretch_is_refused(tmp_path):
    store = open_writer(f"sqlite:///{tmp_path / 'serving.db'}")
    try:
        with pytest.raises(ValueError):
            Classify(store, FoldOptions())([])
    finally:
        store.close()
