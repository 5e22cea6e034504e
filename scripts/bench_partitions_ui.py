"""How long the Dagster UI takes to show the `batches` partitions of `raw_messages` at a given
number of partitions: a figure for docs/operations.md's partition retention (issue 51), not a
test. Prints the figures; BENCHMARKS.md keeps them with the command and the machine's load.

    .venv/bin/python scripts/bench_partitions_ui.py [--partitions 21600] [--loads 3]

A fresh Dagster instance (on /dev/shm, so filling it costs ~10 ms a materialization rather than
a disk sync each) gets N `batches` partition keys and one runless materialization of
`raw_messages` per key, through the instance's public API. Then dagster-webserver serves the
platform's code location (workspace.yaml) on loopback, and Debian's chromium (headless, driven
by Playwright, as tests/e2e/test_ui.py drives it; scripts/chromium.sh install) opens
`/assets/raw_messages?view=partitions` and waits until it shows "Materialized (N)" (the
partition status computed) and the list of keys: the first load
(Dagster computes and caches the asset's partition status), then `--loads` more, each a fresh
navigation.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
PAGE = "/assets/raw_messages?view=partitions"
OLDEST = "0000000001"
START_SECONDS = 300
PAGE_SECONDS = 300


def fill(home: Path, partitions: int) -> float:
    """N `batches` keys, each with one materialization of raw_messages; seconds taken."""
    import dagster as dg

    started = time.monotonic()
    instance = dg.DagsterInstance.local_temp(tempdir=str(home))
    keys = [f"{seq:010d}" for seq in range(1, partitions + 1)]
    for at in range(0, partitions, 5000):
        instance.add_dynamic_partitions("batches", keys[at : at + 5000])
    for key in keys:
        instance.report_runless_asset_event(
            dg.AssetMaterialization("raw_messages", partition=key, metadata={"messages": 50})
        )
    return time.monotonic() - started


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_serving(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"dagster-webserver exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=5):
                return
        except OSError:
            # The webserver binds its port once the code location has loaded: nothing to
            # await but the port answering.
            time.sleep(1.0)
    raise SystemExit(f"dagster-webserver did not answer within {START_SECONDS} s")


def page_seconds(url: str, partitions: int, loads: int) -> list[float]:
    """The first load's time, then `loads` more."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=PAGE_SECONDS * 1000)
    times = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000}, base_url=url)
            page.set_default_timeout(PAGE_SECONDS * 1000)
            skip = page.get_by_role("button", name="Skip")  # the UI's newsletter prompt
            page.add_locator_handler(skip, lambda button: button.click())
            for _ in range(loads + 1):
                page.goto("about:blank")
                started = time.monotonic()
                page.goto(PAGE)
                # Shown once the partition status is computed: the count materialized, and the
                # list of keys (oldest first).
                expect(page.get_by_text(f"Materialized ({partitions})")).to_be_visible()
                expect(page.get_by_text(OLDEST, exact=True).first).to_be_visible()
                times.append(time.monotonic() - started)
                if os.environ.get("BENCH_SHOT"):
                    page.screenshot(path=os.environ["BENCH_SHOT"], full_page=True)
        finally:
            browser.close()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=21_600)
    parser.add_argument("--loads", type=int, default=3)
    args = parser.parse_args()
    if not CHROMIUM.is_file():
        print(f"{CHROMIUM} is missing: run scripts/chromium.sh install", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="bench-partitions-", dir="/dev/shm"))
    try:
        home, data = base / "dagster", base / "data"
        home.mkdir()
        data.mkdir(mode=0o700)
        filled = fill(home, args.partitions)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "DAGSTER_HOME": str(home), "SIS_DATA_DIR": str(data)}
        webserver = Path(sys.executable).parent / "dagster-webserver"
        command = [str(webserver), "-h", "127.0.0.1", "-p", str(port)]
        command += ["-w", str(REPO / "workspace.yaml")]
        proc = subprocess.Popen(
            command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_until_serving(url, proc)
            times = page_seconds(url, args.partitions, args.loads)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    later = times[1:]
    sys.stdout.write(
        f"partitions: {args.partitions} (one materialization each; filled in {filled:.0f} s)\n"
        f"{PAGE}: first load {times[0]:.1f} s"
        + (
            f"; then median {statistics.median(later):.1f} s "
            f"(min {min(later):.1f}, max {max(later):.1f}) over {len(later)} loads\n"
            if later
            else "\n"
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
