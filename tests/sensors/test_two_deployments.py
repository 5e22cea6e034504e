"""Production and disaster recovery on one queue and one landing zone (docs/design.md invariant 8):
two sensors, in one process with a hand-moved clock, and in two real processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from sis_platform.intake import lease as lease_module
from sis_platform.intake.lease import ConsumerLease
from sis_platform.log.landing import LandingZone
from sis_platform.queues.base import QueueSession, ReceivedMessage
from sis_platform.queues.embedded import EmbeddedQueue
from tests.clock import FakeClock
from tests.harness import Harness

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(lease_module, "utc_now", fake)
    return fake


def _pair(tmp_path: Path, **env: str) -> tuple[Harness, Harness]:
    common = {"SIS_BATCH_MAX_MESSAGES": "4", **env}
    return (
        Harness(tmp_path, {"SIS_DEPLOYMENT": "prod", **common}),
        Harness(tmp_path, {"SIS_DEPLOYMENT": "dr", **common}),
    )


def _put(h: Harness, n: int) -> list[str]:
    with h.resources["queue"].open().producer() as producer:
        return [producer.put(f"<m n='{i}'/>".encode()) for i in range(n)]


def _landed(zone: LandingZone) -> list[str]:
    return [str(r["message_id"]) for r in zone.catalog.iter_messages()]


def test_only_the_lease_holder_lands_and_the_standby_says_who_holds_it(tmp_path, clock):
    prod, dr = _pair(tmp_path)
    ids = _put(prod, 10)
    assert isinstance(prod.tick(), dg.SensorResult)
    standby = dr.tick()
    assert isinstance(standby, dg.SkipReason)
    message = standby.skip_message or ""
    assert message.startswith("standby: the consumer lease in ")
    assert f"held by prod@{socket.gethostname()}:{os.getpid()} (fencing token 1)" in message
    assert "until 2026-11-21 14:01:00 UTC" in message
    assert prod.drain() == 2
    assert isinstance(dr.tick(), dg.SkipReason)
    assert _landed(prod.zone) == ids
    prod_holder = prod.resources["landing"].lease().holder
    assert {prod.zone.catalog.lease_holder(k) for k in prod.zone.catalog.keys()} == {prod_holder}
    assert dr.requested == [] and dr.instance.get_dynamic_partitions("batches") == []


def test_standby_takes_over_after_the_holder_stops_renewing_with_the_next_token(tmp_path, clock):
    prod, dr = _pair(tmp_path)
    ids = _put(prod, 6)
    prod.tick()
    clock.advance(59)
    assert isinstance(dr.tick(), dg.SkipReason)  # still prod's
    clock.advance(1)  # prod's last renewal was 60 s ago
    # DR's first tick as holder registers what prod landed (its own Dagster instance has never
    # seen it) before consuming anything new.
    first = dr.tick()
    assert isinstance(first, dg.SensorResult)
    assert [r.partition_key for r in first.run_requests] == ["0000000001"]
    assert dr.drain() == 1
    assert _landed(dr.zone) == ids
    assert [dr.zone.catalog.fence_token(k) for k in dr.zone.catalog.keys()] == [1, 2]
    stood_down = prod.tick()
    assert isinstance(stood_down, dg.SkipReason)
    assert "held by dr@" in (stood_down.skip_message or "")
    assert "(fencing token 2)" in (stood_down.skip_message or "")


class _PausingSession(QueueSession):
    """The sensor's real session; after its first message the process "pauses" (`pause`)."""

    def __init__(self, inner: QueueSession, pause: Callable[[], None]) -> None:
        self.inner, self.pause, self.paused = inner, pause, False

    def get(self, wait_seconds: float = 0.0) -> ReceivedMessage | None:
        message = self.inner.get(wait_seconds)
        if message is not None and not self.paused:
            self.paused = True
            self.pause()
        return message

    def commit(self) -> None:
        self.inner.commit()

    def backout(self) -> None:
        self.inner.backout()

    def close(self) -> None:
        self.inner.close()


