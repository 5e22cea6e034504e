"""EmbeddedQueue specifics: processes sharing one queue, dead-owner detection, helpers."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sis_platform.queues.base import (
    ReceivedMessage,
    SourceUnavailable,
    new_message_id,
)
from sis_platform.queues.embedded import DATABASE_NAME, EmbeddedQueue
from sis_platform.settings import DEFAULT_BACKOUT_THRESHOLD

SPAWN = multiprocessing.get_context("spawn")
DEADLINE_SECONDS = 120.0


@pytest.fixture(autouse=True)
def no_child_process_outlives_its_test() -> Iterator[None]:
    # A test that fails half-way would leave its consumers polling the queue for the rest of
    # the run (seen: one still running 36 minutes after its test failed).
    yield
    for child in multiprocessing.active_children():
        child.kill()
        child.join(DEADLINE_SECONDS)


# -- child processes ------------------------------------------------------------------------


def open_at_once(path: str, barrier: Any, results: Any) -> None:
    barrier.wait()
    try:
        with EmbeddedQueue(Path(path)).connect():
            results.put("opened")
    except SourceUnavailable as e:
        results.put(str(e))


def produce(path: str, count: int) -> None:
    with EmbeddedQueue(Path(path)).producer() as producer:
        for n in range(count):
            producer.put(b"%d" % n)


def consume_until_stopped(path: str, stop: Any, pipe: Any) -> None:
    """Commit units of up to 20 messages (backing every 5th unit out) until told to stop and
    the queue looks empty; report the committed sequence numbers."""
    committed: list[int] = []
    units = 0
    with EmbeddedQueue(Path(path)).connect() as session:
        pipe.send("ready")
        while True:
            got: list[int] = []
            while len(got) < 20:
                m = session.get(0.1)
                if m is None:
                    break
                got.append(int(m.body))
            units += 1
            if got and units % 5 == 0:
                session.backout()
                continue
            session.commit()
            committed.extend(got)
            if not got and stop.is_set():
                break
    pipe.send(committed)


def hold_and_wait(path: str, count: int, pipe: Any) -> None:
    session = EmbeddedQueue(Path(path)).connect()
    pipe.send([session.get(5).message_id for _ in range(count)])  # type: ignore[union-attr]
    pipe.recv()  # killed while waiting here, unit open


def _wait_for(condition: Any, what: str, timeout: float = DEADLINE_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# -- across processes -----------------------------------------------------------------------


def test_producer_and_consumer_processes_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    count = 3000
    producer = SPAWN.Process(target=produce, args=(str(tmp_path), count))
    producer.start()
    committed: list[int] = []
    units = 0
    deadline = time.monotonic() + DEADLINE_SECONDS
    with EmbeddedQueue(tmp_path).connect() as session:
        while len(committed) < count:
            assert time.monotonic() < deadline, f"only {len(committed)} of {count} consumed"
            got: list[ReceivedMessage] = []
            while len(got) < 50:
                m = session.get(0.2)
                if m is None:
                    break
                got.append(m)
            units += 1
            if got and units % 7 == 0:
                session.backout()  # comes back first, so commit order stays put order
                continue
            session.commit()
            committed.extend(int(m.body) for m in got)
    producer.join(DEADLINE_SECONDS)
    assert producer.exitcode == 0
    assert committed == list(range(count))
    assert EmbeddedQueue(tmp_path).depth() == 0


def test_two_consumer_processes_never_get_the_same_message(tmp_path: Path) -> None:
    count = 2000
    producer = SPAWN.Process(target=produce, args=(str(tmp_path), count))
    stop = SPAWN.Event()
    pipes = [SPAWN.Pipe() for _ in range(2)]
    consumers = [
        SPAWN.Process(target=consume_until_stopped, args=(str(tmp_path), stop, child_end))
        for _, child_end in pipes
    ]
    for consumer in consumers:
        consumer.start()
    # Both consumers are connected before the first put, so they really compete.
    for parent_end, _ in pipes:
        assert parent_end.poll(60) and parent_end.recv() == "ready"
    producer.start()
    producer.join(DEADLINE_SECONDS)
    assert producer.exitcode == 0
    queue = EmbeddedQueue(tmp_path)
    _wait_for(lambda: queue.depth() == 0, "the consumers to empty the queue")
    stop.set()
    results = []
    for parent_end, _ in pipes:
        assert parent_end.poll(DEADLINE_SECONDS), "a consumer did not report"
        results.append(parent_end.recv())
    for consumer in consumers:
        consumer.join(DEADLINE_SECONDS)
        assert consumer.exitcode == 0
    first, second = results
    # Not asserted: that both had work. The embedded queue promises exclusivity, not fairness
    # (SQLite's lock has no queue), and on a loaded machine one consumer can drain it all. The
    # platform runs one consumer at a time anyway (the lease).
    assert not set(first) & set(second)
    assert sorted(first + second) == list(range(count))
    # (No order check: with competing consumers, one backs out while the other moves on, so
    # neither sees the whole queue's order. One consumer does; see the test above.)


@pytest.mark.faults
def test_waiting_get_reinstates_messages_of_a_consumer_killed_meanwhile(tmp_path: Path) -> None:
    queue = EmbeddedQueue(tmp_path)
    with queue.producer() as producer:
        put_id = producer.put(b"held")
    parent_end, child_end = SPAWN.Pipe()
    child = SPAWN.Process(target=hold_and_wait, args=(str(tmp_path), 1, child_end))
    child.start()
    assert parent_end.poll(60)
    assert parent_end.recv() == [put_id]
    result: list[ReceivedMessage | None] = []
    with queue.connect() as session:
        assert session.get(0.0) is None  # held by the live child
        waiter = threading.Thread(target=lambda: result.append(session.get(30.0)))
        waiter.start()
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
        waiter.join(60)
        assert not waiter.is_alive()
        session.commit()
    [m] = result
    assert m is not None and m.message_id == put_id and m.delivery_count == 2
    # The dead session's row and lock file are gone.
    assert list((tmp_path / "sessions").iterdir()) == []


def hold_available_and_wait(path: str, count: int, pipe: Any) -> None:
    session = EmbeddedQueue(Path(path)).connect()
    pipe.send([m.message_id for m in session.get_available(count, 1 << 20)])
    pipe.recv()  # killed while waiting here, unit open


@pytest.mark.faults
def test_messages_a_killed_consumer_took_together_are_all_reinstated(tmp_path: Path) -> None:
    queue = EmbeddedQueue(tmp_path)
    with queue.producer() as producer:
        put_ids = [producer.put(b"%d" % n) for n in range(5)]
    parent_end, child_end = SPAWN.Pipe()
    child = SPAWN.Process(target=hold_available_and_wait, args=(str(tmp_path), 3, child_end))
    child.start()
    assert parent_end.poll(60)
    assert parent_end.recv() == put_ids[:3]
    with queue.connect() as session:
        assert [m.message_id for m in session.get_available(10, 1 << 20)] == put_ids[3:]
        session.backout()
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
        # The next unit's first get reaps the dead session: its three come back in place.
        again = session.get_available(10, 1 << 20)
        session.commit()
    assert [m.message_id for m in again] == put_ids
    assert [m.delivery_count for m in again] == [2, 2, 2, 2, 2]
    assert list((tmp_path / "sessions").iterdir()) == []


# -- in one process -------------------------------------------------------------------------


def test_in_flight_messages_are_invisible_to_other_sessions(tmp_path: Path) -> None:
    queue = EmbeddedQueue(tmp_path)
    with queue.producer() as producer:
        a, b = producer.put(b"a"), producer.put(b"b")
    with queue.connect() as one, queue.connect() as two:
        assert one.get().message_id == a  # type: ignore[union-attr]
        assert two.get().message_id == b  # type: ignore[union-attr]
        assert two.get() is None
        # Opening a session must not mistake a live session in this process for a dead one.
        with queue.connect() as three:
            assert three.get() is None
        one.backout()
        assert two.get().message_id == a  # type: ignore[union-attr]
        one.commit()
        two.commit()
    assert queue.depth() == 0


def test_get_available_stops_at_its_count_and_after_the_body_that_reaches_its_bytes(
    tmp_path: Path,
) -> None:
    queue = EmbeddedQueue(tmp_path)
    with queue.producer() as producer:
        put_ids = [producer.put(b"0123456789") for _ in range(6)]
    with queue.connect() as session:
        assert [m.message_id for m in session.get_available(3, 1 << 20)] == put_ids[:3]
        # 10 bytes are under 15, 20 reach it: the second message ends the claim.
        assert [m.message_id for m in session.get_available(10, 15)] == put_ids[3:5]
        assert [m.message_id for m in session.get_available(10, 1)] == put_ids[5:]
        assert session.get_available(10, 1 << 20) == []
        assert queue.depth(include_in_flight=False) == 0
        session.commit()
    assert queue.depth() == 0


def test_get_available_moves_a_message_past_the_backout_threshold_within_the_unit(
    tmp_path: Path,
) -> None:
    queue = EmbeddedQueue(tmp_path, backout_threshold=2)
    with queue.producer() as producer:
        poison, good, later = producer.put(b"p"), producer.put(b"g"), producer.put(b"l")
    with queue.connect() as session:
        for _ in range(2):
            assert session.get().message_id == poison  # type: ignore[union-attr]
            session.backout()
        # The poison message is marked to move, not returned, and counts toward nothing.
        assert [m.message_id for m in session.get_available(2, 1 << 20)] == [good, later]
        session.backout()  # ... which the backout undoes with the rest
        assert [m.body for m in queue.browse()] == [b"p", b"g", b"l"]
        got = session.get_available(2, 1 << 20)
        assert [(m.message_id, m.delivery_count) for m in got] == [(good, 2), (later, 2)]
        session.commit()
    assert [m.message_id for m in queue.browse_backout()] == [poison]
    assert queue.depth() == 0


def test_depth_counts_in_flight_messages_and_browse_does_not(tmp_path: Path) -> None:
    queue = EmbeddedQueue(tmp_path)
    with queue.producer() as producer:
        put_ids = [producer.put(b"%d" % i) for i in range(3)]
    with queue.connect() as session:
        session.get()
        assert queue.depth() == 3
        assert queue.depth(include_in_flight=False) == 2
        assert [m.message_id for m in queue.browse()] == put_ids[1:]
        session.commit()
    assert queue.depth() == 2


def test_queues_in_one_folder_are_independent(tmp_path: Path) -> None:
    a, b = EmbeddedQueue(tmp_path, queue="A"), EmbeddedQueue(tmp_path, queue="B")
    with a.producer() as producer:
        put_id = producer.put(b"for A")
    assert (a.depth(), b.depth()) == (1, 0)
    with b.connect() as session:
        assert session.get() is None
    with a.connect() as session:
        assert session.get().message_id == put_id  # type: ignore[union-attr]
        session.commit()


def test_put_with_a_given_message_id_makes_a_duplicate(tmp_path: Path) -> None:
    queue = EmbeddedQueue(tmp_path)
    message_id = new_message_id()
    with queue.producer() as producer:
        assert producer.put(b"one", message_id) == message_id
        assert producer.put(b"two", message_id) == message_id
    assert [(m.message_id, m.body) for m in queue.browse()] == [
        (message_id, b"one"),
        (message_id, b"two"),
    ]


def test_backout_queue_defaults_and_can_be_drained(tmp_path: Path) -> None:
    queue = EmbeddedQueue(tmp_path, queue="FEED", backout_threshold=1)
    assert queue.backout_queue == "FEED.BACKOUT"
    with queue.producer() as producer:
        put_id = producer.put(b"poison")
    with queue.connect() as session:
        session.get()
        session.backout()
        assert session.get() is None
        session.commit()
    moved = queue.browse_backout()
    assert [(m.message_id, m.delivery_count) for m in moved] == [(put_id, 2)]
    with queue.backout_source().connect() as session:
        assert session.get().message_id == put_id  # type: ignore[union-attr]
        session.commit()
    assert queue.browse_backout() == []


def test_message_backed_out_past_the_default_threshold_is_moved_and_the_next_delivered(
    tmp_path: Path,
) -> None:
    queue = EmbeddedQueue(tmp_path)  # every setting at its default
    assert (queue.backout_threshold, queue.backout_queue) == (10, "SPORTSDATA.BACKOUT")
    with queue.producer() as producer:
        poison, good = producer.put(b"kills intake"), producer.put(b"good")
    with queue.connect() as session:
        for delivery in range(1, DEFAULT_BACKOUT_THRESHOLD + 1):
            m = session.get()
            assert m is not None and (m.message_id, m.delivery_count) == (poison, delivery)
            session.backout()
        m = session.get()
        assert m is not None and m.message_id == good
        session.commit()
    assert [(m.message_id, m.body) for m in queue.browse_backout()] == [(poison, b"kills intake")]
    assert queue.depth() == 0


def test_backout_threshold_zero_turns_the_move_off(tmp_path: Path) -> None:
    queue = EmbeddedQueue(tmp_path, backout_threshold=0)
    assert "no backout threshold" in queue.description
    with queue.producer() as producer:
        poison = producer.put(b"kills intake")
    with queue.connect() as session:
        for _ in range(DEFAULT_BACKOUT_THRESHOLD + 2):
            m = session.get()
            assert m is not None and m.message_id == poison
            session.backout()
        m = session.get()
        assert m is not None and m.delivery_count == DEFAULT_BACKOUT_THRESHOLD + 3
        session.commit()
    assert queue.browse_backout() == []


def test_database_is_in_wal_mode(tmp_path: Path) -> None:
    with EmbeddedQueue(tmp_path).producer() as producer:
        producer.put(b"x")
    conn = sqlite3.connect(tmp_path / DATABASE_NAME)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def test_closed_session_refuses_work(tmp_path: Path) -> None:
    session = EmbeddedQueue(tmp_path).connect()
    session.close()
    with pytest.raises(RuntimeError):
        session.get()
    with pytest.raises(RuntimeError):
        session.commit()


def test_unusable_folder_is_a_source_outage(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_bytes(b"")
    with pytest.raises(SourceUnavailable):
        EmbeddedQueue(not_a_folder).connect()
    with pytest.raises(SourceUnavailable):
        EmbeddedQueue(not_a_folder).producer()


@pytest.mark.parametrize(
    "kwargs",
    [{"queue": ""}, {"backout_threshold": -1}, {"queue": "Q", "backout_queue": "Q"}],
)
def test_bad_arguments_are_rejected(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        EmbeddedQueue(tmp_path, **kwargs)


def test_consumers_opening_a_new_queue_at_the_same_moment_all_open_it(tmp_path: Path) -> None:
    # Setting up a new database (WAL) from several connections at once can make SQLite fail one of
    # them at once ("database is locked"): about 1 open in 90 at 6 processes without the opening
    # lock, so many rounds. Each round is a new queue, its openers released together by a barrier.
    processes, rounds = 6, 12
    failures = []
    for n in range(rounds):
        barrier, results = SPAWN.Barrier(processes), SPAWN.Queue()
        openers = [
            SPAWN.Process(target=open_at_once, args=(str(tmp_path / f"q{n}"), barrier, results))
            for _ in range(processes)
        ]
        for p in openers:
            p.start()
        outcomes = [results.get(timeout=DEADLINE_SECONDS) for _ in openers]
        for p in openers:
            p.join(DEADLINE_SECONDS)
        failures += [o for o in outcomes if o != "opened"]
    assert failures == []


def test_a_consumer_commit_checkpoints_the_log_off_its_own_thread(tmp_path: Path) -> None:
    queue = EmbeddedQueue(tmp_path)
    with queue.producer() as producer:
        producer.put(b"x")
    with queue.connect() as session:
        assert session.get() is not None
        session.commit()
        checkpointer = session._checkpointer
        assert checkpointer is not None and checkpointer.wait_for(1, DEADLINE_SECONDS)
    assert not checkpointer._thread.is_alive()  # closed with its session
