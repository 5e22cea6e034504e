"""The process supervisor (sis_platform/runtime/supervisor.py) on small stand-in programs: restarts
with backoff, one-shots, gates and readiness, bounded output lines, and a stop that leaves no
descendant alive whatever signal asks for it and however the descendants hid."""

from __future__ import annotations

import json
import re
import signal
import sys
import textwrap
import urllib.request

import psutil
import pytest

from sis_platform.cli.run import RunOptions, platform_programs
from sis_platform.runtime.supervisor import MAX_LINE_BYTES, Backoff, Liveness
from sis_platform.settings import load_settings
from tests.ports import free_port
from tests.supervised import SupervisedProcess

DRIVER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from sis_platform.runtime.supervisor import (
        Backoff, Endpoint, Liveness, Program, Supervisor, SupervisorSettings)
    spec = json.loads(sys.argv[1])
    programs = [
        Program(**{**p, "argv": tuple(p["argv"]), "quiet": tuple(p.get("quiet", ())),
                   "ready_port": Endpoint(*p["ready_port"]) if p.get("ready_port") else None,
                   "liveness": Liveness(Path(p["liveness"][0]), p["liveness"][1])
                   if p.get("liveness") else None})
        for p in spec["programs"]
    ]
    settings = SupervisorSettings(
        backoff=Backoff(**spec["backoff"]), grace_seconds=spec["grace"],
        ready_poll_seconds=0.05)
    sys.exit(Supervisor(programs, settings).run())
    """
)

# Stand-in programs, each a `python -c` script.
FOREVER = "import time\nwhile True: time.sleep(3600)"


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def supervise(
    programs: list[dict],
    *,
    backoff: dict | None = None,
    grace: float = 5.0,
    ignore_sigint: bool = False,
) -> SupervisedProcess:
    spec = {"programs": programs, "backoff": backoff or {"first": 0.05}, "grace": grace}

    def inherit_ignored_sigint() -> None:  # as a background job of a non-interactive shell
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    return SupervisedProcess(
        py(DRIVER) + [json.dumps(spec)],
        preexec_fn=inherit_ignored_sigint if ignore_sigint else None,
    )


def started_pids(sup: SupervisedProcess, name: str) -> list[int]:
    pattern = re.compile(rf"^\[supervisor\] {re.escape(name)}: started \(pid (\d+)\)")
    return [int(m.group(1)) for line in sup.lines if (m := pattern.search(line))]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def cleanup():
    started: list[SupervisedProcess] = []
    yield started.append
    for sup in started:
        sup.kill()


def test_backoff_doubles_up_to_its_bound():
    backoff = Backoff(first=0.5, factor=2.0, most=3.0)
    assert [backoff.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_a_dying_program_is_restarted_with_growing_bounded_backoff(cleanup):
    sup = supervise(
        [{"name": "flaky", "argv": py("import sys; print('dying'); sys.exit(3)")}],
        backoff={"first": 0.1, "factor": 2.0, "most": 0.4, "stable": 3600.0},
    )
    cleanup(sup)
    delays = []
    for restart in range(1, 6):
        m = sup.expect(rf"flaky: exited with 3 after .*; restart {restart} in ([\d.]+) s", 30)
        delays.append(float(m.group(1)))
    assert delays == [0.1, 0.2, 0.4, 0.4, 0.4]
    assert "[flaky] dying" in sup.lines
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.finish(30) == 0
    assert len(started_pids(sup, "flaky")) >= 5


def test_a_stable_run_resets_the_backoff(cleanup):
    # stable=0: every run counts as stable, so every restart is the first again.
    sup = supervise(
        [{"name": "flaky", "argv": py("import sys; sys.exit(1)")}],
        backoff={"first": 0.1, "factor": 2.0, "most": 10.0, "stable": 0.0},
    )
    cleanup(sup)
    for _ in range(3):
        sup.expect(r"flaky: exited with 1 after .*; restart 1 in 0\.1 s", 30)
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.finish(30) == 0


def test_a_program_that_cannot_start_is_retried_not_fatal(cleanup, tmp_path):
    sup = supervise(
        [{"name": "missing", "argv": [str(tmp_path / "no-such-program")]}],
        backoff={"first": 0.05, "stable": 3600.0},
    )
    cleanup(sup)
    sup.expect(r"missing: cannot start .*no-such-program.*; restart 1 in", 30)
    sup.expect(r"missing: cannot start .*; restart 2 in", 30)
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.finish(30) == 0


def test_a_one_shot_exiting_0_is_not_restarted_and_a_failing_one_is(cleanup, tmp_path):
    # The failing one-shot fails at its first run and succeeds at its second.
    marker = tmp_path / "ran-once"
    fail_once = (
        f"import pathlib, sys\np = pathlib.Path({str(marker)!r})\n"
        "if not p.exists():\n    p.touch(); sys.exit(2)\nprint('second run ok')"
    )
    sup = supervise(
        [
            {"name": "ok", "argv": py("print('published')"), "one_shot": True},
            {"name": "retried", "argv": py(fail_once), "one_shot": True},
        ]
    )
    cleanup(sup)
    # With only one-shots, the supervisor ends by itself once they are all done.
    assert sup.finish(60) == 0
    assert len(started_pids(sup, "ok")) == 1
    assert len(started_pids(sup, "retried")) == 2
    assert any(re.search(r"retried: exited with 2 .*; restart 1 in", x) for x in sup.lines)
    assert any(re.search(r"ok: exited with 0 .*; done$", x) for x in sup.lines)
    assert "[retried] second run ok" in sup.lines


def test_programs_after_a_gate_start_once_it_is_ready(cleanup):
    sup = supervise(
        [
            {
                "name": "gate",
                "argv": py(
                    f"print('warming up', flush=True)\nprint('READY', flush=True)\n{FOREVER}"
                ),
                "ready_line": "READY",
                "ready_message": "gate is up",
                "gate": True,
            },
            {"name": "later", "argv": py(FOREVER)},
        ]
    )
    cleanup(sup)
    sup.expect(r"later: started", 60)
    lines = sup.lines
    later_started = len(lines) - 1
    assert lines.index("[gate] READY") < lines.index("[supervisor] gate is up") < later_started
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.finish(30) == 0


def test_ready_means_the_line_was_seen_and_the_port_answers(cleanup):
    port = free_port()
    server = (
        "import http.server, sys\n"
        "print('about to listen', flush=True)\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), "
        "http.server.SimpleHTTPRequestHandler).serve_forever()"
    )
    sup = supervise(
        [
            {
                "name": "web",
                "argv": py(server),
                "ready_line": "about to listen",
                "ready_port": ["127.0.0.1", port],
                "ready_message": f"UI: http://127.0.0.1:{port}",
            }
        ]
    )
    cleanup(sup)
    sup.expect(rf"^\[supervisor\] UI: http://127\.0\.0\.1:{port}$", 60)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as response:
        assert response.status == 200
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.finish(30) == 0


def test_a_line_without_end_is_passed_on_in_bounded_pieces(cleanup):
    size = 5 * MAX_LINE_BYTES + 7
    sup = supervise(
        [
            {
                "name": "chatty",
                "argv": py(f"import sys; sys.stdout.write('x' * {size}); sys.stdout.flush()"),
                "one_shot": True,
            }
        ]
    )
    cleanup(sup)
    assert sup.finish(60) == 0
    pieces = [x[len("[chatty] ") :] for x in sup.lines if x.startswith("[chatty] ")]
    assert "".join(pieces) == "x" * size
    assert max(len(p) for p in pieces) <= MAX_LINE_BYTES


def test_a_program_s_quiet_lines_are_not_echoed(cleanup):
    said = "print('tick: nothing to do'); print('a run was launched'); print('tick: nothing')"
    quiet = {"name": "chatty", "argv": py(said), "one_shot": True, "quiet": ["tick:"]}
    sup = supervise([quiet])
    cleanup(sup)
    assert sup.finish(60) == 0
    assert [x for x in sup.lines if x.startswith("[chatty] ")] == ["[chatty] a run was launched"]


def test_the_daemon_s_tick_chatter_is_quiet(tmp_path):
    settings = load_settings({"SIS_DATA_DIR": str(tmp_path)})
    [daemon] = [p for p in platform_programs(RunOptions(), settings) if p.name == "daemon"]
    assert "Checking for new runs for sensor:" in daemon.quiet


# A program whose descendants try every way out of a plain stop: a grandchild in its group, a
# grandchild that called setsid (its own session and group), and the program itself ignores
# SIGTERM, so only SIGKILL ends it. Each prints its pid.
HIDING = textwrap.dedent(
    """
    import os, signal, subprocess, sys
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    loop = "import time\\nwhile True: time.sleep(3600)"
    # One write(2) each: the three share the pipe, and print() may write in pieces.
    said = "os.write(1, b'{} %d\\\\n' % os.getpid())\\n"
    subprocess.Popen([sys.executable, "-c", "import os; " + said.format("grandchild") + loop])
    escape = "import os; os.setsid(); "
    subprocess.Popen([sys.executable, "-c", escape + said.format("escaped") + loop])
    os.write(1, b"child %d\\n" % os.getpid())
    while True: signal.pause()
    """
)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_leaves_no_descendant_alive(cleanup, stop):
    # SIGINT arrives ignored from the parent (as in a background job): the supervisor must still
    # stop on it.
    sup = supervise(
        [
            {"name": "hiding", "argv": py(HIDING)},
            {"name": "plain", "argv": py(FOREVER)},
        ],
        grace=1.0,
        ignore_sigint=True,
    )
    cleanup(sup)
    # The three lines come in any order.
    hiding = r"^\[hiding\] (child|grandchild|escaped) (\d+)$"
    found = dict(sup.expect(hiding, 60).groups() for _ in range(3))
    assert set(found) == {"child", "grandchild", "escaped"}
    pids = [int(pid) for pid in found.values()]
    pids += started_pids(sup, "plain")
    descendants = psutil.Process(sup.proc.pid).children(recursive=True)
    assert {p.pid for p in descendants} >= set(pids)
    assert len(pids) == 4 and all(alive(p) for p in pids)

    sup.proc.send_signal(stop)
    assert sup.finish(60) == 0, "\n".join(sup.lines[-40:])
    # The supervisor returns only once it saw them all gone (it reaps what was re-parented).
    assert [p for p in pids if alive(p)] == []
    assert [p.pid for p in descendants if alive(p.pid)] == []
    assert any("still running after" in x and "SIGKILL" in x for x in sup.lines)


def test_a_grandchild_orphaned_while_running_is_still_stopped(cleanup):
    # The child starts a grandchild in a new session, passes on its pid and exits; the
    # grandchild is re-parented to the supervisor (its subreaper), which still stops it.
    orphaning = (
        "import subprocess, sys\n"
        "code = 'import os; os.setsid(); print(os.getpid(), flush=True)\\n' + "
        f"{FOREVER!r}\n"
        "p = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE)\n"
        "print('orphan', p.stdout.readline().decode().strip(), flush=True)\n"
    )
    sup = supervise(
        [
            {"name": "parent", "argv": py(orphaning), "one_shot": True},
            {"name": "plain", "argv": py(FOREVER)},
        ]
    )
    cleanup(sup)
    orphan = int(sup.expect(r"^\[parent\] orphan (\d+)$", 60).group(1))
    sup.expect(r"parent: exited with 0 .*; done$", 60)
    assert psutil.Process(orphan).ppid() == sup.proc.pid
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.finish(60) == 0
    assert not alive(orphan)


# A stand-in for sis-live's loop: beats (sis_platform/runtime/heartbeat.py) as it goes round, and
# says so once its first beat is written.
BEATING = textwrap.dedent(
    """
    import pathlib, sys, time
    from sis_platform.runtime.heartbeat import Heartbeat
    heartbeat = Heartbeat(pathlib.Path(sys.argv[1]), every=0.0)
    heartbeat.beat(holding=True, caught_up=True)
    print('beating', flush=True)
    while True:
        time.sleep(0.05)
        heartbeat.beat(holding=True, caught_up=True)
    """
)


@pytest.mark.timeout(240)
def test_a_frozen_program_is_killed_and_restarted(cleanup, tmp_path):
    """SIGSTOP freezes it: it exists but makes no progress. SIGTERM cannot reach a stopped
    process, so the watchdog's SIGKILL after the grace ends it, and it is started again."""
    heartbeat = tmp_path / "run" / "beater.heartbeat"
    sup = supervise(
        [
            {
                "name": "beater",
                "argv": [*py(BEATING), str(heartbeat)],
                "liveness": [str(heartbeat), 5.0],
            }
        ],
        backoff={"first": 0.05, "stable": 3600.0},
        grace=0.5,
    )
    cleanup(sup)
    first = int(sup.expect(r"beater: started \(pid (\d+)\)", 60).group(1))
    sup.expect(r"^\[beater\] beating$", 60)
    psutil.Process(first).suspend()  # SIGSTOP
    sup.expect(r"beater: no progress for [\d.]+ s \(bound 5 s\): SIGTERM, SIGKILL after", 60)
    sup.expect(r"beater: still running after the grace: SIGKILL", 60)
    sup.expect(r"beater: killed by SIGKILL after .*; restart 1 in", 60)
    second = int(sup.expect(r"beater: started \(pid (\d+)\)", 60).group(1))
    sup.expect(r"^\[beater\] beating$", 60)
    assert second != first and not alive(first)
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.finish(60) == 0