def test_a_holder_paused_mid_tick_past_its_lease_fails_the_tick_and_lands_nothing(
    tmp_path, clock, monkeypatch
):
    prod, dr = _pair(tmp_path)
    ids = _put(prod, 6)
    # Both sensors share this process's cached queue object (same configuration); the next
    # session it opens, prod's, pauses after its first get.
    source = prod.resources["queue"].open()
    assert source is dr.resources["queue"].open()
    connect = source.connect
    opened: list[QueueSession] = []

    def takeover() -> None:
        clock.advance(61)
        assert isinstance(dr.tick(), dg.SensorResult)

    def connect_first_one_pausing() -> QueueSession:
        session = connect()
        opened.append(session)
        return _PausingSession(session, takeover) if len(opened) == 1 else session

    monkeypatch.setattr(source, "connect", connect_first_one_pausing)
    with pytest.raises(dg.Failure) as failed:
        prod.tick()
    description = failed.value.description or ""
    assert description.startswith("lost the consumer lease during the tick")
    assert "now held by dr@" in description and "(token 2)" in description
    assert f"stay on embedded queue SPORTSDATA in {tmp_path / 'queue'}" in description
    # DR got the four messages prod's unit did not hide from it; prod's are back on the queue.
    assert _landed(dr.zone) == ids[1:5]
    dr.drain()
    assert sorted(_landed(dr.zone)) == sorted(ids)
    assert Counter(_landed(dr.zone)).most_common(1)[0][1] == 1
    assert {dr.zone.catalog.fence_token(k) for k in dr.zone.catalog.keys()} == {2}
    assert isinstance(prod.tick(), dg.SkipReason)


# -- two processes ------------------------------------------------------------------------------

DEPLOYMENT = """
import json, pathlib, sys, time
import dagster as dg
from tests.harness import Harness

data, name, control = pathlib.Path(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])
h = Harness(data, {"SIS_DEPLOYMENT": name, "SIS_LEASE_SECONDS": "3",
                   "SIS_BATCH_MAX_SECONDS": "0.3", "SIS_BATCH_MAX_MESSAGES": "10"})
source = h.resources["queue"].open()
connect = source.connect
stop, idle, freeze = (control / f"{name}.{w}" for w in ("stop", "idle", "freeze"))
log = (control / f"{name}.log").open("a")

class Freezable:
    # A "paused" process: after getting messages (one, or a claim of several), it stops while
    # the freeze file exists.
    def __init__(self, inner):
        self.inner = inner
    def get(self, wait_seconds=0.0):
        m = self.inner.get(wait_seconds)
        if m is not None:
            self.pause_if_frozen()
        return m
    def get_available(self, max_messages, max_bytes):
        got = self.inner.get_available(max_messages, max_bytes)
        if got:
            self.pause_if_frozen()
        return got
    def pause_if_frozen(self):
        if freeze.exists():
            (control / f"{name}.frozen").touch()
            while freeze.exists():
                time.sleep(0.01)
    def __getattr__(self, attr):
        return getattr(self.inner, attr)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.inner.close()

source.connect = lambda: Freezable(connect())
while not stop.exists():
    if idle.exists():  # stopped renewing the lease, but alive
        time.sleep(0.01)
        continue
    try:
        r = h.tick()
        if isinstance(r, dg.SkipReason):
            entry = {"skip": r.skip_message}
        else:
            entry = {"requested": [q.partition_key for q in r.run_requests]}
    except dg.Failure as e:
        entry = {"failure": e.description}
    except Exception as e:
        entry = {"error": repr(e)}
    log.write(json.dumps(entry) + "\\n")
    log.flush()
    time.sleep(0.02)  # the sensor interval, scaled down (pacing, not synchronisation)
"""


def _await(condition: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _entries(control: Path, name: str) -> list[dict[str, Any]]:
    path = control / f"{name}.log"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _batches_by(zone: LandingZone, token: int) -> list[str]:
    return [k for k in zone.catalog.keys() if zone.catalog.fence_token(k) == token]


@pytest.fixture
def deployments(tmp_path: Path) -> Iterator[tuple[Path, dict[str, subprocess.Popen[str]]]]:
    control = tmp_path / "control"
    control.mkdir()
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", DEPLOYMENT, str(tmp_path), name, str(control)],
            cwd=REPO,
            stderr=(control / f"{name}.stderr").open("w"),
            text=True,
        )
        for name in ("prod", "dr")
    }
    yield control, procs
    for name in procs:
        (control / f"{name}.stop").touch()
        for what in ("idle", "freeze"):
            (control / f"{name}.{what}").unlink(missing_ok=True)
    for proc in procs.values():
        proc.wait(timeout=60)


