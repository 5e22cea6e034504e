"""LiveService in a thread: a simulated feed on the embedded queue drains into the landing zone
and the serving store, which equals the reference pipeline over the landed log; with the store
down meanwhile, landing goes on and the store catches up when it is back."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sis_platform.intake.lease import ConsumerLease
from sis_platform.live.config import LiveConfig
from sis_platform.live.fold import Fold
from sis_platform.log.landing import START_POSITION, GroupWriter, ZoneWriter
from sis_platform.queues.base import SourceUnavailable
from sis_platform.queues.embedded import EmbeddedQueue
from sis_platform.runtime.heartbeat import Heartbeat, health, read_beat
from sis_platform.serving import ServingUnavailable, ServingWriter, open_writer
from sis_platform.simulator.generator import generate_feed
from tests.harness import received
from tests.live.feed import INVALID
from tests.live.running import (
    BOUND_SECONDS,
    CONFIG,
    Place,
    assert_live_equals_reference,
    drained,
    running,
)
from tests.tmpfs import fill, mounted_tmpfs

pytestmark = pytest.mark.cost(25)


def _feed(seed: int, messages: int) -> list[Any]:
    return list(generate_feed(seed, messages, invalid=INVALID, duplicates=0.02))


def test_a_feed_drains_into_the_store_equal_to_the_reference(tmp_path):
    place = Place(tmp_path)
    feed = _feed(21, 400)
    place.put(feed[:150])
    with running(place) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
        place.put(feed[150:])  # while it waits on the queue
        assert service.wait_until(
            lambda s: drained(s) and s.landed_messages == len(feed), BOUND_SECONDS
        )
    assert_live_equals_reference(place, feed)
    # Batches were sealed by their message bound; the open one is left for the next start.
    keys = place.zone.catalog.keys()
    assert len(keys) == len(feed) // CONFIG.batch_max_messages


def test_a_restart_seals_the_open_batch_and_goes_on(tmp_path):
    place = Place(tmp_path)
    feed = _feed(22, 200)
    place.put(feed[:100])
    with running(place) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
    assert len(place.zone.catalog.keys()) == 1  # 70 sealed; 30 in the open batch
    place.put(feed[100:])
    with running(place) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
    assert len(place.zone.catalog.keys()) == 3  # the open one sealed at the start, then 70 more
    assert_live_equals_reference(place, feed)


def test_an_idle_open_batch_is_sealed_by_its_age(tmp_path):
    place = Place(tmp_path)
    feed = _feed(23, 10)
    place.put(feed)
    config = LiveConfig(group_max_messages=20, batch_max_seconds=0.5, idle_wait_seconds=0.2)
    with running(place, config) as service:
        assert service.wait_until(
            lambda s: drained(s) and s.zone.catalog.keys() != [], BOUND_SECONDS
        )
    assert len(place.zone.catalog.keys()) == 1
    assert_live_equals_reference(place, feed)


class _Switch:
    """A store that is down while `down` is set: opening it, and every call of an open one,
    raises ServingUnavailable."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.down = threading.Event()
        self.opened = 0

    def open(self) -> ServingWriter:
        if self.down.is_set():
            raise ServingUnavailable("store switched off by the test")
        self.opened += 1
        return _Flaky(open_writer(self.url), self.down)  # type: ignore[return-value]


class _Flaky:
    def __init__(self, store: ServingWriter, down: threading.Event) -> None:
        self._store, self._down = store, down

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._store, name)
        if name == "close":
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._down.is_set():
                raise ServingUnavailable("store switched off by the test")
            return method(*args, **kwargs)

        return call


# Groups of 20 in batches of 70 that time never seals, retried quickly while the store is down.
STORE_OUTAGE = LiveConfig(
    group_max_messages=20,
    batch_max_messages=70,
    batch_max_seconds=3600.0,
    idle_wait_seconds=0.2,
    retry_first_seconds=0.05,
    retry_last_seconds=0.2,
)


