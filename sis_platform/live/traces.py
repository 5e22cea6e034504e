"""sis-live's traces (docs/operations.md, "Traces"): one span per group, `sis.live.group`
(kind CONSUMER), with a child span per stage named as the metrics name it (`STAGES`: get, land,
fold, commit, queue_commit), exported over OTLP/HTTP by the OpenTelemetry SDK when
OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is set; nothing of OpenTelemetry is
imported otherwise (sis_platform/live/process.py imports this module only then).

The stages are timed once, by the loop and the applier for the metrics: `TracingRecorder` is a
`LiveRecorder` that passes every call on to the metrics' recorder and draws each stage's span
from the same duration, ending when the call is made. A group's span starts with its get and
ends when the group is both committed off the queue and visible in the store: a pipelined
group's store commit comes during the next group's fold (applier.py), after its queue commit.
At most `MAX_PENDING_GROUPS` groups wait for their store commit (while the store is down they
are caught up later, from the log); an older one's span ends unseen (`sis.visible` false).

Attributes follow OpenTelemetry's messaging semantic conventions (`messaging.system`,
`messaging.destination.name`, `messaging.operation.type`, `messaging.batch.message_count`,
`messaging.message.id` for a group of one), plus the group's batch (`sis.batch`), its first and
last log positions, its message ids and the masters its store commit changed. Ids come from the
feed and a group holds up to thousands of messages: each id list holds at most `MAX_IDS` ids of
at most `MAX_ID_CHARS` characters each (the counts say how many there were).

Spans go through the SDK's BatchSpanProcessor: exported off the loop's thread from a bounded
queue (OTEL_BSP_MAX_QUEUE_SIZE, 2048 by default); while the collector is down or slow the
queue fills and further spans are dropped, and the loop never waits for the collector.
`LiveTraces.shutdown` flushes what is queued on sis-live's orderly stop (bounded by the
exporter's timeout, OTEL_EXPORTER_OTLP_TIMEOUT).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Tracer, set_span_in_context
from opentelemetry.util.types import AttributeValue

from sis_platform.live.metrics import STAGES, LiveRecorder
from sis_platform.log.landing import LandedMessage, LogPosition
from sis_platform.serving.records import GroupCommit
from sis_platform.settings import (
    OTEL_DEFAULT_SERVICE_NAME,
    EmbeddedSourceSettings,
    IbmMqSourceSettings,
    SourceSettings,
    StompSourceSettings,
)

GROUP_SPAN = "sis.live.group"
GET, LAND, FOLD, COMMIT, QUEUE_COMMIT = STAGES
# Ids per list attribute (message ids, master ids) and characters per id: a group's span stays
# a few kilobytes whatever the feed sends.
MAX_IDS = 20
MAX_ID_CHARS = 128
# Groups whose spans wait for their store commit (module docstring).
MAX_PENDING_GROUPS = 16
SCOPE = "sis_platform.live"


@dataclass(frozen=True)
class Destination:
    """What the messaging conventions call the system and the destination."""

    system: str  # `activemq` (a well-known value), `ibm_mq`, `embedded` (the platform's own)
    name: str


def destination(source: SourceSettings) -> Destination:
    """The system and queue `source` consumes."""
    if isinstance(source, StompSourceSettings):
        return Destination("activemq", source.destination)
    if isinstance(source, IbmMqSourceSettings):
        return Destination("ibm_mq", source.queue)
    if isinstance(source, EmbeddedSourceSettings):
        return Destination("embedded", source.queue)
    raise TypeError(f"not a source: {source!r}")


def bounded_ids(ids: Iterable[str]) -> tuple[str, ...]:
    """At most MAX_IDS of `ids`, each cut to MAX_ID_CHARS characters."""
    out: list[str] = []
    for value in ids:
        if len(out) == MAX_IDS:
            break
        out.append(value[:MAX_ID_CHARS])
    return tuple(out)


class LiveTraces:
    """The process's tracer provider, exporting to `endpoint` (or to `exporter`, for a test)
    through a BatchSpanProcessor; the SDK's OTEL_* variables configure the rest. The provider
    is this service's own, not installed globally."""

    def __init__(
        self, endpoint: str, where: Destination, exporter: SpanExporter | None = None
    ) -> None:
        resource = Resource.create()
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: OTEL_DEFAULT_SERVICE_NAME}))
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(
            BatchSpanProcessor(exporter if exporter is not None else OTLPSpanExporter(endpoint))
        )
        self.endpoint = endpoint
        self.where = where

    def recorder(self, inner: LiveRecorder) -> TracingRecorder:
        """A recorder that traces each group and passes every call on to `inner`."""
        return TracingRecorder(inner, self.provider.get_tracer(SCOPE), self.where)

    def shutdown(self) -> None:
        """Export what is queued (bounded by the exporter's timeout) and stop exporting."""
        self.provider.shutdown()


