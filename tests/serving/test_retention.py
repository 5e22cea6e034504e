"""The serving store's history retention (ServingWriter.prune), on SQLite and PostgreSQL: the
change log and dead letters pruned past the window and the live == lake gate, each master's
last change kept, readers told what is pruned, and a prune killed at its crash points leaving a
store that resumes to the same end."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sis_platform.domain.dedup import DEFAULT_DEDUP_WINDOW, DedupWindow
from sis_platform.runtime.faults import PRUNE_POINTS
from sis_platform.serving import (
    ChangesPruned,
    DeadLettersPruned,
    Pruned,
    ServingWriter,
    open_writer,
)
from sis_platform.serving import writer as writer_module
from tests.serving.downgrade import downgrade
from tests.serving.groups import group, table

DAY0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
DAYS = 10
WINDOW = timedelta(days=3)
GATE = 6  # live == lake passed at batch 6
REPO = Path(__file__).resolve().parents[2]


def _season(store: ServingWriter, monkeypatch: pytest.MonkeyPatch, days: int = DAYS) -> None:
    """A group a day, in batch day + 1: masters A and B a new version each, C only on day 0,
    and a dead letter."""
    with monkeypatch.context() as patch:
        for day in range(days):
            patch.setattr(writer_module, "utc_now", lambda day=day: DAY0 + timedelta(days=day))
            masters = [("A", day + 1), ("B", day + 1)] + ([("C", 1)] if day == 0 else [])
            store.commit(group((day + 1, len(masters)), masters, dead=[f"dead-{day}"]))


def _prune_all(
    store: ServingWriter,
    window: timedelta = WINDOW,
    chunk: int = 1000,
    dedup: DedupWindow = DEFAULT_DEDUP_WINDOW,
) -> None:
    while store.prune(window, chunk, dedup).more:
        pass


def _outcomes(store: ServingWriter) -> list[tuple[int, int]]:
    """(batch, message) of every outcome held, in log order."""
    return [(r[0], r[1]) for r in table(store, "message_outcomes", "batch_seq, msg_seq")]


def _changes(store: ServingWriter) -> list[tuple[Any, ...]]:
    """(seq, master id, version, batch) of every change row held."""
    return [(r[0], r[1], r[2], r[8]) for r in table(store, "changes", "seq")]


def _dead(store: ServingWriter) -> list[tuple[Any, ...]]:
    return [(r[0], r[1], r[6]) for r in table(store, "dead_letters", "seq")]


def _expected_after_prune(changes: list[tuple[Any, ...]], floor: int) -> list[tuple[Any, ...]]:
    """`changes` pruned up to seq `floor`: each master's last change at or before it kept."""
    last = {}
    for row in changes:
        if row[0] <= floor:
            last[row[1]] = row[0]
    return [r for r in changes if r[0] > floor or last[r[1]] == r[0]]


def test_nothing_is_pruned_before_live_matches_lake_has_passed(store, monkeypatch):
    _season(store, monkeypatch)
    assert store.prune(timedelta(0)) == Pruned(0, 0, False)
    assert len(store.changes(0)) == 2 * DAYS + 1
    assert store.retention().checked_batch == 0


def test_history_older_than_the_window_and_checked_is_pruned_keeping_each_masters_last(
    store, monkeypatch
):
    _season(store, monkeypatch)
    before = _changes(store)
    masters = table(store, "masters")
    versions = store.versions_at(GATE)
    store.record_checked(GATE)
    _prune_all(store)
    # Days 0-5 (batches 1-6) are older than 3 days before day 9's commit and checked: of them
    # only A's and B's version 6 and C's only change are left.
    held = _changes(store)
    assert [(m, v) for _, m, v, b in held if b <= GATE] == [("C", 1), ("A", 6), ("B", 6)]
    assert held == _expected_after_prune(before, store.retention().changes_pruned_seq)
    assert [b for _, _, b in _dead(store)] == [7, 8, 9, 10]
    assert table(store, "masters") == masters  # the current state untouched
    assert store.versions_at(GATE) == versions  # live == lake still answers at the gate
    # Outcomes are kept: the batches are all within the default dedup window.
    assert len(_outcomes(store)) == 3 * DAYS + 1


def test_outcomes_past_the_dedup_window_and_checked_are_pruned(store, monkeypatch):
    _season(store, monkeypatch)
    before = _outcomes(store)
    store.record_checked(GATE)
    # The store at batch 10, a window of 2 batches: outcomes before batch 8 are never looked up
    # again, but the gate (6) keeps batches 7 on.
    _prune_all(store, dedup=DedupWindow(2))
    assert [b for b, _ in _outcomes(store)] == sorted(b for b, _ in before if b > GATE)
    assert store.latest_copies(["msg-A-7", "msg-A-6"]) == {"msg-A-7": 7}
    # The gate moved on: the window bounds it now (batches 8 on).
    store.record_checked(DAYS)
    _prune_all(store, dedup=DedupWindow(2))
    assert [b for b, _ in _outcomes(store)] == sorted(b for b, _ in before if b >= 8)
    # Unbounded: nothing of the outcomes is pruned.
    assert store.prune(WINDOW, dedup=DedupWindow(0)).outcomes == 0


def test_a_prune_never_passes_the_live_matches_lake_gate(store, monkeypatch):
    _season(store, monkeypatch)
    store.record_checked(3)
    store.record_checked(2)  # the gate never moves back
    assert store.retention().checked_batch == 3
    _prune_all(store, timedelta(0))
    assert min(b for _, m, _, b in _changes(store) if m != "C") == 3
    assert [b for _, _, b in _dead(store)] == list(range(4, DAYS + 1))


