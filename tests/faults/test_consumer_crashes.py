"""Crash anywhere, consumer side (invariant 1): the sensor's process is SIGKILLed at each step
boundary of a tick (get, land, commit, registration), then a fresh process ticks until the
queue is empty. Nothing is lost, every landed batch is registered as a partition, and only a
batch whose commit was in doubt lands twice, its second copies recorded as duplicates.
No Spark: the sensor process never starts a JVM."""

from __future__ import annotations

from collections import Counter

import pytest

from sis_platform.domain.pipeline import ReferencePipeline
from sis_platform.domain.reasons import Outcome
from sis_platform.log.landing import LandingZone
from sis_platform.queues.embedded import EmbeddedQueue
from sis_platform.resources import config
from sis_platform.runtime.faults import CONSUMER_POINTS
from sis_platform.simulator.generator import generate_feed
from tests.faults.accounting import logged_messages
from tests.faults.driver import cursor_path, instance, platform_env, tick_until_empty
from tests.faults.processes import SIGKILLED, drive

pytestmark = [pytest.mark.faults, pytest.mark.dagster]

BATCH = 40  # the driver's SIS_BATCH_MAX_MESSAGES
MESSAGES = 100  # three batches: 40, 40, 20


def _landed_ids(zone: LandingZone) -> list[str]:
    return [str(r["message_id"]) for r in zone.catalog.iter_messages()]


@pytest.mark.parametrize("point", CONSUMER_POINTS)
def test_sensor_killed_at_a_step_boundary_loses_nothing_and_applies_nothing_twice(tmp_path, point):
    env = platform_env(tmp_path / "data")
    resources = config.resources(env)
    queue: EmbeddedQueue = resources["queue"].open()
    zone: LandingZone = resources["landing"].zone()
    with queue.producer() as producer:
        published = [
            producer.put(m.body, message_id=m.message_id)
            for m in generate_feed(seed=41, messages=MESSAGES)
        ]
    assert len(set(published)) == MESSAGES

    # The first tick lands and registers batch 1; the second dies at `point`.
    code = drive(tmp_path, "tick", crash_at=f"{point}@2")
    assert code == SIGKILLED, f"the tick never reached {point} a second time"

    home = tmp_path / "dagster"
    landed_before = {"consume.after_land": 2, "sensor.after_commit": 2}.get(point, 1)
    assert zone.catalog.keys() == [f"{n:010d}" for n in range(1, landed_before + 1)]
    assert instance(home).get_dynamic_partitions("batches") == ["0000000001"]
    assert cursor_path(home).read_text() == "1"
    partials = list(zone.catalog.tmp_dir.glob("*.partial"))
    assert len(partials) == (1 if point == "landing.before_claim" else 0)
    in_doubt = _landed_ids(zone)[BATCH:] if point == "consume.after_land" else []

    # Restart: a fresh process (this one) ticks until the queue is empty.
    tick_until_empty(home, env)

    assert queue.depth(include_in_flight=True) == 0
    landed = _landed_ids(zone)
    copies = Counter(landed)
    assert set(copies) == set(published), "a message was lost"
    assert sorted(i for i, n in copies.items() if n > 1) == sorted(in_doubt)
    assert all(n <= 2 for n in copies.values())
    # The messages the killed tick held in its unit of work came back as redeliveries.
    counts = [int(r["delivery_count"]) for r in zone.catalog.iter_messages()]
    killed_unit = published[BATCH : 2 * BATCH] if point != "sensor.after_commit" else []
    redelivered = {m for m, c in zip(landed, counts, strict=True) if c > 1}
    assert redelivered == set(killed_unit)

    # Every landed batch is a partition, the cursor is at the last one, no partial file is left.
    keys = zone.catalog.keys()
    assert instance(home).get_dynamic_partitions("batches") == keys
    assert cursor_path(home).read_text() == str(len(keys))
    assert list(zone.catalog.tmp_dir.glob("*.partial")) == []

    # Exactly once in effect: the log's second copies are exactly the duplicates.

    ref = ReferencePipeline()
    ref.process(logged_messages(zone.catalog))
    assert ref.outcome_counts()[Outcome.DUPLICATE] == len(in_doubt)
