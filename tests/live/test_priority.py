"""SIS_PRIORITY on the live path: a stretch committed in parts publishes its priority masters
first, ends exactly where the reference does, and survives an interruption between its parts
(in the fold, under the running service, and SIGKILLed in a real sis-live)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sis_platform.domain.pipeline import ReferencePipeline
from sis_platform.domain.priority import Priority
from sis_platform.live.classify import Classify
from sis_platform.live.config import FoldOptions
from sis_platform.live.fold import Fold
from sis_platform.runtime.faults import LIVE_BETWEEN_PARTS
from sis_platform.serving import ServingWriter, open_writer
from sis_platform.simulator.generator import generate_feed
from tests.live.feed import INVALID, groups_of_varying_size, landed_feed
from tests.live.processes import SIGKILLED, finish, start_live
from tests.live.running import (
    BOUND_SECONDS,
    CONFIG,
    Place,
    assert_live_equals_reference,
    drained,
    running,
)
from tests.live.store_view import assert_store_matches_reference
from tests.reference import reference_for

PRIORITY = "sport = 'horse-racing' AND country = 'IE'; sport = 'horse-racing'"
OPTIONS = FoldOptions(priority=Priority.compile(PRIORITY))

pytestmark = pytest.mark.cost(40)


def _shown(store: ServingWriter, master_id: str) -> tuple[int, bytes] | None:
    shown = store.master(master_id)
    return None if shown is None else (shown.version, shown.document)


def _state(ref: ReferencePipeline, master_id: str) -> tuple[int, bytes] | None:
    state = ref.masters.get(master_id)
    if state is None or state.document is None:
        return None
    return (state.version, state.document)


def test_priority_masters_are_published_first_and_the_store_ends_as_the_reference(tmp_path):
    log = landed_feed(seed=21, messages=1500)
    stretches = groups_of_varying_size(log, seed=5, largest=300)
    ref = ReferencePipeline()
    ahead_parts = 0
    with open_writer(f"sqlite:///{tmp_path / 'serving.db'}") as store:
        classify, fold = Classify(store, OPTIONS), Fold(store, OPTIONS)
        for stretch in stretches:
            before = ReferencePipeline()
            before.masters = dict(ref.masters)
            ref.process([m.message for m in stretch])
            published: set[str] = set()
            for part in fold.parts(classify(stretch)):
                store.commit(part)
                published |= set(part.ahead)
                if part.ahead:
                    ahead_parts += 1
                    assert store.position() < part.position  # the position waits for the rest
                    # What a reader sees now: each published master as at the stretch's end,
                    # every other master as before the stretch.
                    for row in part.masters:
                        assert _shown(store, row.master_id) == _state(ref, row.master_id)
                    later = {r.master_id for r in store.changes(0, 100_000)} - published
                    for master_id in later:
                        assert _shown(store, master_id) == _state(before, master_id)
            assert store.position() == stretch[-1].position and store.ahead() == {}
    assert ahead_parts >= len(stretches)  # the feed has priority masters in (nearly) every one
    assert_store_matches_reference(tmp_path / "serving.db", reference_for([m.message for m in log]))


@pytest.mark.parametrize(
    ("refold_in", "options"),
    [(1, OPTIONS), (3, OPTIONS), (1, FoldOptions())],
    ids=["whole", "in-three-stretches", "priority-unset-before-the-restart"],
)
def test_a_stretch_cut_short_between_its_parts_is_refolded_without_the_masters_ahead(
    tmp_path, refold_in, options
):
    log = landed_feed(seed=22, messages=900)
    first, rest = log[:600], log[600:]
    db = tmp_path / "serving.db"
    with open_writer(f"sqlite:///{db}") as store:
        fold = Fold(store, OPTIONS)
        part = next(iter(fold.parts(Classify(store, OPTIONS)(first))))
        store.commit(part)  # the crash: only the first part committed
        ahead = store.ahead()
        assert ahead and set(ahead.values()) == {first[-1].position}
        # A restart: a new fold from the store, the stretch refolded up to where it ended (the
        # applier never lets a stretch run across that end), then the log goes on.
        classify, fold = Classify(store, options), Fold(store, options)
        size = -(-len(first) // refold_in)
        for start in range(0, len(first), size):
            stretch = first[start : start + size]
            end = stretch[-1].position
            skipped = [m for m, to in ahead.items() if to >= end]
            for part in fold.parts(classify(stretch, ahead=skipped)):
                store.commit(part)
        assert store.ahead() == {} and store.status().messages == len(first)
        for part in fold.parts(classify(rest)):
            store.commit(part)
        assert store.status().messages == len(log)
    assert_store_matches_reference(db, reference_for([m.message for m in log]))


def _feed(seed: int, messages: int):
    return list(generate_feed(seed, messages, invalid=INVALID, duplicates=0.02))


def test_a_backlog_under_the_service_is_folded_in_windows_and_ends_as_the_reference(tmp_path):
    place = Place(tmp_path / "data")
    feed = _feed(23, 700)
    place.put(feed)
    config = replace(CONFIG, fold=OPTIONS, priority_window=250)
    stretches: list[tuple[int, bool]] = []
    parts = Fold.parts

    def recording(self, classified, *, prioritize=True):
        stretches.append((len(classified.messages), prioritize))
        return parts(self, classified, prioritize=prioritize)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Fold, "parts", recording)
        with running(place, config) as service:
            assert service.wait_until(drained, BOUND_SECONDS)
    # Groups of 20 arrived full, so the backlog was folded in windows of up to 250 messages,
    # each in parts.
    assert max(size for size, _ in stretches) > CONFIG.group_max_messages
    assert all(size <= 250 for size, _ in stretches)
    assert all(prioritize for size, prioritize in stretches if size > CONFIG.group_max_messages)
    assert_live_equals_reference(place, feed)


def test_a_live_feed_s_groups_commit_at_once_in_one_part(tmp_path):
    place = Place(tmp_path / "data")
    feed = _feed(25, 60)
    # Every update's master is a priority master: a group split in parts would show.
    config = replace(CONFIG, fold=FoldOptions(priority=Priority.compile("category = 'update'")))
    commits: list[tuple[str, ...]] = []
    commit = ServingWriter.commit

    def recording(self, group):
        commits.append(group.ahead)
        return commit(self, group)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ServingWriter, "commit", recording)
        with running(place, config) as service:
            for message in feed:  # one at a time: no group is full, no backlog
                place.put([message])
                assert service.wait_until(drained, BOUND_SECONDS)
    assert len(commits) == len(feed) and not any(commits)
    assert_live_equals_reference(place, feed)


@pytest.mark.faults
def test_a_kill_between_the_parts_loses_nothing_and_applies_nothing_twice(tmp_path):
    place = Place(tmp_path / "data")
    feed = _feed(24, 400)
    place.put(feed)
    log = tmp_path / "sis-live.log"
    variables = {"SIS_PRIORITY": PRIORITY, "SIS_LIVE_PRIORITY_WINDOW": "150"}
    proc = start_live(place.root, log, SIS_CRASH_AT=f"{LIVE_BETWEEN_PARTS}@2", **variables)
    assert finish(proc, BOUND_SECONDS, log) == SIGKILLED, log.read_text(errors="replace")[-4000:]
    assert "SIS_PRIORITY: 2 selector(s)" in log.read_text(errors="replace")  # the operator sees it
    with open_writer(place.url) as store:
        assert store.ahead()  # killed with a stretch half committed
    with running(place, replace(CONFIG, fold=OPTIONS, priority_window=150)) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
    assert_live_equals_reference(place, feed)
