"""One sis-live process built from the settings: the source, landing zone, consumer lease
(the one the queue sensor holds, built without Dagster), serving store, metrics and service,
run until SIGTERM or SIGINT asks it to stop, with its metrics and health endpoint
(SIS_METRICS_ADDRESS, sis_platform/live/endpoint.py) served beside it."""

from __future__ import annotations

import gc
import logging
import signal
import threading
from pathlib import Path
from types import FrameType

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
from sis_platform.serving import ServingStore, open_store
from sis_platform.serving.location import shown_url
from sis_platform.settings import LOG_KEY_VARIABLE, Settings, secret

log = logging.getLogger("sis_platform.live")


def build_service(settings: Settings) -> LiveService:
    """The service `settings` describe (nothing is connected or opened yet)."""
    zone = landing_zone(settings)
    lease = ConsumerLease(
        zone.catalog.root, holder_id(settings.batch.deployment), settings.batch.lease_seconds
    )
    url = settings.serving.url

    def store() -> ServingStore:
        return open_store(url)

    return LiveService(
        open_configured_from_environment(settings.source),
        zone,
        lease,
        store,
        LiveConfig.from_settings(settings),
        budget=BudgetConfig.from_settings(settings),
        heartbeat=Heartbeat(settings.live.heartbeat_file),
        metrics=LiveMetrics() if settings.live.metrics_address is not None else LiveRecorder(),
    )


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
