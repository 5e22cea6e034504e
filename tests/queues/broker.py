"""A real ActiveMQ broker for the tests, run by scripts/activemq.sh in a temporary folder.

`activemq` (session scope) starts one broker on free loopback ports and stops it at the end;
`activemq_tls` (session scope) is a second one that also listens for STOMP over TLS, with
certificates made for the test session (pki.py); `activemq_outage` (function scope) is for tests
that take the broker away and bring it back, and guarantees it is running again afterwards.
Without ActiveMQ installed the tests that need it fail (they are not skipped) and say how to
install it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ports import free_port
from tests.queues.pki import Pki, make_pki

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "activemq.sh"
ACTIVEMQ_JAR = Path("/usr/share/activemq/bin/activemq.jar")
HOST = "127.0.0.1"
START_TIMEOUT_SECONDS = 90.0

NOT_INSTALLED = (
    "ActiveMQ is not installed (no /usr/share/activemq/bin/activemq.jar). Broker tests need a "
    "real broker: run `sudo scripts/activemq.sh install` (Debian package activemq), then rerun."
)


def port_accepts(port: int, host: str = HOST) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


@dataclass
class Broker:
    directory: Path
    stomp_port: int
    openwire_port: int
    host: str = HOST
    ssl_port: int | None = None  # STOMP over TLS, with `pki`'s broker certificate
    pki: Pki | None = None

    @property
    def url(self) -> str:
        return f"stomp://{self.host}:{self.stomp_port}"

    def _run(self, command: str) -> None:
        env = {
            **os.environ,
            "ACTIVEMQ_HOST": self.host,
            "ACTIVEMQ_STOMP_PORT": str(self.stomp_port),
            "ACTIVEMQ_OPENWIRE_PORT": str(self.openwire_port),
            "ACTIVEMQ_START_TIMEOUT": str(int(START_TIMEOUT_SECONDS)),
        }
        if self.ssl_port is not None and self.pki is not None:
            env.update(
                ACTIVEMQ_STOMP_SSL_PORT=str(self.ssl_port),
                ACTIVEMQ_KEYSTORE=str(self.pki.broker_keystore),
                ACTIVEMQ_TRUSTSTORE=str(self.pki.broker_truststore),
                ACTIVEMQ_STORE_PASSWORD=self.pki.store_password,
            )
        result = subprocess.run(
            [str(SCRIPT), command, str(self.directory)],
            env=env,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_SECONDS + 30,
        )
        if result.returncode != 0:
            log = self.directory / "data" / "activemq.log"
            tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
            pytest.fail(
                f"scripts/activemq.sh {command} failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}\n{tail}",
                pytrace=False,
            )

    def start(self) -> None:
        self._run("start")  # returns once the STOMP port accepts connections

    def stop(self) -> None:
        self._run("stop")
        # The script waits for the JVM to exit; the port being closed is what clients see.
        deadline = time.monotonic() + 30
        while port_accepts(self.stomp_port):
            if time.monotonic() > deadline:
                pytest.fail(f"ActiveMQ still accepts on {self.stomp_port} after stop")
            time.sleep(0.1)

    @property
    def running(self) -> bool:
        return port_accepts(self.stomp_port, self.host)

    @contextmanager
    def down(self) -> Iterator[None]:
        """The broker is stopped inside the block and running again after it (same data)."""
        self.stop()
        try:
            yield
        finally:
            self.start()


def require_activemq() -> None:
    if not ACTIVEMQ_JAR.exists():
        pytest.fail(NOT_INSTALLED, pytrace=False)


@pytest.fixture(scope="session")
def activemq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One ActiveMQ 5.17 broker (STOMP on a free loopback port) for the whole test session."""
    require_activemq()
    broker = Broker(
        directory=tmp_path_factory.mktemp("activemq"),
        stomp_port=free_port(),
        openwire_port=free_port(),
    )
    broker.start()
    try:
        yield broker
    finally:
        broker._run("stop")


@pytest.fixture(scope="session")
def activemq_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A broker that also speaks STOMP over TLS (`ssl_port`): its certificate is for
    `localhost` only, signed by `pki.ca_file`, and it requires a client certificate signed by
    the same CA."""
    require_activemq()
    broker = Broker(
        directory=tmp_path_factory.mktemp("activemq-tls"),
        stomp_port=free_port(),
        openwire_port=free_port(),
        ssl_port=free_port(),
        pki=make_pki(tmp_path_factory.mktemp("pki")),
    )
    broker.start()
    try:
        yield broker
    finally:
        broker._run("stop")


@pytest.fixture
def activemq_outage(activemq: Broker) -> Iterator[Broker]:
    """The session broker, for a test that stops and restarts it (`with broker.down(): ...`).
    Whatever the test did, the broker is running again for the next test."""
    yield activemq
    if not activemq.running:
        activemq.start()