def test_two_deployment_processes_never_land_the_same_batch_and_lose_nothing(tmp_path, deployments):
    control, procs = deployments
    zone = LandingZone(tmp_path / "landing")
    queue = EmbeddedQueue(tmp_path / "queue")
    published: list[str] = []
    producer = queue.producer()

    def feed(n: int) -> None:
        published.extend(producer.put(f"<m n='{len(published) + i}'/>".encode()) for i in range(n))

    # Prod and DR start together; one of them takes the lease, the other stands by. (On a
    # loaded machine a slow tick can lose a 3 s lease on its own: the test follows the lease
    # file instead of assuming token numbers, and any extra handover must be just as clean.)
    lease = ConsumerLease(zone.catalog.root, "test-observer")
    feed(40)
    _await(lambda: zone.catalog.keys(), "a first batch")
    current = _await(lease.read, "a lease")
    holder = current.holder.split("@")[0]
    standby = "dr" if holder == "prod" else "prod"
    _await(
        lambda: any("standby" in e.get("skip", "") for e in _entries(control, standby)),
        f"{standby} standing by",
    )

    def landed_by(name: str, after_token: int) -> bool:
        return any(
            zone.catalog.fence_token(k) > after_token
            and zone.catalog.lease_holder(k).startswith(name)
            for k in zone.catalog.keys()
        )

    # The holder freezes mid-tick with messages in its unit of work, past its lease: the
    # standby takes over (a newer token) and lands; the holder wakes up and is fenced off.
    (control / f"{holder}.freeze").touch()
    feed(40)
    _await(lambda: (control / f"{holder}.frozen").exists(), f"{holder} frozen mid-tick")
    frozen_token = lease.read().token
    _await(lambda: landed_by(standby, frozen_token), f"{standby} landing with a newer token")
    (control / f"{holder}.freeze").unlink()
    _await(
        lambda: any(
            "lost the consumer lease" in e.get("failure", "") for e in _entries(control, holder)
        ),
        f"{holder} fenced off",
    )

    # The new holder stops renewing (alive, idle): the old one takes over again.
    (control / f"{standby}.idle").touch()
    idle_token = lease.read().token
    feed(40)
    _await(lambda: landed_by(holder, idle_token), f"{holder} landing after taking over again")
    (control / f"{standby}.idle").unlink()
    feed(20)
    _await(lambda: sorted(set(_landed(zone))) == sorted(published), "every message landed")
    producer.close()
    for name in procs:
        (control / f"{name}.stop").touch()
    for name, proc in procs.items():
        assert proc.wait(timeout=60) == 0, (control / f"{name}.stderr").read_text()[-3000:]

    landed = _landed(zone)
    assert sorted(landed) == sorted(published)  # every message exactly once, no duplicate
    keys = zone.catalog.keys()
    assert [int(k) for k in keys] == list(range(1, len(keys) + 1))
    tokens = [zone.catalog.fence_token(k) for k in keys]
    assert tokens == sorted(tokens) and len(set(tokens)) >= 3  # fencing tokens only grow
    holders = {(zone.catalog.fence_token(k), zone.catalog.lease_holder(k)) for k in keys}
    assert len(holders) == len(set(tokens))  # one holder per token
    assert {h.split("@")[0] for _, h in holders} == {"prod", "dr"}
    # One unbroken hash chain: no batch was claimed twice or built on a stale predecessor.
    rows = list(zone.catalog.iter_messages())
    assert all(b["prev_link"] == a["chain_link"] for a, b in zip(rows, rows[1:], strict=False))
    for name in procs:
        entries = _entries(control, name)
        assert [e for e in entries if "error" in e] == []
        failures = [e["failure"] for e in entries if "failure" in e]
        assert all(f.startswith("lost the consumer lease") for f in failures), failures
        if name == holder:
            assert failures  # the frozen tick
    assert queue.depth() == 0