@pytest.mark.parametrize("down_at_start", [True, False], ids=["down-at-start", "down-midway"])
def test_landing_goes_on_while_the_store_is_down_and_the_store_catches_up(tmp_path, down_at_start):
    place = Place(tmp_path)
    feed = _feed(24, 300)
    switch = _Switch(place.url)
    config = STORE_OUTAGE
    if down_at_start:
        switch.down.set()
    else:
        place.put(feed[:100])
    with running(place, config, switch.open) as service:
        if not down_at_start:
            assert service.wait_until(drained, BOUND_SECONDS)
            switch.down.set()
        place.put(feed if down_at_start else feed[100:])
        # Everything is landed and the queue committed while the store is down.
        assert service.wait_until(
            lambda s: s.landed_messages == len(feed) and s.source.depth() == 0, BOUND_SECONDS
        )
        assert service.applier.applied != service.landed_to
        switch.down.clear()
        assert service.wait_until(drained, BOUND_SECONDS)
    assert switch.opened >= (1 if down_at_start else 2)
    assert_live_equals_reference(place, feed)
    assert place.zone.catalog.last_position() != START_POSITION


def test_a_holder_fenced_off_by_a_takeover_lands_nothing_and_stands_by(tmp_path):
    place = Place(tmp_path)
    feed = _feed(25, 60)
    place.put(feed[:20])
    with running(place) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
        landed = place.zone.catalog.last_position()
        # Another deployment whose clock is past the lease's expiry takes it over (token + 1).
        later = datetime.now(UTC) + timedelta(seconds=120)
        other = ConsumerLease(place.zone.catalog.root, "dr@elsewhere:1", 60.0, clock=lambda: later)
        assert other.holds(other.acquire())
        place.put(feed[20:])
        assert service.wait_until(lambda s: not s.holding, BOUND_SECONDS)
        assert place.zone.catalog.last_position() == landed  # the fence let nothing land
        assert place.queue.depth() == len(feed) - 20  # what it got was backed out


class _FlakySource:
    """The embedded queue, unreachable while `down` is set: connecting, and every call of a
    session opened before, raise SourceUnavailable (the session is then lost: closed)."""

    def __init__(self, queue: EmbeddedQueue) -> None:
        self.queue = queue
        self.down = threading.Event()
        self.connects = 0
        self.refused: list[str] = []  # the calls refused while down

    @property
    def description(self) -> str:
        return "flaky " + self.queue.description

    def depth(self) -> int:
        return self.queue.depth()

    def connect(self) -> Any:
        if self.down.is_set():
            self.refused.append("connect")
            raise SourceUnavailable("queue switched off by the test")
        self.connects += 1
        return _FlakySession(self.queue.connect(), self)


class _FlakySession:
    def __init__(self, session: Any, source: _FlakySource) -> None:
        self._session, self._source = session, source

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._session, name)
        if name == "close":
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._source.down.is_set():
                self._source.refused.append(name)
                self._session.close()  # a lost connection: the queue backs the unit out
                raise SourceUnavailable("queue switched off by the test")
            return method(*args, **kwargs)

        return call


def test_a_queue_outage_is_reconnected_and_nothing_is_lost(tmp_path):
    place = Place(tmp_path)
    feed = _feed(26, 200)
    place.put(feed[:100])
    config = LiveConfig(
        group_max_messages=20,
        idle_wait_seconds=0.2,
        retry_first_seconds=0.05,
        retry_last_seconds=0.2,
    )
    source = _FlakySource(place.queue)
    with running(place, config, source=source) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
        source.down.set()
        place.put(feed[100:])
        # The service meets the outage, and tries to reconnect (with backoff) during it.
        assert service.wait_until(lambda s: "connect" in source.refused, BOUND_SECONDS)
        source.down.clear()
        assert service.wait_until(
            lambda s: drained(s) and s.landed_messages >= len(feed), BOUND_SECONDS
        )
    assert source.connects >= 2  # reconnected after the outage
    assert_live_equals_reference(place, feed)


class _WatchedSource:
    """The embedded queue, its sessions watched: every get's wait, and at every commit where
    the store and the landing zone were. With `broker`, its sessions say what a broker's say:
    that they cannot know whether more is available (so a group waits for followers)."""

    def __init__(self, place: Place, broker: bool = False) -> None:
        self.place, self.broker = place, broker
        self.waits: list[float] = []
        self.commits: list[tuple[Any, Any]] = []  # (store position, landing zone's last)

    @property
    def description(self) -> str:
        return "watched " + self.place.queue.description

    def depth(self) -> int:
        return self.place.queue.depth()

    def connect(self) -> Any:
        return _WatchedSession(self.place.queue.connect(), self)


