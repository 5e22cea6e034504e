"""The consumer lease and its fence (sis_platform.intake.lease) on real files in tmp_path, with a
clock the test moves by hand."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sis_platform.intake.consumer import BatchLimits, consume_batch
from sis_platform.intake.lease import LEASE_FILE, ConsumerLease, LeaseError, holder_id
from sis_platform.log.landing import LandingZone
from sis_platform.queues.base import FencedOff, QueueSession, ReceivedMessage, new_message_id
from sis_platform.queues.embedded import EmbeddedQueue
from sis_platform.resources import config
from tests.clock import FakeClock

REPO = Path(__file__).resolve().parents[2]
PROD = "prod@test-host-a:101"
DR = "dr@test-host-b:202"


def _messages(n: int) -> list[ReceivedMessage]:
    now = datetime(2026, 11, 21, 14, 30, tzinfo=UTC)
    return [ReceivedMessage(new_message_id(), f"<m n='{i}'/>".encode(), now) for i in range(n)]


def test_first_holder_gets_token_one_and_renewals_keep_it_while_moving_the_expiry(tmp_path):
    clock = FakeClock()
    prod = ConsumerLease(tmp_path, PROD, 60, clock=clock)
    first = prod.acquire()
    assert prod.holds(first)
    assert (first.token, first.previous_holder) == (1, None)
    assert (first.expires_at - clock.now).total_seconds() == 60
    clock.advance(5)
    renewed = prod.acquire()
    assert renewed.token == 1
    assert renewed.acquired_at == first.acquired_at
    assert renewed.renewed_at == clock.now
    assert (renewed.expires_at - clock.now).total_seconds() == 60


def test_standby_sees_the_live_holder_and_leaves_the_lease_alone(tmp_path):
    clock = FakeClock()
    prod = ConsumerLease(tmp_path, PROD, 60, clock=clock)
    dr = ConsumerLease(tmp_path, DR, 60, clock=clock)
    held = prod.acquire()
    stored = (tmp_path / LEASE_FILE).read_bytes()
    clock.advance(59)
    seen = dr.acquire()
    assert not dr.holds(seen)
    assert seen == held
    assert (tmp_path / LEASE_FILE).read_bytes() == stored


def test_standby_takes_over_once_the_lease_expires_with_the_next_token(tmp_path):
    clock = FakeClock()
    prod = ConsumerLease(tmp_path, PROD, 60, clock=clock)
    dr = ConsumerLease(tmp_path, DR, 60, clock=clock)
    prod.acquire()
    clock.advance(60)  # expired at exactly its expiry time
    taken = dr.acquire()
    assert dr.holds(taken)
    assert (taken.token, taken.previous_holder) == (2, PROD)
    # The old holder comes back: it is the standby now, and taking back needs another expiry.
    back = prod.acquire()
    assert not prod.holds(back) and back.token == 2
    clock.advance(61)
    assert prod.acquire().token == 3


def test_an_expired_lease_nobody_took_is_renewed_by_its_holder_with_the_same_token(tmp_path):
    clock = FakeClock()
    prod = ConsumerLease(tmp_path, PROD, 60, clock=clock)
    prod.acquire()
    clock.advance(600)
    again = prod.acquire()
    assert prod.holds(again) and again.token == 1


def test_release_lets_the_standby_take_over_at_once(tmp_path):
    clock = FakeClock()
    prod = ConsumerLease(tmp_path, PROD, 60, clock=clock)
    dr = ConsumerLease(tmp_path, DR, 60, clock=clock)
    prod.acquire()
    dr.release()  # not the holder: no effect
    assert not dr.holds(dr.acquire())
    prod.release()
    taken = dr.acquire()
    assert dr.holds(taken) and taken.token == 2


def test_a_holder_that_died_on_this_host_is_replaced_without_waiting(tmp_path):
    clock = FakeClock()
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead = f"prod@{socket.gethostname()}:{int(child.stdout)}"
    ConsumerLease(tmp_path, dead, 60, clock=clock).acquire()
    restarted = ConsumerLease(tmp_path, holder_id("prod"), 60, clock=clock)
    taken = restarted.acquire()
    assert restarted.holds(taken)
    assert (taken.token, taken.previous_holder) == (2, dead)
    # A live holder on another host is never presumed dead.
    other = ConsumerLease(tmp_path, DR, 60, clock=clock)
    assert not other.holds(other.acquire())


def test_lease_file_is_plain_json_replaced_without_leftovers(tmp_path):
    clock = FakeClock()
    ConsumerLease(tmp_path, PROD, 45, clock=clock).acquire()
    stored = json.loads((tmp_path / LEASE_FILE).read_text())
    assert stored == {
        "holder": PROD,
        "token": 1,
        "acquired_at": "2026-11-21T14:00:00Z",
        "renewed_at": "2026-11-21T14:00:00Z",
        "expires_at": "2026-11-21T14:00:45Z",
        "previous_holder": None,
        "seconds": 45.0,
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lease.json", "lease.lock"]


def test_an_unreadable_lease_file_is_an_error_not_a_takeover(tmp_path):
    (tmp_path / LEASE_FILE).write_text("{not json")
    with pytest.raises(LeaseError, match="not a consumer lease"):
        ConsumerLease(tmp_path, DR).acquire()
    assert (tmp_path / LEASE_FILE).read_text() == "{not json"


def test_concurrent_acquires_from_many_threads_grant_exactly_one_holder(tmp_path):
    clock = FakeClock()
    results: list[bool] = []
    start = threading.Barrier(8)

    def contend(i: int) -> None:
        lease = ConsumerLease(tmp_path, f"t{i}@test-host:{i}", 60, clock=clock)
        start.wait()
        results.append(lease.holds(lease.acquire()))

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]


CONTENDER = """
import sys, pathlib
from sis_platform.intake.lease import ConsumerLease
lease = ConsumerLease(pathlib.Path(sys.argv[1]), sys.argv[2], 60)
sys.stdin.readline()  # start together
print(lease.holds(lease.acquire()))
"""


def test_concurrent_acquires_from_many_processes_grant_exactly_one_holder(tmp_path):
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONTENDER, str(tmp_path), f"p{i}@test-host:{i}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for i in range(6)
    ]
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    outputs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert sorted(outputs) == ["False"] * 5 + ["True"]
    stored = json.loads((tmp_path / LEASE_FILE).read_text())
    assert stored["token"] == 1


LOCK_HOLDER = """
import sys, pathlib
from sis_platform.intake.lease import ConsumerLease
with ConsumerLease(pathlib.Path(sys.argv[1]), "stuck@test-host:1").locked():
    print("locked", flush=True)
    sys.stdin.readline()
