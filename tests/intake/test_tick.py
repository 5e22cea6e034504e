"""Intake without Dagster (sis_platform/intake/tick.py): ticks on the real embedded queue, landing
zone and consumer lease under tmp_path, with a clock the test moves by hand. No Spark."""

from __future__ import annotations

import errno
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sis_platform.intake.consumer import BatchLimits
from sis_platform.intake.lease import LEASE_FILE, ConsumerLease, LeaseError
from sis_platform.intake.tick import Intake, IntakeLimits, TickOutcome, TickStatus
from sis_platform.log.landing import ClosedBy, LandingZone
from sis_platform.queues.base import (
    FencedOff,
    QueueProducer,
    QueueSession,
    QueueSource,
    ReceivedMessage,
    SourceUnavailable,
    new_message_id,
)
from sis_platform.queues.embedded import EmbeddedQueue
from tests.clock import FakeClock

REPO = Path(__file__).resolve().parents[2]
PROD = "prod@test-host-a:101"
DR = "dr@test-host-b:202"


class Log:
    """The lines a tick reports, by level."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []
        # The identifiers each line was logged with (sis_platform/runtime/logs.py), by message.
        self.concerning: dict[str, Mapping[str, object]] = {}

    def info(self, msg: str, *, extra: Mapping[str, object] | None = None) -> None:
        self._add("info", msg, extra)

    def warning(self, msg: str, *, extra: Mapping[str, object] | None = None) -> None:
        self._add("warning", msg, extra)

    def error(self, msg: str, *, extra: Mapping[str, object] | None = None) -> None:
        self._add("error", msg, extra)

    def _add(self, level: str, msg: str, extra: Mapping[str, object] | None) -> None:
        self.lines.append((level, msg))
        self.concerning[msg] = extra or {}

    def at(self, level: str) -> list[str]:
        return [msg for lvl, msg in self.lines if lvl == level]


class Platform:
    """One deployment's intake over a queue, landing zone and lease shared under `root`."""

    def __init__(
        self,
        root: Path,
        clock: FakeClock,
        holder: str = PROD,
        source: QueueSource | None = None,
        batch: BatchLimits | None = None,
    ) -> None:
        self.queue = EmbeddedQueue(root / "queue")
        self.zone = LandingZone(root / "landing")
        self.lease = ConsumerLease(self.zone.catalog.root, holder, 60, clock=clock)
        self.log = Log()
        self.intake = Intake(
            source or self.queue,
            self.zone,
            self.lease,
            IntakeLimits(max_runs_in_flight=2, batch=batch or BatchLimits(get_wait_seconds=0.05)),
            log=self.log,
        )

    def put(self, n: int) -> list[str]:
        with self.queue.producer() as producer:
            return [producer.put(f"<m n='{i}'/>".encode()) for i in range(n)]

    def landed(self) -> list[str]:
        return [str(r["message_id"]) for r in self.zone.catalog.iter_messages()]


class Wrapped(QueueSource):
    """The embedded queue, its sessions passed through `wrap`; counts connects."""

    def __init__(self, inner: EmbeddedQueue, wrap: Callable[[QueueSession], QueueSession]) -> None:
        self.inner, self.wrap, self.connects = inner, wrap, 0

    @property
    def description(self) -> str:
        return self.inner.description

    def connect(self) -> QueueSession:
        self.connects += 1
        return self.wrap(self.inner.connect())

    def producer(self) -> QueueProducer:
        return self.inner.producer()


class AfterGets(QueueSession):
    """A real session that calls `then` once it has handed out `n` messages."""

    def __init__(self, inner: QueueSession, n: int, then: Callable[[], None]) -> None:
        self.inner, self.n, self.then, self.got, self.closed = inner, n, then, 0, False

    def get(self, wait_seconds: float = 0.0) -> ReceivedMessage | None:
        if self.got == self.n:
            self.then()
        message = self.inner.get(wait_seconds)
        self.got += message is not None
        return message

    def commit(self) -> None:
        self.inner.commit()

    def backout(self) -> None:
        self.inner.backout()

    def close(self) -> None:
        self.closed = True
        self.inner.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _batches(outcome: TickOutcome) -> list[str]:
    return [b.key for b in outcome.batches]