class _WatchedSession:
    def __init__(self, session: Any, source: _WatchedSource) -> None:
        self._session, self._source = session, source
        self.knows_available = session.knows_available and not source.broker

    def get(self, wait_seconds: float = 0.0) -> Any:
        self._source.waits.append(wait_seconds)
        return self._session.get(wait_seconds=wait_seconds)

    def commit(self) -> None:
        store = open_writer(self._source.place.url)
        try:
            self._source.commits.append(
                (store.position(), self._source.place.zone.catalog.last_position())
            )
        finally:
            store.close()
        self._session.commit()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


def test_each_group_is_in_the_store_before_the_queue_is_committed(tmp_path):
    place = Place(tmp_path)
    feed = _feed(29, 100)
    place.put(feed)
    source = _WatchedSource(place)
    config = LiveConfig(group_max_messages=20, idle_wait_seconds=0.2)
    with running(place, config, source=source) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
    assert len(source.commits) == len(feed) // 20
    for store_position, landed in source.commits:
        assert store_position == landed  # the group just landed is already applied
    assert_live_equals_reference(place, feed)


def test_on_a_broker_a_lone_message_is_a_group_at_once_and_a_burst_waits_for_more(tmp_path):
    place = Place(tmp_path)
    feed = _feed(30, 4)
    group_wait = 0.35  # told apart from the idle gets' waits (at most idle_wait_seconds)
    config = LiveConfig(group_wait_seconds=group_wait, idle_wait_seconds=0.2)
    lone = _WatchedSource(place, broker=True)
    place.put(feed[:1])
    with running(place, config, source=lone) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
    assert len(lone.commits) == 1 and group_wait not in lone.waits  # landed without a wait

    burst = _WatchedSource(place, broker=True)
    place.put(feed[1:])  # three at once: the first get has two behind it
    with running(place, config, source=burst) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
    assert len(burst.commits) == 1  # one group of three
    assert burst.waits.count(group_wait) == 1  # then it waited once for a fourth
    assert_live_equals_reference(place, feed)


def test_a_landing_outage_backs_out_once_and_probes_before_getting_more(tmp_path, monkeypatch):
    place = Place(tmp_path)
    feed = _feed(27, 120)
    failing = threading.Event()
    attempts: list[str] = []
    land, probe = GroupWriter.land, ZoneWriter.probe

    def failing_land(self, *args, **kwargs):
        if failing.is_set():
            attempts.append("land")
            raise OSError(28, "No space left on device (the test)")
        return land(self, *args, **kwargs)

    def failing_probe(self):
        if failing.is_set():
            attempts.append("probe")
            raise OSError(28, "No space left on device (the test)")
        return probe(self)

    monkeypatch.setattr(GroupWriter, "land", failing_land)
    monkeypatch.setattr(ZoneWriter, "probe", failing_probe)
    config = LiveConfig(
        group_max_messages=200,
        idle_wait_seconds=0.2,
        retry_first_seconds=0.05,
        retry_last_seconds=0.2,
    )
    with running(place, config) as service:
        failing.set()
        place.put(feed)
        assert service.wait_until(lambda s: attempts.count("probe") >= 3, BOUND_SECONDS)
        failing.clear()
        assert service.wait_until(
            lambda s: drained(s) and s.landed_messages >= len(feed), BOUND_SECONDS
        )
    assert attempts.count("land") == 1  # the probes failed, so nothing more was got
    logged = [
        m.message for m in place.zone.catalog.landed_after(START_POSITION, config.message_limits)
    ]
    assert max(m.delivery_count for m in logged) == 2  # backed out once
    assert_live_equals_reference(place, feed)


def test_a_failing_fold_leaves_landing_going_and_is_retried(tmp_path, monkeypatch):
    place = Place(tmp_path)
    feed = _feed(28, 150)
    broken = threading.Event()
    launch = Fold.launch  # every fold, a group's or a catch-up's, goes through it

    def failing_launch(self, classified, **options):
        if broken.is_set():
            raise ZeroDivisionError("a bug in the fold (the test)")
        return launch(self, classified, **options)

    monkeypatch.setattr(Fold, "launch", failing_launch)
    config = LiveConfig(
        group_max_messages=20,
        idle_wait_seconds=0.2,
        retry_first_seconds=0.05,
        retry_last_seconds=0.2,
    )
    with running(place, config) as service:
        broken.set()
        place.put(feed)
        assert service.wait_until(
            lambda s: s.landed_messages == len(feed) and s.source.depth() == 0, BOUND_SECONDS
        )
        assert service.applier.applied != service.landed_to
        broken.clear()
        assert service.wait_until(drained, BOUND_SECONDS)
    assert_live_equals_reference(place, feed)