"""


def test_a_lock_held_too_long_is_a_lease_error_not_a_hang(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert holder.stdout is not None and holder.stdin is not None
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(LeaseError, match="locked by another process"):
            ConsumerLease(tmp_path, DR, lock_timeout=0.2).acquire()
    finally:
        holder.stdin.write("done\n")
        holder.stdin.close()
        holder.wait(timeout=60)
    # In this process, another thread inside the lock likewise times out instead of hanging.
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with ConsumerLease(tmp_path, PROD).locked():
            inside.set()
            leave.wait(60)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert inside.wait(60)
        with pytest.raises(LeaseError, match="busy in this process"):
            ConsumerLease(tmp_path, DR, lock_timeout=0.2).acquire()
    finally:
        leave.set()
        t.join()
    assert ConsumerLease(tmp_path, DR).acquire().token == 1


def test_a_landed_batch_records_its_fencing_token_and_holder(tmp_path):
    zone = LandingZone(tmp_path)
    lease = ConsumerLease(tmp_path, PROD, clock=FakeClock())
    batch = zone.writer.land(_messages(3), fence=lease.fence(lease.acquire()))
    assert batch.fence_token == 1
    assert zone.catalog.fence_token(batch.key) == 1
    assert zone.catalog.lease_holder(batch.key) == PROD
    assert zone.catalog.read(batch.key).num_rows == 3


def test_landing_without_a_fence_works_as_before_and_records_no_token(tmp_path):
    zone = LandingZone(tmp_path)
    batch = zone.writer.land(_messages(2))
    assert batch.fence_token is None
    assert (
        zone.catalog.fence_token(batch.key) is None and zone.catalog.lease_holder(batch.key) is None
    )


def test_a_stale_token_cannot_land_and_leaves_no_file_behind(tmp_path):
    clock = FakeClock()
    zone = LandingZone(tmp_path)
    prod = ConsumerLease(tmp_path, PROD, 60, clock=clock)
    dr = ConsumerLease(tmp_path, DR, 60, clock=clock)
    stale = prod.fence(prod.acquire())
    zone.writer.land(_messages(1), fence=stale)
    clock.advance(61)
    fresh = dr.fence(dr.acquire())
    with pytest.raises(FencedOff, match=r"now held by dr@test-host-b:202 \(token 2\)"):
        zone.writer.land(_messages(2), fence=stale)
    assert zone.catalog.keys() == ["0000000001"]
    assert list(zone.catalog.tmp_dir.iterdir()) == []
    assert zone.writer.land(_messages(1), fence=fresh).key == "0000000002"
    assert [zone.catalog.fence_token(k) for k in zone.catalog.keys()] == [1, 2]
    with pytest.raises(FencedOff):
        prod.fence(prod.acquire())  # a standby gets no fence at all


class _PausingSession(QueueSession):
    """A real session whose first get is followed by `pause` (the process stops there)."""

    def __init__(self, inner: QueueSession, pause: object) -> None:
        self.inner = inner
        self.pause = pause
        self.paused = False

    def get(self, wait_seconds: float = 0.0) -> ReceivedMessage | None:
        message = self.inner.get(wait_seconds)
        if not self.paused:
            self.paused = True
            self.pause()  # type: ignore[operator]
        return message

    def commit(self) -> None:
        self.inner.commit()

    def backout(self) -> None:
        self.inner.backout()

    def close(self) -> None:
        self.inner.close()


def test_a_holder_paused_past_expiry_cannot_land_and_its_messages_stay_on_the_queue(tmp_path):
    clock = FakeClock()
    zone = LandingZone(tmp_path / "landing")
    queue = EmbeddedQueue(tmp_path / "queue")
    with queue.producer() as producer:
        ids = [producer.put(f"<m n='{i}'/>".encode()) for i in range(5)]
    prod = ConsumerLease(zone.catalog.root, PROD, 60, clock=clock)
    dr = ConsumerLease(zone.catalog.root, DR, 60, clock=clock)
    fence = prod.fence(prod.acquire())
    limits = BatchLimits(max_messages=3, get_wait_seconds=0.05)

    def paused_past_expiry() -> None:
        # While prod sleeps with a message in its unit of work, its lease expires, DR takes
        # over and lands what it can get (the message in prod's unit is invisible to it).
        clock.advance(61)
        with queue.connect() as session:
            consume_batch(session, zone.writer, limits, fence=dr.fence(dr.acquire()))

    with pytest.raises(FencedOff):
        with _PausingSession(queue.connect(), paused_past_expiry) as session:
            consume_batch(session, zone.writer, limits, fence=fence)
    assert [zone.catalog.lease_holder(k) for k in zone.catalog.keys()] == [DR]
    assert [r["message_id"] for r in zone.catalog.iter_messages()] == ids[1:4]
    # Prod backed out: what it got (the first message, and the last one after waking up) is
    # back on the queue, in place, with its backout counted.
    back = queue.browse()
    assert [(m.message_id, m.delivery_count) for m in back] == [(ids[0], 2), (ids[4], 2)]
    with queue.connect() as session:
        consume_batch(session, zone.writer, limits, fence=dr.fence(dr.acquire()))
    # Exactly once, but not in put order: the price of a holder paused mid-tick (intake/lease.py).
    assert [r["message_id"] for r in zone.catalog.iter_messages()] == ids[1:4] + [ids[0], ids[4]]
    assert [zone.catalog.fence_token(k) for k in zone.catalog.keys()] == [2, 2]
    assert queue.depth() == 0


def test_lease_configuration_comes_from_the_environment(tmp_path):
    env = {"SIS_DATA_DIR": str(tmp_path), "SIS_DEPLOYMENT": "dr", "SIS_LEASE_SECONDS": "90"}
    landing = config.resources(env)["landing"]
    assert landing.deployment == "dr" and landing.lease_seconds == 90
    lease = landing.lease()
    assert lease.holder.startswith(f"dr@{socket.gethostname()}:")
    assert lease.root == tmp_path / "landing" and lease.seconds == 90
    default = config.resources({"SIS_DATA_DIR": str(tmp_path)})["landing"]
    assert default.deployment == socket.gethostname() and default.lease_seconds == 60
    with pytest.raises(config.ConfigurationError, match="SIS_LEASE_SECONDS=20"):
        config.resources({"SIS_DATA_DIR": str(tmp_path), "SIS_LEASE_SECONDS": "20"})


def test_a_new_process_of_the_same_deployment_takes_over_at_once_and_fences_the_old(tmp_path):
    # Dagster replaces its code server process: the new one must not stand by for a minute
    # behind its own predecessor, and the predecessor must not land any more.
    clock = FakeClock()
    old = ConsumerLease(tmp_path, f"prod@{socket.gethostname()}:{os.getppid()}", 60, clock=clock)
    stale = old.fence(old.acquire())
    new = ConsumerLease(tmp_path, holder_id("prod"), 60, clock=clock)
    taken = new.acquire()
    assert new.holds(taken) and taken.token == 2
    with pytest.raises(FencedOff):
        LandingZone(tmp_path).writer.land(_messages(1), fence=stale)
    # Another deployment still waits for expiry.
    dr = ConsumerLease(tmp_path, DR, 60, clock=clock)
    assert not dr.holds(dr.acquire())