def test_a_tick_lands_a_batch_commits_the_queue_and_hands_it_on_with_its_anchor(tmp_path, clock):
    p = Platform(tmp_path, clock)
    ids = p.put(5)
    size = sum(len(m.body) for m in p.queue.browse())
    outcome = p.intake.tick(0)
    assert outcome.status is TickStatus.BATCHES and not outcome.failed
    assert outcome.landed is not None and outcome.landed.messages == 5
    assert _batches(outcome) == ["0000000001"] and outcome.last_seq == 1
    (batch,) = outcome.batches
    assert batch.anchor == p.zone.catalog.anchors.read("0000000001")
    assert batch.anchor is not None and batch.anchor.messages == 5
    assert outcome.lease is not None and outcome.lease.token == 1
    assert p.landed() == ids
    assert p.queue.depth() == 0
    assert p.zone.catalog.fence_token("0000000001") == 1
    assert p.zone.catalog.closed_by("0000000001") == ClosedBy.DRAINED
    assert p.log.at("warning") == [f"{PROD} acquired the consumer lease with fencing token 1"]
    [landed_line] = p.log.at("info")
    assert landed_line == (
        f"landed batch 0000000001: 5 message(s), {size} bytes from {p.queue.description}"
    )
    assert p.log.concerning[landed_line] == {"batch": "0000000001"}

    empty = p.intake.tick(0, registered=1)
    assert empty.status is TickStatus.QUEUE_EMPTY and empty.batches == ()
    assert empty.detail.startswith("queue empty: no message within 0.05s (embedded queue ")
    assert empty.detail.endswith("; 1 batch(es) registered so far")


def test_a_standby_lands_nothing_says_who_holds_the_lease_and_leaves_partials_alone(
    tmp_path, clock
):
    prod = Platform(tmp_path, clock)
    dr = Platform(tmp_path, clock, holder=DR)
    prod.put(3)
    assert prod.intake.tick(0).status is TickStatus.BATCHES
    prod.zone.writer.ensure()
    partial = prod.zone.catalog.tmp_dir / "0000000002.parquet.abc.partial"
    partial.write_bytes(b"the holder's batch in progress")
    dr.put(2)
    standby = dr.intake.tick(0)
    assert standby.status is TickStatus.STANDBY and not standby.failed
    assert standby.detail == (
        f"standby: the consumer lease in {dr.zone.catalog.root} is held by {PROD} "
        f"(fencing token 1) until 2026-11-21 14:01:00 UTC; {DR} takes over if it is not renewed "
        "by then"
    )
    assert standby.lease is not None and standby.lease.holder == PROD
    assert partial.exists()
    assert dr.queue.depth() == 2 and dr.zone.catalog.keys() == ["0000000001"]


def test_a_standby_takes_over_once_the_lease_expires_and_hands_on_what_the_holder_landed(
    tmp_path, clock
):
    prod = Platform(tmp_path, clock)
    dr = Platform(tmp_path, clock, holder=DR)
    prod.put(2)
    prod.intake.tick(0)
    clock.advance(60)
    dr.put(1)
    took_over = dr.intake.tick(0)  # never registered anything: batch 1 first, nothing consumed
    assert _batches(took_over) == ["0000000001"] and took_over.landed is None
    assert took_over.lease is not None and took_over.lease.token == 2
    assert dr.log.at("warning") == [
        f"{DR} acquired the consumer lease with fencing token 2, taking over from {PROD}"
    ]
    assert dr.queue.depth() == 1
    assert _batches(dr.intake.tick(0, registered=1)) == ["0000000002"]
    assert prod.intake.tick(0, registered=1).status is TickStatus.STANDBY


def test_backpressure_leaves_messages_on_the_queue_while_runs_are_in_flight(tmp_path, clock):
    p = Platform(tmp_path, clock, batch=BatchLimits(max_messages=2, get_wait_seconds=0.05))
    p.put(5)
    first = p.intake.tick(0)
    assert p.zone.catalog.closed_by(first.batches[0].key) == ClosedBy.MESSAGES
    # In a backlog (the last batch was full), a batch lands ahead of one run in flight...
    second = p.intake.tick(1, registered=1)
    assert _batches(second) == ["0000000002"]
    # ... but not ahead of SIS_MAX_RUNS_IN_FLIGHT of them.
    held = p.intake.tick(2, registered=2)
    assert held.status is TickStatus.BACKPRESSURE and not held.failed
    assert held.detail == (
        "backpressure: 2 batch run(s) queued or running (SIS_MAX_RUNS_IN_FLIGHT=2); messages "
        "wait on the queue and the next batch takes more of them"
    )
    assert p.queue.depth() == 1
    # A batch that was not full is a live feed: the next waits for the one run in flight.
    drained = p.intake.tick(0, registered=2)
    assert p.zone.catalog.closed_by(drained.batches[0].key) == ClosedBy.DRAINED
    p.put(1)
    live = p.intake.tick(1, registered=3)
    assert live.status is TickStatus.BACKPRESSURE
    assert "the last batch, 0000000003, was sealed when the queue ran dry" in live.detail
    assert p.queue.depth() == 1
    assert _batches(p.intake.tick(0, registered=3)) == ["0000000004"]


