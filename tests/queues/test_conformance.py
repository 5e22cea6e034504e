"""One conformance suite for every queue source (tests/queues/sources.py lists them).

Each test runs on a fresh queue. The semantics are IBM MQ's syncpoint gets (base.py); where a
source legitimately differs, its registry entry says so and the test checks the documented
alternative.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sis_platform.queues.base import (
    QueueSession,
    QueueSource,
    ReceivedMessage,
    SourceUnavailable,
)
from tests.queues.sources import SOURCES, Context, SourceKind, Spec, hold_unit_until_killed

JMS_ID = re.compile(r"ID:[0-9a-f]{48}\Z")


@dataclass
class QueueUnderTest:
    kind: SourceKind
    spec: Spec
    ctx: Context
    name: str

    def source(self, backout_threshold: int = 0) -> QueueSource:
        """A new source object on this test's queue."""
        return self.kind.open(self.spec, self.name, backout_threshold)

    @property
    def wait(self) -> float:
        return self.kind.wait_seconds

    def put(self, *bodies: bytes) -> list[str]:
        with self.source().producer() as producer:
            return [producer.put(body) for body in bodies]

    def get_n(self, session: QueueSession, n: int) -> list[ReceivedMessage]:
        got: list[ReceivedMessage] = []
        for _ in range(n):
            message = session.get(self.wait)
            assert message is not None, f"expected {n} messages, got {len(got)}"
            got.append(message)
        return got

    def assert_empty(self, source: QueueSource | None = None) -> None:
        with (source or self.source()).connect() as session:
            assert session.get(0.5) is None
            session.commit()


@pytest.fixture(params=[kind.param() for kind in SOURCES])
def queue(request: pytest.FixtureRequest, tmp_path: Path) -> QueueUnderTest:
    kind: SourceKind = request.param
    ctx = Context(tmp_path=tmp_path, request=request)
    return QueueUnderTest(kind=kind, spec=kind.spec(ctx), ctx=ctx, name=f"T{uuid.uuid4().hex}")


def ids(messages: list[ReceivedMessage]) -> list[str]:
    return [m.message_id for m in messages]


def test_get_returns_messages_in_put_order_with_provider_metadata(queue: QueueUnderTest) -> None:
    before = datetime.now(tz=UTC) - timedelta(seconds=5)
    put_ids = queue.put(*(f"<m n='{i}'/>".encode() for i in range(20)))
    assert all(JMS_ID.match(i) for i in put_ids), put_ids
    assert len(set(put_ids)) == 20
    with queue.source().connect() as session:
        got = queue.get_n(session, 20)
        session.commit()
    assert ids(got) == put_ids
    assert [m.body for m in got] == [f"<m n='{i}'/>".encode() for i in range(20)]
    after = datetime.now(tz=UTC) + timedelta(seconds=5)
    for m in got:
        assert m.put_time.tzinfo is not None and m.put_time.utcoffset() == timedelta(0)
        assert before <= m.put_time <= after
        assert m.delivery_count == 1 and not m.redelivered
        assert dict(m.properties) == {}


def test_get_on_empty_queue_returns_none_after_the_wait(queue: QueueUnderTest) -> None:
    with queue.source().connect() as session:
        assert session.get(0.0) is None
        started = time.monotonic()
        assert session.get(0.4) is None
        assert time.monotonic() - started >= 0.35
        session.commit()


def test_waiting_get_returns_a_message_put_meanwhile(queue: QueueUnderTest) -> None:
    result: list[ReceivedMessage | None] = []
    with queue.source().connect() as session:
        getter = threading.Thread(target=lambda: result.append(session.get(30.0)))
        getter.start()
        [put_id] = queue.put(b"late")
        getter.join(timeout=60)
        assert not getter.is_alive()
        session.commit()
    assert len(result) == 1 and result[0] is not None
    assert result[0].message_id == put_id


def test_committed_messages_are_gone(queue: QueueUnderTest) -> None:
    put_ids = queue.put(b"a", b"b", b"c", b"d")
    with queue.source().connect() as session:
        assert ids(queue.get_n(session, 3)) == put_ids[:3]
        session.commit()
    with queue.source().connect() as session:
        assert ids(queue.get_n(session, 1)) == put_ids[3:]
        session.commit()
    queue.assert_empty()


def test_backout_reinstates_messages_in_order_with_delivery_count_raised(
    queue: QueueUnderTest,
) -> None:
    put_ids = queue.put(b"a", b"b", b"c")
    with queue.source().connect() as session:
        assert ids(queue.get_n(session, 3)) == put_ids
        session.backout()
        again = queue.get_n(session, 3)
        assert ids(again) == put_ids
        assert [(m.delivery_count, m.redelivered) for m in again] == [(2, True)] * 3
        assert [m.body for m in again] == [b"a", b"b", b"c"]
        session.backout()
        third = queue.get_n(session, 3)
        assert ids(third) == put_ids
        assert [m.delivery_count for m in third] == [3, 3, 3]
        session.commit()
    queue.assert_empty()


