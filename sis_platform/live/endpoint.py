"""sis-live's HTTP endpoint (SIS_METRICS_ADDRESS): `/metrics` (Prometheus text, or OpenMetrics
when the scraper asks for it), `/healthz` (200 while the loop goes round within
SIS_LIVE_STALL_SECONDS, 503 otherwise) and `/readyz` (200 while alive, holding the consumer
lease and caught up, 503 otherwise), each health answer with its reason in one line of text, from
the heartbeat's verdict (sis_platform/runtime/heartbeat.py `health`).

It runs on daemon threads beside the loop and never waits on it: a scrape reads the metrics and
the last beat, and nothing else. A client cannot exhaust it: at most `MAX_CONNECTIONS` are
served at once (more are closed unanswered), each is closed after `REQUEST_SECONDS` whatever it
sends, only GET (and HEAD) of a request line and headers under http.server's own bounds is read
(no request body ever), and each connection answers one request (HTTP/1.0, no keep-alive).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from socketserver import ThreadingMixIn
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.openmetrics.exposition import (
    CONTENT_TYPE_LATEST as OPENMETRICS_CONTENT_TYPE,
)
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from sis_platform.runtime.heartbeat import Health

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 8  # served at once; Prometheus and two probes need three
REQUEST_SECONDS = 10.0  # a connection is closed this long after it was accepted
TEXT = "text/plain; charset=utf-8"


class MetricsEndpoint:
    """Serves `registry` and `health()` on `host:port` (port 0: any free one) once `start`ed,
    until `close`."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        health: Callable[[], Health],
        *,
        max_connections: int = MAX_CONNECTIONS,
        request_seconds: float = REQUEST_SECONDS,
    ) -> None:
        self._server = _Server(
            (host, port), _handler(registry, health, request_seconds), max_connections
        )
        self._server.request_seconds = request_seconds
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        """`http://host:port` of the endpoint (its paths follow)."""
        host, port = self.address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.5},
            name="sis-live-metrics",
            daemon=True,
        )
        self._thread.start()

    def wait_idle(self, timeout: float) -> bool:
        """Whether every connection the endpoint took has been let go within `timeout` s: a
        client sees its connection end a moment before the endpoint frees its slot."""
        return self._server.wait_idle(timeout)

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()


def start_endpoint(
    address: tuple[str, int], registry: CollectorRegistry, health: Callable[[], Health]
) -> MetricsEndpoint | None:
    """The endpoint on `address`, started; None (logged as an ERROR) when it cannot bind: the
    live path goes on without it, and the probes that use it fail and say so."""
    host, port = address
    try:
        endpoint = MetricsEndpoint(host, port, registry, health)
    except OSError as error:
        log.error(
            "cannot serve metrics and health on %s:%d: %s; going on without", host, port, error
        )
        return None
    endpoint.start()
    log.info("metrics and health on %s/ (/metrics, /healthz, /readyz)", endpoint.url)
    return endpoint


class _Server(ThreadingMixIn, HTTPServer):
    daemon_threads = True
    block_on_close = False
    request_seconds = REQUEST_SECONDS

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], slots: int
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.request_queue_size = slots
        self._slots = slots
        self._in_use = 0
        self._freed = threading.Condition()
        super().__init__(address, handler)

    def wait_idle(self, timeout: float) -> bool:
        with self._freed:
            return self._freed.wait_for(lambda: self._in_use == 0, timeout)

    def _take_slot(self) -> bool:
        with self._freed:
            if self._in_use >= self._slots:
                return False
            self._in_use += 1
            return True

    def _free_slot(self) -> None:
        with self._freed:
            self._in_use -= 1
            self._freed.notify_all()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._take_slot():
            self.shutdown_request(request)  # over the bound: closed unanswered
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._free_slot()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        # The connection's whole life is bounded, not each read: a client trickling a byte at
        # a time would otherwise hold its slot for ever.
        timer = threading.Timer(self.request_seconds, _cut, args=(request,))
        timer.daemon = True
        timer.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            timer.cancel()
            self._free_slot()


def _cut(request: socket.socket) -> None:
    try:
        request.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


def _handler(
    registry: CollectorRegistry, health: Callable[[], Health], request_seconds: float
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = request_seconds  # each read, within the connection's own bound
        server_version = "sis-live"
        sys_version = ""

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self._answer(body=True)

        def do_HEAD(self) -> None:  # noqa: N802
            self._answer(body=False)

        def _answer(self, *, body: bool) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                if "application/openmetrics-text" in self.headers.get("Accept", ""):
                    kind, data = OPENMETRICS_CONTENT_TYPE, openmetrics_latest(registry)
                else:
                    kind, data = CONTENT_TYPE_LATEST, generate_latest(registry)
                self._send(HTTPStatus.OK, kind, data, body)
            elif path in ("/healthz", "/readyz"):
                verdict = health()
                ok = verdict.alive if path == "/healthz" else verdict.ready
                status = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
                self._send(status, TEXT, f"{verdict.reason}\n".encode(), body)
            else:
                self._send(HTTPStatus.NOT_FOUND, TEXT, b"/metrics, /healthz or /readyz\n", body)

        def _send(self, status: HTTPStatus, content_type: str, data: bytes, body: bool) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if body:
                self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s: " + format, self.address_string(), *args)

    return Handler