@dataclass
class _Group:
    span: Span
    first: LogPosition
    last: LogPosition
    land_end: int  # ns
    queue_committed: bool = False
    visible: bool = False


def _window(seconds: float) -> tuple[int, int]:
    """(start, end) in ns since the epoch of a stage that took `seconds` and ends now."""
    end = time.time_ns()
    return end - int(seconds * 1e9), end


class TracingRecorder(LiveRecorder):
    """Spans from the recorder's calls (module docstring); every call is passed on to `inner`
    first. Called from the loop's thread only."""

    def __init__(self, inner: LiveRecorder, tracer: Tracer, where: Destination) -> None:
        self.inner = inner
        self._tracer = tracer
        self._where = where
        self._get: tuple[int, int] | None = None
        self._land: tuple[int, int] | None = None
        self._current: _Group | None = None  # landed, not yet committed off the queue
        self._pending: OrderedDict[LogPosition, _Group] = OrderedDict()  # awaiting the store
        # store commits since the last `visible`: (start, end, masters changed, how many)
        self._commits: list[tuple[int, int, tuple[str, ...], int]] = []

    # -- the stages, in the order the loop calls them -----------------------------------------

    def got(self, messages: int, seconds: float) -> None:
        self.inner.got(messages, seconds)
        if self._current is not None:  # its queue commit failed: the queue redelivers it
            self._current.span.set_attribute("sis.queue_committed", False)
            self._settle(self._current)
        self._get, self._land = _window(seconds), None

    def landed(self, messages: int, seconds: float) -> None:
        self.inner.landed(messages, seconds)
        # The loop times the land from the get's end: the span starts there too.
        start = self._get[1] if self._get is not None else _window(seconds)[0]
        self._land = start, start + int(seconds * 1e9)

    def group(self, messages: Sequence[LandedMessage], batch_key: str) -> None:
        self.inner.group(messages, batch_key)
        land = self._land if self._land is not None else _window(0.0)
        get = self._get if self._get is not None else land
        first, last = messages[0].position, messages[-1].position
        ids = [m.message.message_id for m in messages]
        attributes: dict[str, AttributeValue] = {
            **self._messaging("process"),
            "messaging.batch.message_count": len(messages),
            "sis.batch": batch_key,
            "sis.batch.seq": last.batch_seq,
            "sis.position.first": first.msg_seq,
            "sis.position.last": last.msg_seq,
            "sis.message_ids": bounded_ids(ids),
        }
        if len(messages) == 1:
            attributes["messaging.message.id"] = ids[0][:MAX_ID_CHARS]
        span = self._tracer.start_span(
            GROUP_SPAN, kind=SpanKind.CONSUMER, attributes=attributes, start_time=get[0]
        )
        group = _Group(span, first, last, land[1])
        self._stage(group, GET, get, {**self._messaging("receive"), "sis.messages": len(ids)})
        self._stage(group, LAND, land, {"sis.batch": batch_key})
        self._current = group
        self._get = self._land = None

    def folded(self, seconds: float) -> None:
        self.inner.folded(seconds)
        group = self._current
        if group is not None:
            start = group.land_end
            self._stage(group, FOLD, (start, start + int(seconds * 1e9)), {})

    def committed(self, commit: GroupCommit, seconds: float) -> None:
        self.inner.committed(commit, seconds)
        start, end = _window(seconds)
        masters = [m.master_id for m in commit.masters]
        self._commits.append((start, end, bounded_ids(masters), len(masters)))
        if len(self._commits) > MAX_PENDING_GROUPS:  # parts of a stretch that keeps failing
            del self._commits[0]

    def visible(self, messages: Sequence[LandedMessage]) -> None:
        self.inner.visible(messages)
        end = messages[-1].position
        covered = [g for g in self._open() if g.last <= end]
        commits, self._commits = self._commits, []
        if not covered:
            return  # a stretch from the log (a catch-up after a restart): no group span here
        # The commit's spans hang off the group it was made for, or the newest it completes.
        owner = next((g for g in covered if g.last == end), covered[-1])
        for start, stop, masters, count in commits:
            self._stage(
                owner,
                COMMIT,
                (start, stop),
                {
                    "sis.master_ids": masters,
                    "sis.masters": count,
                    "sis.batch.seq": end.batch_seq,
                    "sis.position": end.msg_seq,
                },
            )
        for group in covered:
            if commits:
                masters = tuple(m for c in commits for m in c[2])
                group.span.set_attribute("sis.master_ids", bounded_ids(masters))
            group.visible = True
            if group.queue_committed:
                self._finish(group)

    def queue_committed(self, seconds: float) -> None:
        self.inner.queue_committed(seconds)
        group, self._current = self._current, None
        if group is None:
            return
        self._stage(group, QUEUE_COMMIT, _window(seconds), {**self._messaging("settle")})
        self._settle(group)

    def close(self) -> None:
        self.inner.close()
        for group in list(self._open()):
            self._finish(group)
        self._current = None

    # -- passed on -----------------------------------------------------------------------------

    def source_connected(self) -> None:
        self.inner.source_connected()

    def source_failed(self) -> None:
        self.inner.source_failed()

    def lease_held(self, token: int, *, acquired: bool) -> None:
        self.inner.lease_held(token, acquired=acquired)

    def lease_lost(self) -> None:
        self.inner.lease_lost()

    @property
    def commit_seconds(self) -> float:
        return self.inner.commit_seconds

    # -- spans ---------------------------------------------------------------------------------

    def _messaging(self, operation: str) -> dict[str, AttributeValue]:
        return {
            "messaging.system": self._where.system,
            "messaging.destination.name": self._where.name,
            "messaging.operation.type": operation,
        }

    def _stage(
        self,
        group: _Group,
        name: str,
        window: tuple[int, int],
        attributes: dict[str, AttributeValue],
    ) -> None:
        span = self._tracer.start_span(
            name,
            context=set_span_in_context(group.span),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=window[0],
        )
        span.end(end_time=window[1])

    def _open(self) -> list[_Group]:
        """The groups whose spans are open, oldest first."""
        groups = list(self._pending.values())
        if self._current is not None:
            groups.append(self._current)
        return groups

    def _settle(self, group: _Group) -> None:
        """`group` is done with the queue: ended if visible, else waiting for the store."""
        group.queue_committed = True
        if self._current is group:
            self._current = None
        if group.visible:
            self._finish(group)
            return
        self._pending[group.last] = group
        while len(self._pending) > MAX_PENDING_GROUPS:
            _, oldest = self._pending.popitem(last=False)
            self._finish(oldest)

    def _finish(self, group: _Group) -> None:
        self._pending.pop(group.last, None)
        group.span.set_attribute("sis.visible", group.visible)
        group.span.end()