def test_the_window_counts_from_the_change_logs_newest_commit_not_the_wall_clock(
    store, monkeypatch
):
    _season(store, monkeypatch)
    store.record_checked(DAYS)
    # The host's clock a year ahead (stepped, or the feed idle): nothing more is old.
    monkeypatch.setattr(writer_module, "utc_now", lambda: DAY0 + timedelta(days=365))
    _prune_all(store)
    assert min(b for _, m, _, b in _changes(store) if m != "C") == GATE
    assert [b for _, _, b in _dead(store)] == [7, 8, 9, 10]


def test_a_reader_asking_for_pruned_history_is_told_so(store, monkeypatch):
    _season(store, monkeypatch)
    store.record_checked(GATE)
    _prune_all(store)
    held = store.retention()
    with pytest.raises(ChangesPruned, match=f"complete after seq {held.changes_pruned_seq}") as e:
        store.changes(0)
    assert e.value.held_after == held.changes_pruned_seq
    assert [c.batch_seq for c in store.changes(held.changes_pruned_seq)] == [
        b for b in range(GATE + 1, DAYS + 1) for _ in "AB"
    ]
    with pytest.raises(ChangesPruned):
        store.versions_at(GATE - 1)
    with pytest.raises(ChangesPruned):
        store.change_as_of("A", DAY0 + timedelta(days=4, hours=12))
    shown = store.change_as_of("A", DAY0 + timedelta(days=5, hours=12))
    assert shown is not None and shown.version == 6
    with pytest.raises(DeadLettersPruned) as dead:
        store.dead_letters(0)
    assert [d.batch_seq for d in store.dead_letters(dead.value.held_after)] == [7, 8, 9, 10]


def test_a_prune_in_small_chunks_ends_where_one_large_step_does(store, monkeypatch):
    _season(store, monkeypatch)
    before = _changes(store)
    store.record_checked(GATE)
    steps = 0
    while store.prune(WINDOW, chunk=2).more:
        steps += 1
    assert steps >= 6  # 13 prunable changes, 6 dead letters, 2 a step
    floor = store.retention().changes_pruned_seq
    assert _changes(store) == _expected_after_prune(before, floor)
    assert [b for _, _, b in _dead(store)] == [7, 8, 9, 10]


_PRUNE_SCRIPT = """
import sys
from datetime import timedelta
from sis_platform.domain.dedup import DedupWindow
from sis_platform.serving import open_writer
store = open_writer(sys.argv[1])
while store.prune(timedelta(days=3), chunk=2, dedup=DedupWindow(4)).more:
    pass
"""


@pytest.mark.faults
@pytest.mark.parametrize("point", PRUNE_POINTS)
def test_a_prune_killed_at_a_crash_point_leaves_a_store_that_resumes_to_the_same_end(
    store, store_url, monkeypatch, point
):
    _season(store, monkeypatch)
    before_changes, before_dead = _changes(store), _dead(store)
    before_outcomes = _outcomes(store)
    versions = store.versions_at(GATE)
    store.record_checked(GATE)
    proc = subprocess.run(
        [sys.executable, "-c", _PRUNE_SCRIPT, store_url],
        env={**_env(), "SIS_CRASH_AT": f"{point}@3"},
        cwd=REPO,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr.decode(errors="replace")[-3000:]
    # Consistent: everything after the recorded floor is there, below it each master's last.
    held = store.retention()
    committed_steps = 2 if point == "serving.prune" else 3
    assert held.changes_pruned_seq == before_changes[2 * committed_steps - 1][0]
    assert _changes(store) == _expected_after_prune(before_changes, held.changes_pruned_seq)
    assert _dead(store) == [r for r in before_dead if r[0] > held.dead_letters_pruned_seq]
    # Two outcomes a committed step, oldest first.
    assert _outcomes(store) == before_outcomes[2 * committed_steps :]
    assert store.versions_at(GATE) == versions
    _prune_all(store, dedup=DedupWindow(4))
    floor = store.retention().changes_pruned_seq
    assert _changes(store) == _expected_after_prune(before_changes, floor)
    assert [b for _, _, b in _dead(store)] == [7, 8, 9, 10]
    # The store at batch 10, a window of 4: outcomes of batches 6 on kept.
    assert _outcomes(store) == [o for o in before_outcomes if o[0] >= 6]
    assert store.versions_at(GATE) == versions


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SIS_CRASH_AT"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_new_sqlite_store_gives_pruned_space_back(store, monkeypatch):
    assert table(store, "pragma_auto_vacuum", "1") == [(2,)]  # incremental
    _season(store, monkeypatch, days=200)
    (pages,) = table(store, "pragma_page_count", "1")
    store.record_checked(200)
    _prune_all(store, timedelta(days=1))
    (left,) = table(store, "pragma_page_count", "1")
    assert left[0] < pages[0]
    assert table(store, "pragma_freelist_count", "1") == [(0,)]


def test_a_version_3_store_is_upgraded_with_nothing_pruned(store, store_url, monkeypatch):
    _season(store, monkeypatch)

    downgrade(store, to=3, without="retention")
    with open_writer(store_url) as upgraded:
        assert upgraded.retention() == (0, 0, 0, None, 0)
        assert len(upgraded.changes(0)) == 2 * DAYS + 1
        assert upgraded.prune(timedelta(0)) == Pruned(0, 0, False)