def gather(queue: QueueUnderTest, session: QueueSession, n: int) -> list[ReceivedMessage]:
    """`n` messages got as sis-live gathers a group: what is available at once, and a waiting
    get when nothing is (a broker's next message may still be on its way)."""
    got: list[ReceivedMessage] = []
    while len(got) < n:
        more = session.get_available(n - len(got), 1 << 30)
        assert len(more) <= n - len(got)
        if not more:
            message = session.get(queue.wait)
            assert message is not None, f"expected {n} messages, got {len(got)}"
            more = [message]
        got.extend(more)
    return got


def test_get_available_takes_messages_in_order_and_backout_restores_them_all(
    queue: QueueUnderTest,
) -> None:
    put_ids = queue.put(*(b"m%d" % i for i in range(7)))
    with queue.source().connect() as session:
        assert ids(gather(queue, session, 7)) == put_ids
        session.backout()
        again = gather(queue, session, 7)
        assert ids(again) == put_ids
        assert [m.delivery_count for m in again] == [2] * 7
        assert [m.body for m in again] == [b"m%d" % i for i in range(7)]
        session.commit()
    queue.assert_empty()


def test_get_available_on_an_empty_queue_takes_nothing(queue: QueueUnderTest) -> None:
    with queue.source().connect() as session:
        assert session.get_available(10, 1 << 20) == []
        assert session.get_available(0, 1 << 20) == []
        session.commit()


def test_partial_backouts_keep_queue_order(queue: QueueUnderTest) -> None:
    """Backing out a unit that took only part of an earlier backed-out run must not move the
    rest ahead of it (ActiveMQ needs strictOrderDispatch for this)."""
    put_ids = queue.put(*(b"m%d" % i for i in range(6)))
    with queue.source().connect() as session:
        queue.get_n(session, 6)
        session.backout()
        assert ids(queue.get_n(session, 2)) == put_ids[:2]
        session.backout()
        assert ids(queue.get_n(session, 6)) == put_ids
        session.commit()


def test_delivery_count_as_seen_by_a_new_source_object(queue: QueueUnderTest) -> None:
    [put_id] = queue.put(b"x")
    source = queue.source()
    with source.connect() as session:
        for _ in range(2):
            assert queue.get_n(session, 1)[0].message_id == put_id
            session.backout()
    with queue.source().connect() as session:
        [m] = queue.get_n(session, 1)
        session.commit()
    assert m.message_id == put_id and m.redelivered
    if queue.kind.exact_delivery_count_after_reopen:
        assert m.delivery_count == 3
    else:
        assert m.delivery_count == 2  # documented lower bound: "redelivered", count unknown


def test_close_without_commit_backs_out(queue: QueueUnderTest) -> None:
    put_ids = queue.put(b"a", b"b")
    source = queue.source()
    session = source.connect()
    assert ids(queue.get_n(session, 2)) == put_ids
    session.close()
    session.close()  # idempotent
    with source.connect() as session:
        again = queue.get_n(session, 2)
        session.commit()
    assert ids(again) == put_ids
    assert all(m.redelivered and m.delivery_count == 2 for m in again)


def test_backout_threshold_moves_message_to_backout_queue(queue: QueueUnderTest) -> None:
    poison, good = queue.put(b"poison", b"good")
    source = queue.source(backout_threshold=2)
    with source.connect() as session:
        for delivery in (1, 2):
            m = queue.get_n(session, 1)[0]
            assert (m.message_id, m.delivery_count) == (poison, delivery)
            session.backout()
        # Backout count 2 reached: the get moves it and returns the next message instead.
        m = queue.get_n(session, 1)[0]
        assert m.message_id == good
        session.commit()
    [moved] = queue.kind.read_backout(source)
    assert moved.message_id == poison and moved.body == b"poison"
    queue.assert_empty(source)


def test_backout_queue_move_is_part_of_the_unit_of_work(queue: QueueUnderTest) -> None:
    [poison] = queue.put(b"poison")
    source = queue.source(backout_threshold=1)
    with source.connect() as session:
        assert queue.get_n(session, 1)[0].message_id == poison
        session.backout()
        assert session.get(0.5) is None  # moved inside the unit, not returned
        session.backout()  # ... so backing out undoes the move
    assert queue.kind.read_backout(source) == []
    with source.connect() as session:
        assert session.get(0.5) is None  # moved again
        session.commit()
    assert ids(queue.kind.read_backout(source)) == [poison]
    queue.assert_empty(source)


def test_one_mebibyte_body_round_trips_byte_exact(queue: QueueUnderTest) -> None:
    body = os.urandom(1024 * 1024)
    [put_id] = queue.put(body)
    with queue.source().connect() as session:
        [m] = queue.get_n(session, 1)
        session.commit()
    assert m.message_id == put_id
    assert len(m.body) == len(body) and m.body == body