def test_a_source_outage_is_reported_with_its_error_and_loses_nothing(tmp_path, clock):
    queue = EmbeddedQueue(tmp_path / "queue")

    def lost(session: QueueSession) -> QueueSession:
        def fail() -> None:
            raise SourceUnavailable("connection lost with 2 message(s) in the unit of work")

        return AfterGets(session, 2, fail)

    p = Platform(tmp_path, clock, source=Wrapped(queue, lost))
    ids = p.put(4)
    outcome = p.intake.tick(0)
    assert outcome.status is TickStatus.SOURCE_UNAVAILABLE and outcome.failed
    assert isinstance(outcome.error, SourceUnavailable)
    assert outcome.detail == (
        f"queue unavailable ({queue.description}): connection lost with 2 message(s) in the "
        "unit of work; retrying next tick"
    )
    assert outcome.batches == () and p.zone.catalog.keys() == []
    assert [(m.message_id, m.delivery_count) for m in queue.browse()] == [
        (i, 2 if n < 2 else 1) for n, i in enumerate(ids)
    ]
    # Back again: the next tick lands every message once.
    p.intake.source = queue
    assert _batches(p.intake.tick(0)) == ["0000000001"]
    assert p.landed() == ids


def test_a_landing_outage_fails_the_tick_before_anything_is_got(tmp_path, clock, monkeypatch):
    p = Platform(tmp_path, clock)
    p.put(2)
    p.intake.tick(0)  # the holder from the start
    p.put(1)

    def full() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    # Found by the probe before the first get, or earlier, when the zone's folders are made (a
    # file where the temporary folder belongs).
    monkeypatch.setattr(p.zone.writer, "probe", full)
    probed = p.intake.tick(0, registered=1)
    monkeypatch.undo()
    shutil.rmtree(p.zone.catalog.tmp_dir)
    p.zone.catalog.tmp_dir.write_bytes(b"")
    made = p.intake.tick(0, registered=1)
    for outcome in (probed, made):
        assert outcome.status is TickStatus.LANDING_UNAVAILABLE and outcome.failed
        assert isinstance(outcome.error, OSError)
        assert outcome.detail.startswith(f"landing zone {p.zone.catalog.root} unavailable: ")
        assert outcome.detail.endswith(
            f"; nothing was committed off {p.queue.description}; retrying next tick"
        )
    assert "No space left on device" in probed.detail
    assert [m.delivery_count for m in p.queue.browse()] == [1]


def test_a_holder_that_loses_the_lease_mid_tick_is_fenced_off_and_backs_out(tmp_path, clock):
    queue = EmbeddedQueue(tmp_path / "queue")
    dr = ConsumerLease(tmp_path / "landing", DR, 60, clock=clock)

    def paused(session: QueueSession) -> QueueSession:
        def taken_over() -> None:
            clock.advance(61)
            assert dr.holds(dr.acquire())

        return AfterGets(session, 1, taken_over)

    p = Platform(tmp_path, clock, source=Wrapped(queue, paused))
    ids = p.put(3)
    outcome = p.intake.tick(0)
    assert outcome.status is TickStatus.FENCED_OFF and outcome.failed
    assert isinstance(outcome.error, FencedOff)
    assert outcome.detail.startswith("lost the consumer lease during the tick")
    assert f"now held by {DR} (token 2)" in outcome.detail
    assert outcome.detail.endswith(f"stay on {queue.description} for the holder")
    assert p.zone.catalog.keys() == []
    assert [m.message_id for m in queue.browse()] == ids


def test_an_unreadable_lease_is_an_outage(tmp_path, clock):
    p = Platform(tmp_path, clock)
    p.put(1)
    p.zone.catalog.root.mkdir(parents=True)
    (p.zone.catalog.root / LEASE_FILE).write_text("not a lease")
    outcome = p.intake.tick(0)
    assert outcome.status is TickStatus.LEASE_UNAVAILABLE and outcome.failed
    assert isinstance(outcome.error, LeaseError)
    assert outcome.detail.startswith(f"consumer lease in {p.zone.catalog.root} unavailable: ")
    assert outcome.detail.endswith("; retrying next tick")
    assert p.queue.depth() == 1