def _log_rows(place: Place) -> tuple[list[Any], list[Any]]:
    """The change log and the dead letters, without the times of their commits."""
    store = open_writer(place.url)
    try:
        changes = [c._replace(committed_at=None) for c in store.changes(0, 10_000)]
        dead = [d._replace(recorded_at=None) for d in store.dead_letters(0, 10_000)]
    finally:
        store.close()
    return changes, dead


def test_a_store_put_back_to_an_earlier_copy_refolds_the_same_change_log(tmp_path):
    """The SQLite store commits with synchronous=NORMAL, so a power cut may roll it back to
    an earlier committed state (sis_platform/serving/sqlite.py). Put back to a copy of its
    files taken earlier, as such a cut would leave it, it is caught up from the landing log
    (in other groups than it first committed) to the same change log and dead letters, row
    for row and `seq` for `seq`."""
    place = Place(tmp_path)
    feed = _feed(23, 300)
    place.put(feed[:120])
    with running(place) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
    files = [place.db.with_name(place.db.name + suffix) for suffix in ("", "-wal", "-shm")]
    copies = {f: f.read_bytes() for f in files if f.exists()}
    place.put(feed[120:])
    with running(place) as service:
        assert service.wait_until(
            lambda s: drained(s) and s.applier.messages == len(feed) - 120, BOUND_SECONDS
        )
    first = _log_rows(place)
    assert len(first[0]) > 100 and first[1]  # the feed made changes and dead letters after it

    for f in files:
        f.unlink(missing_ok=True)
    for f, data in copies.items():
        f.write_bytes(data)
    other_groups = dataclasses.replace(CONFIG, group_max_messages=7)
    with running(place, other_groups) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
        assert service.applier.messages == len(feed) - 120  # refolded from the copy's position
    assert _log_rows(place) == first
    assert_live_equals_reference(place, feed)


def test_a_landing_rolled_back_under_the_store_halts_intake_loudly_until_put_right(tmp_path):
    """The landing zone is put back to an earlier copy (a volume snapshot restored) while the
    store keeps its state: new messages would land at positions the store has passed and be
    skipped for good. sis-live gets nothing, records the halt in the store and logs an ERROR;
    once the landing is put right, the halt is cleared and every message is applied."""
    place = Place(tmp_path)
    feed = _feed(29, 150)
    snapshot = _applied_past_a_snapshot(place, feed[:50], feed[50:100])
    latest = tmp_path / "landing-latest"
    shutil.copytree(place.zone.catalog.root, latest)
    _put_back(place.zone.catalog.root, snapshot)
    place.put(feed[100:])

    halted = _error_logged("beyond the landing zone")
    beats = tmp_path / "run" / "sis-live.heartbeat"
    config = dataclasses.replace(CONFIG, retry_first_seconds=0.05)
    with running(place, config, heartbeat=Heartbeat(beats, every=0.0)) as service:
        assert halted.seen.wait(BOUND_SECONDS)
        # Alive (its loop goes round, so no restart) and not ready, saying why: the probes'
        # view of the halt.
        assert service.wait_until(lambda _: _beat_halted(beats), BOUND_SECONDS)
        probe = health(read_beat(beats), time.monotonic(), 60)
    logging.getLogger().removeHandler(halted)
    assert (probe.alive, probe.ready) == (True, False)
    assert "halted" in probe.reason and "beyond the landing zone" in probe.reason
    assert place.queue.depth() == 50  # nothing was got while the store was beyond the landing
    store = open_writer(place.url)
    try:
        status = store.status()
    finally:
        store.close()
    assert status.halt is not None and status.halt.reason == "store-beyond-landing"

    _put_back(place.zone.catalog.root, latest)
    with running(place) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
    store = open_writer(place.url)
    try:
        assert store.status().halt is None
    finally:
        store.close()
    assert_live_equals_reference(place, feed)


def _applied_past_a_snapshot(place: Place, before: list[Any], after: list[Any]) -> Path:
    """`before` applied, a copy of the landing zone taken (its path), then `after` applied:
    the store beyond what the copy holds."""
    place.put(before)
    with running(place) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
    snapshot = place.zone.catalog.root.parent / "landing-snapshot"
    shutil.copytree(place.zone.catalog.root, snapshot)
    place.put(after)
    with running(place) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
    return snapshot


def _beat_halted(path: Path) -> bool:
    beat = read_beat(path)
    return beat is not None and beat.halted is not None