def test_binary_bodies_round_trip(queue: QueueUnderTest) -> None:
    bodies = [
        bytes(range(256)),
        b"\x00",
        b"\x00\x00\nMESSAGE\n\n\x00",  # looks like a STOMP frame terminator
        b"\xff\xfe<not-utf8 \xc3\x28>",
        b"line\r\nbreak\rcr",
        "<é ü 🏇/>".encode(),
        b"x" * 70_000,
    ]
    put_ids = queue.put(*bodies)
    with queue.source().connect() as session:
        got = queue.get_n(session, len(bodies))
        session.commit()
    assert ids(got) == put_ids
    assert [m.body for m in got] == bodies


def test_many_messages_in_one_unit_of_work(queue: QueueUnderTest) -> None:
    put_ids = queue.put(*(b"<m n='%d'/>" % i for i in range(500)))
    with queue.source().connect() as session:
        assert ids(queue.get_n(session, 500)) == put_ids
        session.backout()
        again = queue.get_n(session, 500)
        assert ids(again) == put_ids
        assert all(m.delivery_count == 2 for m in again)
        session.commit()
    queue.assert_empty()


@pytest.mark.faults
@pytest.mark.parametrize("replacement", ["after", "waiting"])
def test_crashed_consumer_messages_are_redelivered(queue: QueueUnderTest, replacement: str) -> None:
    """A consumer killed with a unit open: its messages come back, in order, flagged. The
    replacement consumer connects either after the crash, or before it (then it is already
    subscribed while the broker cleans up after the dead one: the harder case)."""
    put_ids = queue.put(b"a", b"b", b"c", b"d")
    with ExitStack() as stack:
        with _crashing_consumer(queue, 3) as held:
            assert held == put_ids[:3]
            if replacement == "waiting":
                session = stack.enter_context(queue.source().connect())
        if replacement == "after":
            session = stack.enter_context(queue.source().connect())
        again = queue.get_n(session, 4)
        session.commit()
    assert ids(again) == put_ids
    assert [m.redelivered for m in again[:3]] == [True, True, True]
    if not queue.kind.prefetch_may_mark_redelivered:
        assert not again[3].redelivered
    if queue.kind.exact_delivery_count_after_reopen:
        assert [m.delivery_count for m in again[:3]] == [2, 2, 2]


@contextmanager
def _crashing_consumer(queue: QueueUnderTest, count: int) -> Iterator[list[str]]:
    """A consumer holding `count` messages in an open unit of work (their ids are yielded)
    that dies at the end of the block: a child process killed with SIGKILL, or the source's
    own crash simulation."""
    if queue.kind.simulate_crash is not None:
        session = queue.source().connect()
        yield ids(queue.get_n(session, count))
        queue.kind.simulate_crash(session)
        return
    spawn = multiprocessing.get_context("spawn")
    parent_end, child_end = spawn.Pipe()
    child = spawn.Process(
        target=hold_unit_until_killed,
        args=(queue.kind.name, queue.spec, queue.name, count, child_end),
    )
    child.start()
    try:
        assert parent_end.poll(60), "consumer process did not report its messages"
        yield parent_end.recv()
    finally:
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
    assert child.exitcode == -signal.SIGKILL


def test_session_recovers_after_the_connection_drops(queue: QueueUnderTest) -> None:
    put_ids = queue.put(b"a", b"b", b"c")
    if queue.kind.outage is None:
        # No server to lose: the documented alternative is that nothing depends on a live
        # connection, i.e. the queue (with its backout counts) survives closing everything.
        source = queue.source()
        with source.connect() as session:
            assert ids(queue.get_n(session, 1)) == put_ids[:1]
        del source
        with queue.source().connect() as session:
            again = queue.get_n(session, 3)
            session.commit()
        assert ids(again) == put_ids
        assert again[0].delivery_count == 2
        return
    source = queue.source()
    session = source.connect()
    try:
        assert ids(queue.get_n(session, 1)) == put_ids[:1]
        with queue.kind.outage(queue.ctx):
            # The unit of work died with the connection: commit must not pretend otherwise.
            with pytest.raises(SourceUnavailable):
                session.commit()
            with pytest.raises(SourceUnavailable):
                session.get(0.1)
            with pytest.raises(SourceUnavailable):
                source.connect()
        # Same session, no unit open: it reconnects by itself.
        again = queue.get_n(session, 3)
        session.commit()
    finally:
        session.close()
    assert ids(again) == put_ids
    assert again[0].redelivered or not queue.kind.redelivered_survives_outage
    queue.assert_empty()


@pytest.fixture
def no_leaked_threads() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    deadline = time.monotonic() + 10
    while leaked and time.monotonic() < deadline:
        leaked[0].join(0.1)
        leaked = [t for t in leaked if t.is_alive()]
    assert not leaked, f"threads left running: {leaked}"


def test_closing_sessions_and_producers_releases_their_threads(
    queue: QueueUnderTest, no_leaked_threads: None
) -> None:
    queue.put(b"a")
    for _ in range(3):
        with queue.source().connect() as session:
            queue.get_n(session, 1)
            session.backout()
    with queue.source().connect() as session:
        queue.get_n(session, 1)
        session.commit()
