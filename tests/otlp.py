"""An OTLP/HTTP trace receiver on a loopback port, in the test's process: it decodes each
`ExportTraceServiceRequest` (opentelemetry-proto's protobuf) posted to /v1/traces and keeps its
spans, which a test waits for (`wait_for`) and reads (`spans`); and a collector that is down:
a port that refuses, or one that accepts and never answers."""

from __future__ import annotations

import gzip
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

PATH = "/v1/traces"


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind
    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    service: str


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    return getattr(value, which) if which is not None else None


class OtlpReceiver:
    """The receiver's spans, in the order they arrived."""

    def __init__(self) -> None:
        self._spans: list[ReceivedSpan] = []
        self._arrived = threading.Condition()
        self.requests = 0
        self.endpoint = ""  # http://127.0.0.1:PORT (OTEL_EXPORTER_OTLP_ENDPOINT)

    @property
    def traces_url(self) -> str:
        return self.endpoint + PATH

    def spans(self) -> list[ReceivedSpan]:
        with self._arrived:
            return list(self._spans)

    def wait_for(self, done: Callable[[list[ReceivedSpan]], bool], timeout: float) -> bool:
        """Whether `done(spans)` came true within `timeout` seconds (woken by each request)."""
        with self._arrived:
            return self._arrived.wait_for(lambda: done(self._spans), timeout)

    def add(self, request: ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        ReceivedSpan(
                            span.name,
                            span.kind,
                            span.trace_id,
                            span.span_id,
                            span.parent_span_id,
                            span.start_time_unix_nano,
                            span.end_time_unix_nano,
                            {a.key: _value(a.value) for a in span.attributes},
                            str(resource.get("service.name", "")),
                        )
                    )
        with self._arrived:
            self.requests += 1
            self._spans.extend(spans)
            self._arrived.notify_all()


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """A receiver listening on 127.0.0.1 (a free port) until the block ends."""
    receiver = OtlpReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != PATH:
                self.send_error(404)
                return
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            receiver.add(request)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the test's output stays the test's

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextmanager
def dead_collector(kind: str) -> Iterator[str]:
    """The base URL of a collector that is down: `refusing` (nothing listens on the port) or
    `silent` (the port accepts connections into its backlog and never answers)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    if kind == "silent":
        sock.listen(64)
    else:
        sock.close()  # the port is free again: a connection is refused
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        sock.close()