@pytest.mark.timeout(240)
def test_a_program_that_never_beats_is_stopped_and_restarted(cleanup, tmp_path):
    """Hung before its first beat (its start is the last sign of progress): SIGTERM ends it,
    and it is started again."""
    heartbeat = tmp_path / "silent.heartbeat"
    sup = supervise(
        [{"name": "silent", "argv": py(FOREVER), "liveness": [str(heartbeat), 1.0]}],
        backoff={"first": 0.05, "stable": 3600.0},
        grace=30.0,
    )
    cleanup(sup)
    first = int(sup.expect(r"silent: started \(pid (\d+)\)", 60).group(1))
    sup.expect(r"silent: no progress for [\d.]+ s \(bound 1 s\)", 60)
    sup.expect(r"silent: killed by SIGTERM after .*; restart 1 in", 60)
    second = int(sup.expect(r"silent: started \(pid (\d+)\)", 60).group(1))
    assert second != first
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.finish(60) == 0


def test_sis_live_is_watched_through_its_heartbeat(tmp_path):
    settings = load_settings(
        {"SIS_DATA_DIR": str(tmp_path), "SIS_LIVE_STALL_SECONDS": "45", "SIS_LEASE_SECONDS": "60"}
    )
    [live] = [p for p in platform_programs(RunOptions(), settings) if p.name == "sis-live"]
    assert live.liveness == Liveness(tmp_path / "run" / "sis-live.heartbeat", 45.0)


