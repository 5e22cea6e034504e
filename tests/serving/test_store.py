"""The serving store on both backends: what a commit makes visible, all of it or nothing, the
position's rule, the reader API, and waiting for changes."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest

import sis_platform.serving.writer as writer_module
from sis_platform.log.landing import LogPosition
from sis_platform.serving import (
    PositionConflict,
    ServingReader,
    ServingWriter,
    StoredMaster,
    open_writer,
)
from sis_platform.serving.schema import SCHEMA_VERSION
from tests.serving.groups import PUT_TIME, document, group, sha, table

REPO = Path(__file__).resolve().parents[2]
# Generous bounds for a thread or process to finish: reached only when something is broken.
JOIN_SECONDS = 60
NEVER = 600.0


def test_a_new_store_is_at_the_start_of_the_log(store: ServingWriter) -> None:
    status = store.status()
    assert store.position() == LogPosition(0, -1)
    assert (status.last_seq, status.masters, status.messages) == (0, 0, 0)
    assert status.committed_at is None and status.heartbeat_at is None
    assert store.changes() == [] and store.dead_letters() == []
    assert store.master("M1") is None


def test_a_commit_is_read_back(store: ServingWriter) -> None:
    store.commit(group((1, 2), [("M1", 1), ("M2", 1)], dead=["bad-1"]))

    assert store.master("M1") == StoredMaster(1, document("M1", 1))
    assert store.master("M3") is None
    changes = store.changes()
    assert [(c.seq, c.master_id, c.version, c.message_id) for c in changes] == [
        (1, "M1", 1, "msg-M1-1"),
        (2, "M2", 1, "msg-M2-1"),
    ]
    first = changes[0]
    assert (first.batch_seq, first.msg_seq, first.put_time) == (1, 0, PUT_TIME)
    assert first.document_sha256 == sha(document("M1", 1))
    assert first.committed_at.tzinfo is not None
    [letter] = store.dead_letters()
    assert (letter.seq, letter.message_id, letter.master_id, letter.reason) == (
        1,
        "bad-1",
        None,
        "invalid",
    )
    assert (letter.detail, letter.batch_seq, letter.msg_seq) == ("not XML", 1, 2)
    status = store.status()
    assert status.position == LogPosition(1, 2) == store.position()
    assert (status.last_seq, status.masters, status.messages) == (2, 2, 3)
    assert status.committed_at == first.committed_at


def test_the_model_rows_follow_the_masters(store: ServingWriter) -> None:
    store.commit(group((1, 1), [("M1", 1), ("M2", 1)], runners=3))
    assert [r[:2] for r in table(store, "events")] == [("M1", 1), ("M2", 1)]
    assert len(table(store, "selections")) == 6

    # M1 changes (two runners now), M2 is filtered out: its rows go, its master row stays.
    store.commit(group((1, 3), [("M1", 2)], removed=["M2"], runners=2))
    events = table(store, "events")
    assert [(r[0], r[1], r[2], r[-1]) for r in events] == [("M1", 2, "horse-racing", False)]
    assert [r[:5] for r in table(store, "markets")] == [("M1", "M1-win", "win", "open", 1)]
    selections = table(store, "selections", "selection_id")
    assert [(r[2], r[8], r[9]) for r in selections] == [("M1-s1", 2, 3), ("M1-s2", 4, 3)]
    # num/den + 1 exactly, at 6 places: 2/3 + 1 and 4/3 + 1.
    assert [Decimal(str(r[10])) for r in selections] == [Decimal("1.666667"), Decimal("2.333333")]
    assert store.masters_state(["M2"])["M2"].filtered


def test_a_commit_that_fails_before_its_end_leaves_nothing(
    store: ServingWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.commit(group((1, 0), [("M1", 1)]))
    before = store.status()

    def fail(name: str) -> None:
        assert name == "live.store_commit"
        raise RuntimeError("injected before COMMIT")

    monkeypatch.setattr(writer_module, "crash_point", fail)
    with pytest.raises(RuntimeError, match="injected"):
        store.commit(group((1, 2), [("M1", 2), ("M2", 1)], dead=["bad"]))
    monkeypatch.undo()

    _assert_only_the_first_group(store, before)
    # The same group commits afterwards.
    store.commit(group((1, 2), [("M1", 2), ("M2", 1)], dead=["bad"]))
    assert store.position() == LogPosition(1, 2)
    assert store.master("M1") == StoredMaster(2, document("M1", 2))


def test_a_kill_inside_the_commit_leaves_nothing(store: ServingWriter, store_url: str) -> None:
    """SIGKILL at the crash point between the writes and COMMIT, in a writer process."""
    store.commit(group((1, 0), [("M1", 1)]))
    before = store.status()
    script = textwrap.dedent(
        f"""
        from sis_platform.serving import open_writer
        from tests.serving.groups import group
        store = open_writer({store_url!r})
        store.commit(group((1, 2), [("M1", 2), ("M2", 1)], dead=["bad"]))
        """
    )
    env = {**os.environ, "SIS_CRASH_AT": "live.store_commit"}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert result.returncode == -signal.SIGKILL, result.stderr

    _assert_only_the_first_group(store, before)
    store.commit(group((1, 2), [("M1", 2), ("M2", 1)], dead=["bad"]))
    assert [c.master_id for c in store.changes(after_seq=before.last_seq)] == ["M1", "M2"]


def _assert_only_the_first_group(store: ServingWriter, before: object) -> None:
    assert store.status() == before
    assert store.position() == LogPosition(1, 0)
    assert store.master("M1") == StoredMaster(1, document("M1", 1))
    assert store.master("M2") is None
    assert [c.master_id for c in store.changes()] == ["M1"]
    assert store.dead_letters() == []
    assert store.latest_copies(["bad", "msg-M2-1"]) == {}
    assert [r[:2] for r in table(store, "events")] == [("M1", 1)]


def test_the_position_must_advance(store: ServingWriter) -> None:
    store.commit(group((2, 5), [("M1", 1)]))
    for position in ((2, 5), (2, 4), (1, 9)):
        with pytest.raises(PositionConflict, match="not after the stored"):
            store.commit(group(position, [("M2", 1)]))
    assert store.position() == LogPosition(2, 5)
    assert store.master("M2") is None
    store.commit(group((3, 0), [("M2", 1)]))
    assert store.position() == LogPosition(3, 0)


def test_two_writers_the_second_is_refused(
    open_writers: Callable[[], ServingWriter],
) -> None:
    first, second = open_writers(), open_writers()
    first.commit(group((1, 0), [("M1", 1)]))
    with pytest.raises(PositionConflict):
        second.commit(group((1, 0), [("M1", 1)]))
    assert len(second.changes()) == 1


def test_the_writer_reads_its_state_back(store: ServingWriter) -> None:
    store.commit(group((1, 1), [("M1", 1), ("M2", 1)]))
    state = store.masters_state(["M1", "M2", "M9", "M1"])
    assert sorted(state) == ["M1", "M2"]
    assert state["M1"].version == 1 and state["M1"].document == document("M1", 1)
    assert state["M1"].message_id == "msg-M1-1"
    assert not state["M1"].stale and not state["M1"].filtered
    assert store.masters_state([]) == {}
    assert store.latest_copies(["msg-M1-1", "msg-M2-1", "other"]) == {"msg-M1-1": 1, "msg-M2-1": 1}
    assert store.latest_copies([]) == {}
    # Many ids at once: one parameter whatever the count.
    assert len(store.latest_copies(f"id-{n}" for n in range(50_000))) == 0
    # The dedup window's lower bound: copies in earlier batches are not asked about.
    assert store.latest_copies(["msg-M1-1"], since_batch=1) == {"msg-M1-1": 1}
    assert store.latest_copies(["msg-M1-1"], since_batch=2) == {}
    store.commit(group((3, 0), [], dead=["msg-M1-1"]))  # a later copy, its latest
    assert store.latest_copies(["msg-M1-1"]) == {"msg-M1-1": 3}


def test_a_part_committed_ahead_shows_its_masters_and_waits_for_the_position(
    store: ServingWriter,
) -> None:
    store.commit(group((1, 0), [("M1", 1)]))
    ahead = dataclasses.replace(group((1, 4), [("M2", 1)], first_msg_seq=2), ahead=("M2", "M3"))
    store.commit(ahead)
    assert store.master("M2") == StoredMaster(1, document("M2", 1))
    assert store.position() == LogPosition(1, 0) and store.status().messages == 1
    assert store.ahead() == {"M2": LogPosition(1, 4), "M3": LogPosition(1, 4)}
    # An outcome ahead of the position is not "seen": the rest of its message is still due.
    assert set(store.latest_copies(["msg-M1-1", "msg-M2-1"])) == {"msg-M1-1"}
    with pytest.raises(PositionConflict):
        store.commit(dataclasses.replace(group((1, 0), [("M4", 1)]), ahead=("M4",)))
    rest = dataclasses.replace(group((1, 4), [("M5", 1)], first_msg_seq=3), completes=4)
    store.commit(rest)
    assert store.position() == LogPosition(1, 4) and store.status().messages == 5
    assert store.ahead() == {}
    assert set(store.latest_copies(["msg-M1-1", "msg-M2-1"])) == {"msg-M1-1", "msg-M2-1"}


def test_a_version_1_store_is_upgraded_in_place(store: ServingWriter, store_url: str) -> None:
    store.commit(group((1, 0), [("M1", 1)]))

    def downgrade(conn):
        with store._backend.transaction(conn, write=True):
            conn.execute("DROP TABLE ahead")
            conn.execute("UPDATE position SET schema_version = 1")

    store._backend.run(downgrade)
    store.close()
    with open_writer(store_url) as upgraded:
        assert upgraded.ahead() == {} and upgraded.master("M1") is not None
        version = upgraded._backend.run(
            lambda conn: conn.execute("SELECT schema_version FROM position").fetchone()
        )
        assert tuple(version) == (SCHEMA_VERSION,)


def test_changes_are_paged_in_order(store: ServingWriter) -> None:
    for n in range(1, 6):
        store.commit(group((1, n), [(f"M{n}", 1)]))
    assert [c.seq for c in store.changes(after_seq=0, limit=2)] == [1, 2]
    assert [c.seq for c in store.changes(after_seq=2, limit=2)] == [3, 4]
    assert [c.seq for c in store.changes(after_seq=4)] == [5]
    assert store.changes(after_seq=5) == []
    with pytest.raises(ValueError, match="limit"):
        store.changes(limit=0)


def test_versions_at_a_batch_end(store: ServingWriter) -> None:
    store.commit(group((1, 1), [("M1", 1), ("M2", 1)]))
    store.commit(group((2, 0), [("M1", 2)]))
    store.commit(group((3, 1), [("M1", 3), ("M3", 1)]))

    assert store.versions_at(0) == {}
    assert store.versions_at(1) == {
        "M1": (1, sha(document("M1", 1))),
        "M2": (1, sha(document("M2", 1))),
    }
    at_2 = store.versions_at(2)
    assert at_2["M1"] == (2, sha(document("M1", 2))) and "M3" not in at_2
    assert store.versions_at(3)["M1"] == (3, sha(document("M1", 3)))
    assert store.versions_at(9) == store.versions_at(3)


def test_heartbeat(store: ServingWriter) -> None:
    store.heartbeat()
    first = store.status().heartbeat_at
    assert first is not None
    store.heartbeat()
    second = store.status().heartbeat_at
    assert second is not None and second >= first
    assert store.position() == LogPosition(0, -1)


def test_wait_for_changes_returns_at_once_when_already_past(store: ServingWriter) -> None:
    store.commit(group((1, 0), [("M1", 1)]))
    assert store.wait_for_changes(0, NEVER) == 1


def test_wait_for_changes_returns_the_last_seq_at_the_timeout(store: ServingWriter) -> None:
    assert store.wait_for_changes(0, 0.05) == 0
    store.commit(group((1, 0), [("M1", 1)]))
    assert store.wait_for_changes(1, 0.05) == 1


def test_wait_for_changes_wakes_on_a_commit_from_another_connection(
    open_readers: Callable[[], ServingReader], store: ServingWriter
) -> None:
    reader, writer = open_readers(), store
    looked = _signal_first_look(reader)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(reader.wait_for_changes(0, NEVER)))
    thread.start()
    assert looked.wait(JOIN_SECONDS)
    # The reader has looked and found nothing: only the commit's wake-up ends its wait.
    writer.commit(group((1, 0), [("M1", 1)]))
    thread.join(JOIN_SECONDS)
    assert not thread.is_alive() and result == [1]


def test_wait_for_changes_wakes_on_a_commit_from_another_process(
    store: ServingWriter, store_url: str
) -> None:
    looked = _signal_first_look(store)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(store.wait_for_changes(0, NEVER)))
    thread.start()
    assert looked.wait(JOIN_SECONDS)
    script = textwrap.dedent(
        f"""
        from sis_platform.serving import open_writer
        from tests.serving.groups import group
        with open_writer({store_url!r}) as store:
            store.commit(group((1, 1), [("M1", 1), ("M2", 1)]))
        """
    )
    subprocess.run([sys.executable, "-c", script], cwd=REPO, check=True)
    thread.join(JOIN_SECONDS)
    assert not thread.is_alive() and result == [2]


def _signal_first_look(store: ServingReader) -> threading.Event:
    """An event set once `store`'s waiter has read the last seq for the first time (its wake-up
    is armed by then)."""
    looked = threading.Event()
    original = store.last_seq

    def last_seq() -> int:
        seq = original()
        looked.set()
        return seq

    store.last_seq = last_seq  # type: ignore[method-assign]
    return looked


def test_a_naive_put_time_is_taken_as_utc(store: ServingWriter) -> None:
    commit = group((1, 0), [("M1", 1)])
    naive = PUT_TIME.replace(tzinfo=None)
    change = dataclasses.replace(commit.changes[0], put_time=naive)
    store.commit(dataclasses.replace(commit, changes=[change]))
    assert store.changes()[0].put_time == PUT_TIME


def test_message_at_names_the_message_applied_at_a_log_position(store: ServingWriter):
    store.commit(group((1, 2), [("M1", 1), ("M2", 1)], dead=["bad-1"]))
    assert store.message_at(LogPosition(1, 1)) == "msg-M2-1"
    assert store.message_at(LogPosition(1, 2)) == "bad-1"
    assert store.message_at(LogPosition(1, 3)) is None


def test_a_halt_is_recorded_read_back_and_cleared(store: ServingWriter):
    assert store.status().halt is None
    store.halt("store-beyond-landing", "first")
    store.halt("store-beyond-landing", "again")
    halt = store.status().halt
    assert halt is not None and (halt.reason, halt.detail) == ("store-beyond-landing", "again")
    assert store.clear_halt() == halt
    assert store.status().halt is None and store.clear_halt() is None
