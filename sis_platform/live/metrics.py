"""sis-live's metrics: every metric the live path exports, defined once, in Prometheus's naming
(docs/operations.md, "Monitoring").

The loop and the applier record through a `LiveRecorder`: `LiveRecorder` itself records nothing
(SIS_METRICS_ADDRESS=off), `LiveMetrics` records into its own prometheus_client registry. What
changes per group (messages got, landed and applied, their outcomes, stage durations, group
sizes, put -> visible latency) is counted on the loop's thread, a few dictionary lookups and
lock-protected additions per group plus one histogram observation per applied message. What is
state (positions, lease, source and store, how long the store has been behind, the heartbeat's
age) is read from the service only when a scrape asks (`LiveState`), so it costs the loop
nothing. The lake's progress, lag and dead letters (`sis_lake_*`) are exported by the lease
holder from the lake's record in the serving store (lakelag.py). Labels take values from fixed
sets only: a reason the platform does not define is
counted as `other`, so no message can add a series.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client import Counter as CounterMetric
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from sis_platform.domain.reasons import Outcome, Reason
from sis_platform.live.lakelag import LakeLag
from sis_platform.log.landing import LandedMessage
from sis_platform.serving.records import GroupCommit

NAMESPACE = "sis_live"
# The lake's metrics, exported by the lease holder from the lake's own record (lakelag.py).
LAKE_NAMESPACE = "sis_lake"
# The stages of a group whose durations are observed (`sis_live_stage_seconds{stage}`).
STAGES = ("get", "land", "fold", "commit", "queue_commit")
# `sis_live_messages_total{stage}`: got off the queue, landed durably, applied to the store.
MESSAGE_STAGES = ("got", "landed", "applied")
# The outcome label's values: the domain's outcomes, with '-' as '_' (Prometheus style).
OUTCOMES = {str(o): str(o).replace("-", "_") for o in Outcome}
# The reason label's values: the domain's reason codes, '' for none, `other` for anything else.
REASONS = frozenset(str(r) for r in Reason) | {""}
OTHER_REASON = "other"

# Seconds: a put -> visible latency is tens of milliseconds when the feed flows, seconds to
# minutes after an outage or a restart's catch-up.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
)  # fmt: skip
STAGE_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
GROUP_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)


def reason_label(reason: str | None) -> str:
    """The bounded label value for a reason code."""
    if reason is None:
        return ""
    return reason if reason in REASONS else OTHER_REASON


class LiveRecorder:
    """What the loop and the applier tell the metrics; this one records nothing."""

    def got(self, messages: int, seconds: float) -> None:
        """A group of `messages` was got off the queue in `seconds` (after its first message)."""

    def landed(self, messages: int, seconds: float) -> None:
        """The group was landed durably in `seconds`."""

    def group(self, messages: Sequence[LandedMessage], batch_key: str) -> None:
        """The group just landed, as the log holds it, in the batch `batch_key` (after `landed`;
        the traces name its messages, sis_platform/live/traces.py)."""

    def folded(self, seconds: float) -> None:
        """The group was folded (its store commits excluded) in `seconds`."""

    def committed(self, commit: GroupCommit, seconds: float) -> None:
        """One store transaction: `commit`, in `seconds`."""

    def visible(self, messages: Sequence[LandedMessage]) -> None:
        """`messages` are applied and visible in the store now."""

    def queue_committed(self, seconds: float) -> None:
        """The queue's unit of work was committed in `seconds`."""

    def close(self) -> None:
        """The service has stopped."""

    def source_connected(self) -> None:
        """A queue session was opened."""

    def source_failed(self) -> None:
        """The queue was lost (a connection failing or refused)."""

    def lease_held(self, token: int, *, acquired: bool) -> None:
        """Consuming under the lease with fencing token `token`; `acquired`: just taken."""

    def lease_lost(self) -> None:
        """The consumer lease was lost while consuming (taken over, not renewed in time, or
        fenced off)."""

    @property
    def commit_seconds(self) -> float:
        """Store commit time recorded so far (the loop subtracts it from a fold's time)."""
        return 0.0