def test_platform_programs_follow_the_settings(tmp_path):
    data = tmp_path / "data"
    live = load_settings({"SIS_DATA_DIR": str(data)})
    names = [p.name for p in platform_programs(RunOptions(port=3123), live)]
    assert names == ["sis-live", "sis-feed", "webserver", "daemon"]

    sensor = load_settings({"SIS_DATA_DIR": str(data), "SIS_INTAKE": "sensor"})
    programs = platform_programs(RunOptions(spark="connect", sim_messages=0), sensor)
    assert [p.name for p in programs] == ["spark-connect", "webserver", "daemon"]
    assert [p.gate for p in programs] == [True, True, False]

    web = platform_programs(RunOptions(host="127.0.0.1", port=3123), live)[2]
    assert web.argv[-4:] == ("-h", "127.0.0.1", "-p", "3123")
    assert web.ready_message is not None and "http://127.0.0.1:3123" in web.ready_message
    feed = platform_programs(RunOptions(sim_rate="backlog", sim_messages=5), live)[1]
    assert feed.one_shot
    assert f"embedded://{data / 'queue'}" in feed.argv
    assert feed.argv[-1] == "--backlog"


def test_no_simulator_when_the_source_is_not_the_embedded_queue(tmp_path):
    settings = load_settings({"SIS_DATA_DIR": str(tmp_path), "SIS_SOURCE": "stomp"})
    assert "sis-feed" not in [p.name for p in platform_programs(RunOptions(), settings)]