def _put_back(root: Path, copy: Path) -> None:
    shutil.rmtree(root)
    shutil.copytree(copy, root)


class _ErrorSeen(logging.Handler):
    """`seen` is set once an ERROR containing `text` is logged (from any thread)."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.ERROR)
        self.text = text
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


def _error_logged(text: str) -> _ErrorSeen:
    seen = _ErrorSeen(text)
    logging.getLogger().addHandler(seen)
    return seen


def test_a_full_landing_disk_pauses_intake_without_counting_a_delivery(tmp_path):
    """The landing zone's file system is full: nothing is got (so no message is backed out and
    none comes closer to the backout queue), the pause is logged as an ERROR, no partial file
    is left, and every message lands once space returns, delivered once."""
    place = Place(tmp_path)
    feed = _feed(30, 60)
    limits = dataclasses.replace(CONFIG.message_limits, max_message_bytes=64 * 1024)
    config = dataclasses.replace(
        CONFIG,
        batch_max_bytes=256 * 1024,
        message_limits=limits,
        retry_first_seconds=0.05,
        retry_last_seconds=0.2,
    )
    lease = ConsumerLease(tmp_path / "lease", "test@localhost:1", 60.0)  # off the full disk
    with mounted_tmpfs(place.zone.catalog.root, 4 * 1024 * 1024):
        place.zone.writer.ensure()
        ballast = fill(place.zone.catalog.root)
        place.put(feed)
        paused = _error_logged("landing zone")
        try:
            with running(place, config, lease=lease) as service:
                assert paused.seen.wait(BOUND_SECONDS)
                ballast.unlink()
                assert service.wait_until(
                    lambda s: drained(s) and s.landed_messages >= len(feed), BOUND_SECONDS
                )
        finally:
            logging.getLogger().removeHandler(paused)
        assert list(place.zone.catalog.tmp_dir.iterdir()) == []  # no partial file left
        logged = [m.message for m in place.zone.catalog.landed_after(START_POSITION, limits)]
        assert [m.delivery_count for m in logged] == [1] * len(feed)
        assert_live_equals_reference(place, feed)


class _SteppedBack(datetime):
    """The wall clock as sis-live's service reads it, stepped back an hour (NTP, a VM resumed)
    since the open batch was opened."""

    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return datetime.now(tz) - timedelta(hours=1)


def test_an_idle_open_batch_is_sealed_by_its_age_when_the_wall_clock_steps_back(
    tmp_path, monkeypatch
):
    import sis_platform.live.service as service_module

    monkeypatch.setattr(service_module, "datetime", _SteppedBack)
    place = Place(tmp_path)
    feed = _feed(31, 10)
    place.put(feed)
    config = LiveConfig(group_max_messages=20, batch_max_seconds=0.5, idle_wait_seconds=0.2)
    with running(place, config) as service:
        assert service.wait_until(
            lambda s: drained(s) and s.zone.catalog.keys() != [], BOUND_SECONDS
        )
    assert len(place.zone.catalog.keys()) == 1
    assert_live_equals_reference(place, feed)


def test_a_landing_rolled_back_and_landed_past_the_store_again_halts_too(tmp_path):
    """The landing is put back to an earlier copy and then gets more messages than it lost
    before sis-live starts (another writer, or sis-live while the store was unreachable): the
    store's position is within the landing again, but the message there is another one.
    Catching up from there would skip the messages landed after the copy, so it halts."""
    place = Place(tmp_path)
    feed = _feed(32, 110)
    snapshot = _applied_past_a_snapshot(place, feed[:30], feed[30:60])
    _put_back(place.zone.catalog.root, snapshot)
    writer = GroupWriter(place.zone.writer)
    writer.recover()
    for start in range(60, 110, 10):  # 50 more than the copy holds: past the store again
        writer.land(
            [received(m.body, m.message_id) for m in feed[start : start + 10]],
        )
    place.put(feed[:5])  # redelivered copies waiting on the queue: nothing may get them

    halted = _error_logged("differs from the one the store applied")
    with running(place, dataclasses.replace(CONFIG, retry_first_seconds=0.05)):
        assert halted.seen.wait(BOUND_SECONDS)
    logging.getLogger().removeHandler(halted)
    assert place.queue.depth() == 5
    store = open_writer(place.url)
    try:
        status = store.status()
    finally:
        store.close()
    assert status.halt is not None and status.halt.reason == "store-beyond-landing"
