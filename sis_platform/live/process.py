"""One sis-live process built from the settings: the source, landing zone, consumer lease
(the one the queue sensor holds, built without Dagster), serving store, metrics and service,
run until SIGTERM or SIGINT asks it to stop, with its metrics and health endpoint
(SIS_METRICS_ADDRESS, sis_platform/live/endpoint.py) served beside it, and its traces exported
when OTEL_EXPORTER_OTLP_ENDPOINT asks (sis_platform/live/traces.py, imported only then)."""

from __future__ import annotations

import gc
import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from sis_platform.intake.lease import ConsumerLease, holder_id
from sis_platform.live.budget import BudgetConfig
from sis_platform.live.config import LiveConfig
from sis_platform.live.endpoint import MetricsEndpoint, start_endpoint
from sis_platform.live.metrics import LiveMetrics, LiveRecorder
from sis_platform.live.service import LiveService
from sis_platform.log.landing import LandingZone
from sis_platform.log.landing import rows as landing_rows
from sis_platform.log.seal import LogSeal, log_seal
from sis_platform.queues.factory import open_configured_from_environment
from sis_platform.runtime.heartbeat import Heartbeat
from sis_platform.serving import ServingWriter, open_writer
from sis_platform.serving.location import shown_url
from sis_platform.settings import LOG_KEY_VARIABLE, ConfigurationError, Settings, secret

if TYPE_CHECKING:
    from sis_platform.live.traces import LiveTraces

log = logging.getLogger("sis_platform.live")

OTEL_EXTRA = "otel"  # pyproject's extra with the OpenTelemetry SDK and its OTLP exporter


def build_service(settings: Settings, traces: LiveTraces | None = None) -> LiveService:
    """The service `settings` describe (nothing is connected or opened yet), traced by
    `traces` if given (`start_traces`)."""
    zone = landing_zone(settings)
    lease = ConsumerLease(
        zone.catalog.root, holder_id(settings.batch.deployment), settings.batch.lease_seconds
    )
    url = settings.serving.url

    def store() -> ServingWriter:
        return open_writer(url)

    return LiveService(
        open_configured_from_environment(settings.source),
        zone,
        lease,
        store,
        LiveConfig.from_settings(settings),
        budget=BudgetConfig.from_settings(settings),
        heartbeat=Heartbeat(settings.live.heartbeat_file),
        metrics=LiveMetrics() if settings.live.metrics_address is not None else LiveRecorder(),
        tracing=traces.recorder if traces is not None else None,
    )


def start_traces(settings: Settings) -> LiveTraces | None:
    """sis-live's traces if OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is set, else
    None, with nothing of OpenTelemetry imported. ConfigurationError names the `otel` extra when
    it is set and the packages are missing."""
    endpoint = settings.live.traces_endpoint
    if endpoint is None:
        return None
    try:
        from sis_platform.live.traces import LiveTraces, destination
    except ImportError as error:
        raise ConfigurationError(
            f"OpenTelemetry traces are asked for ({endpoint}) but the SDK is not installed "
            f"({error}): install the `{OTEL_EXTRA}` extra "
            f"(pip install 'sis-platform[{OTEL_EXTRA}]') or unset OTEL_EXPORTER_OTLP_ENDPOINT "
            "and OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
        ) from None
    traces = LiveTraces(endpoint, destination(settings.source))
    log.info("sis-live's traces exported to %s", endpoint)
    return traces


def landing_zone(settings: Settings) -> LandingZone:
    """The landing zone the settings name, signed and witnessed as they say."""
    return LandingZone(Path(settings.landing_dir), _seal(settings))


def _seal(settings: Settings) -> LogSeal | None:
    """The landing zone's log key and witness (sis_platform/log/seal.py)."""
    log = settings.log
    if log is None:
        return None
    key = secret(LOG_KEY_VARIABLE)
    return log_seal(log.key_file, log.witness, key, create_key=log.create_key)


def run_until_signalled(service: LiveService, settings: Settings) -> None:
    """Run `service` in this (main) thread; SIGTERM and SIGINT end it after the group in hand."""

    def stopping(name: str) -> None:
        log.warning("%s: stopping after the group in hand", name)
        service.request_stop()

    def stop(signum: int, frame: FrameType | None) -> None:
        # From another thread: the handler runs in the main thread, which may be inside the
        # stop event's lock (Event.wait) or a logging handler's, and would deadlock on it.
        name = signal.Signals(signum).name
        threading.Thread(target=stopping, args=(name,), name="sis-live-stop").start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info(
        "sis-live consuming %s into %s, serving store %s",
        service.source.description,
        service.zone.catalog.root,
        shown_url(settings.serving.url),
    )
    priority = service.config.fold.priority
    if priority is not None:
        log.info(
            "SIS_PRIORITY: %d selector(s); a backlog is folded in windows of up to %d "
            "message(s), their masters in that order ahead of the rest",
            len(priority.selectors),
            service.config.priority_window,
        )
    landing_rows.warm()  # before the first message, not in its latency
    # What exists now (the imported modules, mostly) lives as long as the process: moved out of
    # the collector's sight, so that a full collection while messages flow walks only what the
    # service made since (on this platform's imports, tens of milliseconds less per collection
    # on the hot path).
    gc.collect()
    gc.freeze()
    service.run()
    log.info("sis-live stopped")


def run_with_endpoint(service: LiveService, settings: Settings) -> None:
    """`run_until_signalled`, with the metrics and health endpoint served while it runs."""
    endpoint = serve_metrics(service, settings)
    try:
        run_until_signalled(service, settings)
    finally:
        if endpoint is not None:
            endpoint.close()


def serve_metrics(service: LiveService, settings: Settings) -> MetricsEndpoint | None:
    """`service`'s metrics and health on SIS_METRICS_ADDRESS, started (None: off, or the
    address could not be bound, which is logged)."""
    address = settings.live.metrics_address
    metrics = service.metrics
    if address is None or not isinstance(metrics, LiveMetrics):
        return None
    stall = settings.live.stall_seconds
    metrics.watch(lambda: service.state(stall))
    return start_endpoint(address, metrics.registry, lambda: service.health(stall))
