"""sis-live's liveness (sis_platform/runtime/heartbeat.py): the loop beats while it consumes, while
it waits on an empty queue and while it stands by; `sis-live health` answers the probes from the
beat alone; and a sis-live frozen under the supervisor is killed and replaced by one that
takes the lease over and becomes ready."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from sis_platform.runtime.heartbeat import Beat, Heartbeat, health, read_beat, write_beat
from sis_platform.simulator.generator import generate_feed
from tests.live.processes import REPO, live_env
from tests.live.running import BOUND_SECONDS, Place, drained, running
from tests.supervised import SupervisedProcess


def beat_of(path: Path) -> Beat:
    beat = read_beat(path)
    assert beat is not None, f"no heartbeat in {path}"
    return beat


def test_health_follows_the_beat() -> None:
    now = 1000.0
    assert not health(None, now, 60).alive
    stale = health(Beat(1, now - 61, True, True), now, 60)
    assert (stale.alive, stale.ready) == (False, False)
    assert "no progress for 61.0 s" in stale.reason
    standby = health(Beat(1, now - 5, False, False), now, 60)
    assert (standby.alive, standby.ready) == (True, False)
    behind = health(Beat(1, now - 5, True, False), now, 60)
    assert (behind.alive, behind.ready) == (True, False)
    ready = health(Beat(1, now, True, True), now, 60)
    assert (ready.alive, ready.ready) == (True, True)
    halted = health(Beat(1, now - 5, False, False, "store beyond the landing"), now, 60)
    assert (halted.alive, halted.ready) == (True, False)
    assert "halted: store beyond the landing" in halted.reason


def test_a_heartbeat_writes_a_changed_state_at_once_and_the_same_one_at_most_once_per_period(
    tmp_path: Path,
) -> None:
    clock = [100.0]
    path = tmp_path / "run" / "beat"
    heartbeat = Heartbeat(path, every=1.0, clock=lambda: clock[0])
    heartbeat.beat(holding=False, caught_up=False)
    assert beat_of(path).at == 100.0
    assert path.parent.stat().st_mode & 0o777 == 0o700
    clock[0] = 100.5
    heartbeat.beat(holding=False, caught_up=False)
    assert beat_of(path).at == 100.0  # the same state within the period: not written
    heartbeat.beat(holding=True, caught_up=False)
    assert (beat_of(path).at, beat_of(path).holding) == (100.5, True)
    clock[0] = 101.6
    heartbeat.beat(holding=True, caught_up=False)
    assert beat_of(path).at == 101.6


def test_a_heartbeat_that_cannot_be_written_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    heartbeat = Heartbeat(blocked / "beat", every=0.0)  # its folder cannot be made
    heartbeat.beat(holding=True, caught_up=True)
    heartbeat.beat(holding=True, caught_up=True)
    assert read_beat(blocked / "beat") is None  # so the beat goes stale: the probe fails
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "cannot write the heartbeat" in caplog.records[0].message


@pytest.mark.timeout(300)
def test_the_loop_beats_while_it_consumes_and_while_the_queue_is_empty(tmp_path: Path) -> None:
    place = Place(tmp_path)
    place.put(list(generate_feed(7, 50)))
    path = tmp_path / "run" / "sis-live.heartbeat"

    def ready(service: object) -> bool:
        beat = read_beat(path)
        return beat is not None and beat.caught_up and drained(service)  # type: ignore[arg-type]

    with running(place, heartbeat=Heartbeat(path, every=0.0)) as service:
        assert service.wait_until(ready, BOUND_SECONDS)
        first = beat_of(path)
        assert health(first, time.monotonic(), 60).ready
        # Nothing more comes: each empty get is a turn of the loop, and beats.
        assert service.wait_until(lambda s: beat_of(path).at > first.at, BOUND_SECONDS)
        assert service.source.depth() == 0  # type: ignore[attr-defined]
        assert beat_of(path).caught_up


@pytest.mark.timeout(300)
def test_a_standby_beats_alive_but_not_ready(tmp_path: Path) -> None:
    place = Place(tmp_path)
    holder = place.lease("the-other-site@host:2")
    assert holder.holds(holder.acquire())
    path = tmp_path / "run" / "sis-live.heartbeat"
    with running(place, heartbeat=Heartbeat(path, every=0.0)) as service:
        assert service.wait_until(lambda s: read_beat(path) is not None, BOUND_SECONDS)
        verdict = health(beat_of(path), time.monotonic(), 60)
        assert not service.holding
    assert (verdict.alive, verdict.ready) == (True, False)
    assert "standing by" in verdict.reason


def probe(tmp_path: Path, heartbeat: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`sis-live health ARGS` as a Kubernetes exec probe runs it."""
    return subprocess.run(
        [sys.executable, "-m", "sis_platform.cli.live", "health", *args],
        cwd=REPO,
        env=live_env(tmp_path / "data", SIS_LIVE_HEARTBEAT_FILE=str(heartbeat)),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_health_command_answers_from_the_heartbeat(tmp_path: Path) -> None:
    path = tmp_path / "run" / "sis-live.heartbeat"
    missing = probe(tmp_path, path)
    assert missing.returncode == 1 and "no heartbeat" in missing.stdout

    write_beat(path, Beat(12345, time.monotonic() - 120, True, True))  # default bound: 60 s
    stale = probe(tmp_path, path)
    assert stale.returncode == 1 and "no progress for" in stale.stdout
    assert probe(tmp_path, path, "--ready").returncode == 1

    write_beat(path, Beat(12345, time.monotonic(), False, False))
    assert probe(tmp_path, path).returncode == 0
    standing_by = probe(tmp_path, path, "--ready")
    assert standing_by.returncode == 1 and "standing by" in standing_by.stdout

    write_beat(path, Beat(12345, time.monotonic(), True, True))
    assert [probe(tmp_path, path, *a).returncode for a in ((), ("--ready",))] == [0, 0]
    assert not (tmp_path / "data").exists()  # a probe makes nothing


# sis-live as sis-run supervises it (sis_platform/cli/run.py), alone, with a 1 s grace.
SUPERVISED_LIVE = textwrap.dedent(
    """
    import sys
    from sis_platform.cli.run import RunOptions, platform_programs
    from sis_platform.runtime.supervisor import Supervisor, SupervisorSettings
    from sis_platform.settings import load_settings
    programs = platform_programs(RunOptions(sim_messages=0), load_settings())
    live = [p for p in programs if p.name == "sis-live"]
    sys.exit(Supervisor(live, SupervisorSettings(grace_seconds=1.0)).run())
    """
)


@pytest.mark.timeout(600)
def test_a_frozen_sis_live_is_killed_and_its_successor_takes_over(tmp_path: Path) -> None:
    data = tmp_path / "data"
    heartbeat = data / "run" / "sis-live.heartbeat"
    # The smallest lease the batch bound allows, and a stall bound above half of it.
    env = live_env(
        data, SIS_BATCH_MAX_SECONDS="5", SIS_LEASE_SECONDS="15", SIS_LIVE_STALL_SECONDS="10"
    )
    sup = SupervisedProcess([sys.executable, "-c", SUPERVISED_LIVE], cwd=REPO, env=env)
    try:
        first = int(sup.expect(r"sis-live: started \(pid (\d+)\)", 60).group(1))
        sup.expect(r"acquired the consumer lease with fencing token 1", 120)
        psutil.Process(first).suspend()  # SIGSTOP: it still holds the lease
        sup.expect(r"sis-live: no progress for [\d.]+ s \(bound 10 s\)", 120)
        sup.expect(r"sis-live: killed by SIGKILL after .*; restart 1 in", 60)
        second = int(sup.expect(r"sis-live: started \(pid (\d+)\)", 60).group(1))
        # The successor stands by until the frozen holder's lease runs out, then takes over.
        sup.expect(r"acquired the consumer lease with fencing token 2, taking over from", 120)
        for _ in range(int(BOUND_SECONDS * 10)):
            beat = read_beat(heartbeat)
            if beat is not None and beat.pid == second and beat.caught_up:
                break
            # Waiting on the supervisor (it must not exit): the beat file has no event to await.
            with pytest.raises(subprocess.TimeoutExpired):
                sup.proc.wait(timeout=0.1)
        ready = probe(tmp_path, heartbeat, "--ready")
        assert ready.returncode == 0, ready.stdout
        assert json.loads(heartbeat.read_text())["pid"] == second != first
    finally:
        sup.kill()
    assert not psutil.pid_exists(first)
