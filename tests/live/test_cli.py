"""The `sis-live` command: --help without the service's imports, its one-off import paid before
the service runs, refusing the sensor intake mode, and a clean stop on SIGTERM (exit 0, the
lease released, the open batch left open)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from datetime import UTC, datetime

from sis_platform.log.landing import START_POSITION
from sis_platform.serving import open_writer
from sis_platform.simulator.generator import generate_feed
from tests.live.processes import REPO, finish, live_env, start_live
from tests.live.running import BOUND_SECONDS, Place


def _python(code: str, tmp_path) -> str:
    """What `code` prints, run by a fresh interpreter in sis-live's environment."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=live_env(tmp_path),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def test_help_does_not_import_the_service(tmp_path):
    code = (
        "import sys; from sis_platform.cli.live import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith(('sis_platform.live', "
        "'sis_platform.log.landing', 'pyarrow', 'lxml'))))"
    )
    out = _python(code, tmp_path)
    assert "usage: sis-live" in out
    assert out.strip().splitlines()[-1] == "[]"


def test_the_first_landings_one_off_import_is_paid_before_the_service_runs(tmp_path):
    # pyarrow imports pandas the first time it builds an array from Python objects: half a
    # second that would fall on the latency of the first message a started sis-live gets.
    code = (
        "import sys, types\n"
        "from sis_platform.live.process import run_until_signalled\n"
        "print('before', 'pandas' in sys.modules)\n"
        "ns = types.SimpleNamespace\n"
        "service = ns(\n"
        "    source=ns(description='a queue'), zone=ns(catalog=ns(root='a zone')),\n"
        "    config=ns(fold=ns(priority=None)), request_stop=lambda: None,\n"
        "    run=lambda: print('running', 'pandas' in sys.modules),\n"
        ")\n"
        "run_until_signalled(service, ns(serving=ns(url='sqlite:///store.db')))\n"
    )
    out = _python(code, tmp_path)
    assert out.splitlines() == ["before False", "running True"]


def test_the_sensor_intake_mode_is_refused(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "sis_platform.cli.live"],
        cwd=REPO,
        env=live_env(tmp_path / "data", SIS_INTAKE="sensor"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "SIS_INTAKE=sensor" in proc.stderr
    assert not (tmp_path / "data").exists()  # nothing was created


def test_sigterm_stops_it_cleanly(tmp_path):
    place = Place(tmp_path / "data")
    feed = list(generate_feed(41, 100))
    place.put(feed)
    log = tmp_path / "sis-live.log"
    proc = start_live(place.root, log)
    try:
        store = _wait_for_store(place, proc)
        last = store.status().last_seq
        while store.position() == START_POSITION or place.queue.depth() > 0:
            assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
            last = store.wait_for_changes(last, 1.0)
        store.close()
    finally:
        proc.send_signal(signal.SIGTERM)
    assert finish(proc, BOUND_SECONDS, log) == 0, log.read_text(errors="replace")[-4000:]
    lease = place.lease().read()
    assert lease is not None and lease.expired(datetime.now(UTC))  # released at the stop
    assert len(place.zone.catalog.keys()) == 1  # 70 sealed; the 30 after them left open
    assert place.zone.catalog.last_position().msg_seq == len(feed) - 70 - 1


def _wait_for_store(place, proc):
    """The store, once sis-live has created it (its doorbell is not there before it is)."""
    opened = None
    for _ in range(int(BOUND_SECONDS * 10)):
        if place.db.exists():
            opened = open_writer(place.url)
            break
        assert proc.poll() is None
        # Waiting on the process (it must not exit): the store file has no event to await
        # before it exists.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.1)
    assert opened is not None, "sis-live never created its serving store"
    return opened


def test_merge_merges_sealed_batches_offline_and_refuses_while_sis_live_holds_the_lease(
    tmp_path,
):
    from sis_platform.log.landing import batch_key
    from sis_platform.log.landing.merge import folder_keys
    from tests.log.grouped import chain_problems, land_in_groups, read_back, sealed_zone

    data = tmp_path / "data"
    zone = sealed_zone(data)
    land_in_groups(zone, batches=3, groups=3, leave_open=True)
    logged = read_back(zone)

    def merge(**variables: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sis_platform.cli.live", "merge"],
            cwd=REPO,
            env=live_env(data, **variables),
            capture_output=True,
            text=True,
            timeout=120,
        )

    held = Place(data).lease("prod@another-host:1")
    held.acquire()
    refused = merge()
    assert refused.returncode == 1 and "held by prod@another-host:1" in refused.stderr
    assert len(folder_keys(zone.upkeep)) == 4
    held.release()

    kept = merge()
    assert kept.returncode == 0, kept.stderr
    assert "3 batch(es) merged into one file; 0 parts folder(s) removed, 3 kept" in kept.stdout
    done = merge(SIS_LANDING_MERGE_GRACE_SECONDS="0")
    assert "0 batch(es) merged into one file; 3 parts folder(s) removed" in done.stdout
    assert folder_keys(zone.upkeep) == [batch_key(4)]  # the open batch stays in parts
    assert read_back(zone) == logged
    assert chain_problems(zone) == []


def test_new_log_retires_the_witness_of_a_removed_data_folder_and_nothing_else(tmp_path):
    import shutil

    from tests.log.grouped import land_in_groups, sealed_zone

    data = tmp_path / "data"
    zone = sealed_zone(data)
    land_in_groups(zone, batches=2, groups=2, leave_open=False)
    witness = zone.catalog.signer.seal.witness.path
    seen = witness.read_bytes()

    def new_log() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sis_platform.cli.live", "new-log"],
            cwd=REPO,
            env=live_env(data),
            capture_output=True,
            text=True,
            timeout=120,
        )

    kept = new_log()  # the log is still there
    assert kept.returncode == 1 and "holds a log through batch 0000000002" in kept.stderr
    shutil.rmtree(data / "landing")
    (data / "lake" / "raw_messages" / "_delta_log").mkdir(parents=True)
    lake_left = new_log()
    assert lake_left.returncode == 1 and "still holds a message log" in lake_left.stderr
    shutil.rmtree(data)
    held = Place(data).lease("prod@another-host:1")
    held.acquire()
    refused = new_log()
    assert refused.returncode == 1 and "held by prod@another-host:1" in refused.stderr
    assert witness.read_bytes() == seen  # untouched by every refusal
    held.release()

    done = new_log()
    assert done.returncode == 0, done.stderr
    assert "batch 0000000002 sealed with" in done.stdout and "starts a new log" in done.stdout
    (retired,) = witness.parent.glob(f"{witness.stem}.retired-*")
    assert retired.read_bytes() == seen and not witness.exists()
    again = new_log()
    assert again.returncode == 0 and "no witness" in again.stdout
