"""Running sis-live's service in a thread of the test, over an embedded queue, a landing zone
and a SQLite serving store in a temporary folder; and what the live tests check afterwards."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sis_platform.intake.lease import ConsumerLease
from sis_platform.live.budget import BudgetConfig
from sis_platform.live.config import LiveConfig
from sis_platform.live.metrics import LiveRecorder
from sis_platform.live.service import LiveService
from sis_platform.log.landing import START_POSITION, LandingZone
from sis_platform.queues.embedded import EmbeddedQueue
from sis_platform.runtime.heartbeat import Heartbeat
from sis_platform.serving import ServingWriter, open_writer
from sis_platform.simulator.generator import SimulatedMessage
from tests.live.store_view import assert_store_matches_reference
from tests.reference import reference_for

BOUND_SECONDS = 120.0  # how long a test waits for the service to drain before failing
CONFIG = LiveConfig(
    group_max_messages=20, batch_max_messages=70, batch_max_seconds=3600.0, idle_wait_seconds=0.2
)


@dataclass(frozen=True)
class Place:
    """Where one test's platform lives."""

    root: Path

    @property
    def queue(self) -> EmbeddedQueue:
        return EmbeddedQueue(self.root / "queue")

    @property
    def zone(self) -> LandingZone:
        return LandingZone(self.root / "landing")

    @property
    def db(self) -> Path:
        return self.root / "serving" / "serving.db"

    @property
    def url(self) -> str:
        return f"sqlite:///{self.db}"

    def lease(self, holder: str = "test@localhost:1") -> ConsumerLease:
        return ConsumerLease(self.zone.catalog.root, holder, 60.0)

    def put(self, feed: list[SimulatedMessage]) -> None:
        with self.queue.producer() as producer:
            for message in feed:
                producer.put(message.body, message_id=message.message_id)


def drained(service: LiveService) -> bool:
    """Every landed message is in the store and the queue is empty."""
    return (
        service.landed_to != START_POSITION
        and service.applier.applied == service.landed_to
        and service.source.depth() == 0  # type: ignore[attr-defined]
    )


@contextmanager
def running(
    place: Place,
    config: LiveConfig = CONFIG,
    open_writer_: Callable[[], ServingWriter] | None = None,
    source: Any = None,
    budget: BudgetConfig | None = None,
    heartbeat: Heartbeat | None = None,
    lease: ConsumerLease | None = None,
    zone: LandingZone | None = None,
    metrics: LiveRecorder | None = None,
    tracing: Callable[[LiveRecorder], LiveRecorder] | None = None,
) -> Iterator[LiveService]:
    """The service running in a thread, consuming `source` (default: the place's queue), its
    fold under `budget` (None: unguarded, no fold workers), under `lease` (default: the
    place's), landing in `zone` (default: the place's, unsigned); stopped (and its thread
    joined) on leaving."""
    service = LiveService(
        source if source is not None else place.queue,
        zone if zone is not None else place.zone,
        lease if lease is not None else place.lease(),
        open_writer_ or (lambda: open_writer(place.url)),
        config,
        budget=budget,
        heartbeat=heartbeat,
        metrics=metrics,
        tracing=tracing,
    )
    failure: list[BaseException] = []

    def run() -> None:
        try:
            service.run()
        except BaseException as error:
            failure.append(error)
            raise

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield service
    finally:
        service.request_stop()
        thread.join(BOUND_SECONDS)
    assert not thread.is_alive(), "the service did not stop"
    assert not failure, failure


def assert_live_equals_reference(place: Place, put: list[SimulatedMessage]) -> None:
    """Every put message is landed as a first copy exactly once (later copies only as
    redeliveries), and the store equals the reference over the landed log."""
    zone = place.zone
    log = [m.message for m in zone.catalog.landed_after(START_POSITION, CONFIG.message_limits)]
    landed = Counter(m.message_id for m in log)
    sent = Counter(m.message_id for m in put)
    assert set(landed) == set(sent), "a put message is missing from the log, or one not put"
    redelivered = Counter(m.message_id for m in log if m.delivery_count > 1)
    for message_id, copies in landed.items():
        # Nothing lost; more copies than were put only by redelivery.
        assert sent[message_id] <= copies <= sent[message_id] + redelivered[message_id]
    assert_store_matches_reference(place.db, reference_for(log))