class LiveMetrics(LiveRecorder):
    """The live path's metrics in `registry` (a new one by default: one per process, and one
    per service in a test), with the process's own (RSS, CPU, open files) unless
    `process=False`."""

    def __init__(self, registry: CollectorRegistry | None = None, *, process: bool = True):
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self._messages = CounterMetric(
            "messages",
            "Messages by stage: got off the queue, landed durably, applied to the serving store",
            ["stage"],
            namespace=NAMESPACE,
            registry=r,
        )
        self._outcomes = CounterMetric(
            "outcomes",
            "Outcomes recorded in the serving store (per item, or per message when the whole "
            "message is a duplicate or dead-lettered), by outcome and dead-letter reason",
            ["outcome", "reason"],
            namespace=NAMESPACE,
            registry=r,
        )
        self._stage = Histogram(
            "stage_seconds",
            "Time a group spends in each stage: get (after its first message), land, fold, "
            "commit (the serving store's transaction), queue_commit",
            ["stage"],
            namespace=NAMESPACE,
            registry=r,
            buckets=STAGE_BUCKETS,
        )
        self._latency = Histogram(
            "put_to_visible_seconds",
            "From a message's put on the queue to its group's commit in the serving store",
            namespace=NAMESPACE,
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self._groups = Histogram(
            "group_messages",
            "Messages per group landed",
            namespace=NAMESPACE,
            registry=r,
            buckets=GROUP_BUCKETS,
        )
        self._source_connects = CounterMetric(
            "source_connects", "Queue sessions opened", namespace=NAMESPACE, registry=r
        )
        self._source_failures = CounterMetric(
            "source_failures",
            "Times the queue was lost or refused a connection",
            namespace=NAMESPACE,
            registry=r,
        )
        self._lease_acquired = CounterMetric(
            "lease_acquisitions", "Times the consumer lease was taken", namespace=NAMESPACE,
            registry=r,
        )  # fmt: skip
        self._lease_lost = CounterMetric(
            "lease_losses",
            "Times the consumer lease was lost while consuming",
            namespace=NAMESPACE,
            registry=r,
        )
        # Children bound once: the hot path does no label lookup.
        self._got, self._landed, self._applied = (self._messages.labels(s) for s in MESSAGE_STAGES)
        self._get_s, self._land_s, self._fold_s, self._commit_s, self._queue_s = (
            self._stage.labels(s) for s in STAGES
        )
        for outcome in OUTCOMES.values():  # every outcome shows from the first scrape, at 0
            self._outcomes.labels(outcome, "")
        self.token: int | None = None  # the fencing token of the lease last taken
        self._commit_total = 0.0
        if process:
            ProcessCollector(registry=r)

    def got(self, messages: int, seconds: float) -> None:
        self._got.inc(messages)
        self._get_s.observe(seconds)
        self._groups.observe(messages)

    def landed(self, messages: int, seconds: float) -> None:
        self._landed.inc(messages)
        self._land_s.observe(seconds)

    def folded(self, seconds: float) -> None:
        self._fold_s.observe(seconds)

    def committed(self, commit: GroupCommit, seconds: float) -> None:
        self._commit_total += seconds
        self._commit_s.observe(seconds)
        counts = Counter((o.outcome, o.reason) for o in commit.outcomes)
        for (outcome, reason), n in counts.items():
            self._outcomes.labels(
                OUTCOMES.get(outcome, OTHER_REASON), reason_label(reason)
            ).inc(n)  # fmt: skip

    def visible(self, messages: Sequence[LandedMessage]) -> None:
        self._applied.inc(len(messages))
        now = time.time()
        observe = self._latency.observe
        for message in messages:
            if message.put_time is not None:
                observe(max(0.0, now - message.put_time.timestamp()))

    def queue_committed(self, seconds: float) -> None:
        self._queue_s.observe(seconds)

    def source_connected(self) -> None:
        self._source_connects.inc()

    def source_failed(self) -> None:
        self._source_failures.inc()

    def lease_held(self, token: int, *, acquired: bool) -> None:
        self.token = token
        if acquired:
            self._lease_acquired.inc()

    def lease_lost(self) -> None:
        self._lease_lost.inc()

    @property
    def commit_seconds(self) -> float:
        return self._commit_total

    def watch(self, state: Callable[[], LiveState]) -> None:
        """Export the gauges of `state()`, read at each scrape."""
        self.registry.register(_StateCollector(state, self))


@dataclass(frozen=True)
class LiveState:
    """The service's state as a scrape reads it (LiveService.state)."""

    holding: bool  # consuming under the consumer lease
    landed: tuple[int, int] | None  # (batch, message) of the last message landed
    applied: tuple[int, int] | None  # the store's position, as this process last knew it
    behind_seconds: float  # how long the store has not been at the landed position (0: it is)
    source_connected: bool
    store_available: bool
    halted: bool
    heartbeat_age_seconds: float | None  # since the loop last went round (None: no heartbeat)
    alive: bool
    ready: bool
    lake: LakeLag | None = None  # the lake's progress and lag (None: not recorded, or standby)


class _StateCollector(Collector):
    """Gauges read from the service when a scrape asks (module docstring)."""

    def __init__(self, state: Callable[[], LiveState], metrics: LiveMetrics) -> None:
        self._state = state
        self._metrics = metrics

    def describe(self) -> Iterator[Metric]:
        return iter(())  # unchecked: the gauges' names are fixed here and in no other collector

    def collect(self) -> Iterator[Metric]:
        s = self._state()
        token = self._metrics.token

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{NAMESPACE}_{name}", doc, value=value)

        yield gauge("lease_holding", "1 while consuming under the consumer lease", s.holding)
        yield gauge(
            "lease_fencing_token",
            "The fencing token of the lease this process last took (0: none yet)",
            token or 0,
        )
        for which, position in (("landed", s.landed), ("applied", s.applied)):
            if position is not None:
                yield gauge(f"{which}_batch", f"The batch of the last message {which}", position[0])
                yield gauge(
                    f"{which}_message",
                    f"The place in its batch of the last message {which}",
                    position[1],
                )
        if s.landed is not None and s.applied is not None:
            yield gauge(
                "behind_batches",
                "Landed batches the serving store has not reached yet",
                max(0, s.landed[0] - s.applied[0]),
            )
        yield gauge(
            "behind_seconds",
            "How long the serving store has not been at the landed position (0: caught up or "
            "standing by)",
            s.behind_seconds,
        )
        yield gauge("source_connected", "1 while a queue session is open", s.source_connected)
        yield gauge("store_available", "1 while the serving store is connected", s.store_available)
        yield gauge("halted", "1 while halted: the store is beyond the landing zone", s.halted)
        if s.heartbeat_age_seconds is not None:
            yield gauge(
                "heartbeat_age_seconds",
                "Seconds since the loop last went round (its heartbeat)",
                s.heartbeat_age_seconds,
            )
        yield gauge("alive", "1 while /healthz answers 200", s.alive)
        yield gauge("ready", "1 while /readyz answers 200", s.ready)
        if s.lake is not None:
            yield from _lake_metrics(s.lake, datetime.now(UTC))


def _lake_metrics(lake: LakeLag, now: datetime) -> Iterator[Metric]:
    """The lake's progress and lag (sis_platform/live/lakelag.py defines each)."""
    progress = lake.progress

    def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"{LAKE_NAMESPACE}_{name}", doc, value=value)

    yield gauge("last_fold_step", "The lake's last committed fold step", progress.fold_step)
    yield gauge(
        "last_folded_batch", "The last batch of the lake's last committed fold step",
        progress.last_batch_seq,
    )  # fmt: skip
    yield gauge(
        "last_fold_step_timestamp_seconds",
        "When the lake's last fold step committed (Unix time)",
        progress.committed_at.timestamp(),
    )
    yield gauge(
        "lag_batches",
        "Sealed batches landed after the lake's last folded batch",
        lake.batches,
    )
    yield gauge(
        "lag_seconds",
        "How long the oldest landed message the lake has not folded has waited (0: none)",
        lake.seconds(now),
    )
    yield CounterMetricFamily(
        f"{LAKE_NAMESPACE}_dead_letters",
        "Dead letters written by the lake's committed fold steps",
        value=progress.dead_letters,
    )