def test_the_holder_removes_partial_files_a_crash_left(tmp_path, clock):
    p = Platform(tmp_path, clock)
    p.zone.writer.ensure()
    for n in range(2):
        (p.zone.catalog.tmp_dir / f"0000000001.parquet.{n}.partial").write_bytes(b"half a file")
    p.put(1)
    outcome = p.intake.tick(0)
    assert _batches(outcome) == ["0000000001"]
    assert list(p.zone.catalog.tmp_dir.iterdir()) == []
    assert "removed 2 partial batch file(s) left by a crash" in p.log.at("warning")


def test_a_batch_left_without_its_anchor_gets_it_from_its_landing_file_first(tmp_path, clock):
    p = Platform(tmp_path, clock)
    put = datetime(2026, 11, 21, 12, tzinfo=UTC)
    landed = p.zone.writer.land(
        [ReceivedMessage(new_message_id(), b, put) for b in (b"<a/>", b"<b/>")]
    )
    anchor = p.zone.catalog.anchors.read(landed.key)
    p.zone.catalog.anchors.path(landed.key).unlink()  # a crash between the claim and the anchor
    p.put(1)
    outcome = p.intake.tick(0)
    (batch,) = outcome.batches
    assert (batch.key, batch.anchor) == (landed.key, anchor)
    assert outcome.landed is None and p.queue.depth() == 1  # handed on before consuming more
    assert p.zone.catalog.anchors.read(landed.key) == anchor
    assert p.log.at("warning")[-1] == (
        f"batch {landed.key} had no anchor file (a crash right after it landed): written from "
        "its landing file's metadata"
    )
    assert p.log.concerning[p.log.at("warning")[-1]] == {"batch": landed.key}
    assert p.log.at("error") == []


def test_a_kept_session_serves_every_tick_until_closed_or_failed(tmp_path, clock):
    queue = EmbeddedQueue(tmp_path / "queue")
    sessions: list[AfterGets] = []
    failing = [False]

    def fail() -> None:
        if failing[0]:
            raise SourceUnavailable("connection lost")

    def tracked(session: QueueSession) -> QueueSession:
        sessions.append(AfterGets(session, 0, fail))
        return sessions[-1]

    source = Wrapped(queue, tracked)
    p = Platform(tmp_path, clock, source=source)
    p.intake.keep_session = True
    with p.intake:
        for seq in range(1, 4):
            p.put(1)
            assert _batches(p.intake.tick(0, registered=seq - 1)) == [f"{seq:010d}"]
        assert source.connects == 1 and not sessions[0].closed
    assert sessions[0].closed and p.queue.depth() == 0

    p.put(1)
    failing[0] = True
    assert p.intake.tick(0, registered=3).status is TickStatus.SOURCE_UNAVAILABLE
    assert source.connects == 2 and sessions[1].closed  # a failed session is not reused
    failing[0] = False
    assert _batches(p.intake.tick(0, registered=3)) == ["0000000004"]
    assert source.connects == 3 and not sessions[2].closed
    p.intake.close()
    assert sessions[2].closed


def test_a_per_tick_session_is_closed_at_the_end_of_every_tick(tmp_path, clock):
    queue = EmbeddedQueue(tmp_path / "queue")
    sessions: list[AfterGets] = []

    def tracked(session: QueueSession) -> QueueSession:
        sessions.append(AfterGets(session, -1, lambda: None))
        return sessions[-1]

    p = Platform(tmp_path, clock, source=Wrapped(queue, tracked))
    p.put(1)
    p.intake.tick(0)
    p.intake.tick(0, registered=1)
    assert len(sessions) == 2 and all(s.closed for s in sessions)


def test_intake_imports_neither_dagster_nor_spark():
    script = (
        "import sys, sis_platform.intake.tick; "
        "print(sorted(m for m in ('dagster', 'pyspark') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert out.stdout.strip() == "[]"


def test_a_caller_position_beyond_the_zone_fails_the_tick_and_gets_nothing(tmp_path, clock):
    # The landing zone went back under the caller (restored from an earlier copy): a batch
    # landed now would take a number already registered, and never run.
    p = Platform(tmp_path, clock)
    p.put(1)
    for _ in range(2):
        outcome = p.intake.tick(0, registered=5)
        assert outcome.failed and outcome.status is TickStatus.LANDING_WENT_BACK
        assert "taken batches up to 5, beyond the zone's last one (0)" in outcome.detail
    assert p.zone.catalog.keys() == []
    assert p.queue.depth() == 1
