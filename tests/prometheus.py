"""A real Prometheus server for a test (Debian's `prometheus` package, scripts/prometheus.sh):
its own configuration and data folder under the test's temporary folder, listening on a free
loopback port, scraping the targets it is given every second; queried through its HTTP API.

Without Prometheus installed the tests that need it fail (they are not skipped) and say how to
install it."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.ports import free_port

NOT_INSTALLED = (
    "Prometheus is not installed (no `prometheus` on PATH): the monitoring tests need Debian's "
    "package; run `sudo scripts/prometheus.sh install` (scripts/test.sh does it as root)"
)
SCRAPE_SECONDS = 1
POLL_SECONDS = 0.25


def prometheus_binary(name: str = "prometheus") -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(NOT_INSTALLED, pytrace=False)
    return found


class Prometheus:
    """A running server: `query` its API, `wait_for` a query's answer."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc = proc
        self.url = url
        self.log = log

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=30) as response:
            answer = json.loads(response.read())
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to now."""
        return list(self.api("/api/v1/query", query=expr)["result"])

    def value(self, expr: str) -> float | None:
        """The single value of `expr` now (None: no series)."""
        result = self.query(expr)
        if not result:
            return None
        assert len(result) == 1, result
        return float(result[0]["value"][1])

    def equals(self, expr: str, expected: float) -> bool:
        """Whether `expr` is now the single value `expected`."""
        return self.value(expr) == expected

    def wait_for(self, check: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
        """Poll `check` until it holds, or fail after `timeout` seconds. Between polls it waits
        on the server's process, so a server that dies fails the test at once."""
        for _ in range(int(timeout / POLL_SECONDS)):
            if check():
                return
            try:
                code = self.proc.wait(timeout=POLL_SECONDS)
            except subprocess.TimeoutExpired:
                continue
            pytest.fail(f"prometheus exited ({code}) waiting for {what}: {self.tail()}")
        pytest.fail(f"not within {timeout:g} s: {what}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@contextmanager
def prometheus(
    folder: Path, targets: dict[str, str], rules: tuple[Path, ...] = ()
) -> Iterator[Prometheus]:
    """A server in `folder` scraping each job of `targets` (job name: `host:port`) every second,
    with the rule files `rules`; stopped (SIGTERM, then SIGKILL) on leaving."""
    binary = prometheus_binary()
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "prometheus.yml"
    config.write_text(
        json.dumps(  # YAML is a superset of JSON
            {
                "global": {
                    "scrape_interval": f"{SCRAPE_SECONDS}s",
                    "evaluation_interval": f"{SCRAPE_SECONDS}s",
                },
                "rule_files": [str(r) for r in rules],
                "scrape_configs": [
                    {"job_name": job, "static_configs": [{"targets": [target]}]}
                    for job, target in targets.items()
                ],
            }
        )
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = folder / "prometheus.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Prometheus(proc, url, log)
    try:
        server.wait_for(lambda: _ready(url), "prometheus ready", timeout=60)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
