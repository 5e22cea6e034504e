"""Starting the driver (tests/faults/driver.py) in its own process, and making sure that a killed
one leaves nothing running behind it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from sis_platform.runtime.faults import ENV

REPO = Path(__file__).resolve().parents[2]
MARKER = "SIS_FAULT_TEST_PROCESS"
SIGKILLED = -signal.SIGKILL


def drive(
    tmp_path: Path,
    *args: str,
    crash_at: str | None,
    timeout: float = 900,
    extra_env: dict[str, str] | None = None,
    module: str = "tests.faults.driver",
) -> int:
    """Run the driver (or another `module` taking the same --home and --data) with `args` (and
    `SIS_CRASH_AT=crash_at`); returns its exit code (-9 when SIGKILLed), after making sure no
    process it started outlives it."""
    marker = uuid.uuid4().hex
    env = {
        **os.environ,
        # The subprocess imports this checkout (tests and sis_platform), not an installed copy.
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
        ),
        "PYSPARK_PYTHON": sys.executable,
        MARKER: marker,
        **(extra_env or {}),
    }
    env.pop(ENV, None)
    if crash_at:
        env[ENV] = crash_at
    log = tmp_path / f"driver-{args[0]}-{(crash_at or 'clean').replace(',', '+')}-{marker[:6]}.log"
    command = [
        sys.executable,
        "-m",
        module,
        *args,
        "--home",
        str(tmp_path / "dagster"),
        "--data",
        str(tmp_path / "data"),
    ]
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=timeout)
        finally:
            exited = time.monotonic()
            _reap(proc, marker)
    # Where the suite's time goes (one Spark driver start per kill), for whoever tunes it.
    with (tmp_path / "timings.txt").open("a") as timings:
        timings.write(
            f"{' '.join(args)} SIS_CRASH_AT={crash_at}: exit {code} after "
            f"{exited - started:.1f}s, its processes gone {time.monotonic() - exited:.1f}s later\n"
        )
    if code not in (0, SIGKILLED):
        tail = log.read_text(errors="replace")[-4000:]
        raise AssertionError(f"driver {' '.join(args)} exited with {code}; log tail:\n{tail}")
    return code


def _marked(marker: str) -> list[int]:
    """Processes whose environment carries this driver's marker (its JVM, PySpark daemon and
    workers inherit it)."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except (OSError, ValueError):
            continue
    return found


def _reap(proc: subprocess.Popen[bytes], marker: str) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # A dead driver's JVM exits by itself (its gateway pipe closes), and the PySpark daemon
    # then hangs up its workers: bounded polling of that observable end, not a guessed sleep.
    deadline = time.monotonic() + 60
    while (left := _marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"processes {left} outlived the killed driver (orphaned JVM or workers)"
