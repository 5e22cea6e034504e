"""The queue sensor against the real embedded queue and landing zone (no Spark involved)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pytest

from sis_platform.assets.run_tags import BATCH_TAG
from sis_platform.definitions import build_definitions
from sis_platform.intake.consumer import BatchLimits, consume_batch
from sis_platform.log.landing import ClosedBy
from sis_platform.queues.base import ReceivedMessage, new_message_id
from sis_platform.queues.embedded import EmbeddedQueue
from sis_platform.sensors.batch_runs import FEED_PRIORITY
from sis_platform.sensors.queue_sensor import build_queue_sensor
from tests.harness import SENSOR, Harness, received


def _queue(h: Harness) -> EmbeddedQueue:
    return h.resources["queue"].open()


def _put(h: Harness, n: int) -> list[str]:
    with _queue(h).producer() as producer:
        return [producer.put(f"<m n='{i}'/>".encode()) for i in range(n)]


def test_tick_lands_a_batch_commits_the_queue_and_requests_its_run(tmp_path):
    h = Harness(tmp_path)
    ids = _put(h, 10)
    result = h.tick()
    assert isinstance(result, dg.SensorResult)
    (request,) = result.run_requests
    assert request.partition_key == "0000000001"
    assert request.tags["dagster/priority"] == "10"  # ahead of backfills in the run queue
    assert h.instance.get_dynamic_partitions("batches") == ["0000000001"]
    assert [r["message_id"] for r in h.zone.catalog.iter_messages()] == ids
    assert _queue(h).depth() == 0


def test_empty_queue_skips_and_says_why(tmp_path):
    h = Harness(tmp_path)
    result = h.tick()
    assert isinstance(result, dg.SkipReason)
    assert "queue empty" in (result.skip_message or "")
    assert h.zone.catalog.keys() == []


def test_batches_respect_the_message_bound(tmp_path):
    h = Harness(tmp_path, {"SIS_BATCH_MAX_MESSAGES": "10"})
    _put(h, 25)
    assert h.drain() == 3
    sizes = [h.zone.catalog.read(k).num_rows for k in h.zone.catalog.keys()]
    assert sizes == [10, 10, 5]
    assert h.requested == h.zone.catalog.keys()


def test_a_batch_landed_but_not_registered_is_registered_before_consuming_more(tmp_path):
    h = Harness(tmp_path)
    _put(h, 3)
    # A tick that crashed after landing and committing, before its result reached the daemon.
    with _queue(h).connect() as session:
        consume_batch(session, h.zone.writer, BatchLimits(get_wait_seconds=0.05))
    _put(h, 2)
    result = h.tick()
    assert isinstance(result, dg.SensorResult)
    assert [r.partition_key for r in result.run_requests] == ["0000000001"]
    assert _queue(h).depth() == 2  # nothing new consumed in that tick
    h.tick()
    assert h.requested == ["0000000001", "0000000002"]


def test_failure_between_landing_and_commit_backs_out_and_redelivers(tmp_path):
    h = Harness(tmp_path)
    ids = _put(h, 3)

    def crash(_batch: object) -> None:
        raise RuntimeError("simulated crash before commit")

    with _queue(h).connect() as session, pytest.raises(RuntimeError):
        consume_batch(
            session, h.zone.writer, BatchLimits(get_wait_seconds=0.05), before_commit=crash
        )
    redelivered = _queue(h).browse()
    assert [m.message_id for m in redelivered] == ids
    assert all(m.delivery_count == 2 for m in redelivered)
    # The landed copies stay: the message log holds both deliveries, and the fold records the
    # second as a duplicate by message id.
    h.drain()
    logged = [(r["message_id"], r["delivery_count"]) for r in h.zone.catalog.iter_messages()]
    assert logged == [(i, 1) for i in ids] + [(i, 2) for i in ids]


def test_rerequesting_a_batch_uses_the_same_run_key(tmp_path):
    h = Harness(tmp_path)
    _put(h, 1)
    first = h.tick()
    assert isinstance(first, dg.SensorResult)
    h.cursor = None  # the cursor update was lost: the batch is offered again
    again = h.tick()
    assert isinstance(again, dg.SensorResult)
    assert [r.run_key for r in again.run_requests] == [r.run_key for r in first.run_requests]
    assert again.dynamic_partitions_requests == []  # already known


def test_the_sensor_process_never_starts_a_jvm(tmp_path):
    # The code location imports pyspark (dagster-pyspark does), but a tick must not launch
    # Spark's JVM: the sensor only talks to the queue and the landing zone.
    script = textwrap.dedent(
        f"""
        import pathlib, psutil
        from tests.harness import Harness, received
        h = Harness(pathlib.Path({str(tmp_path)!r}))
        with h.resources["queue"].open().producer() as p:
            p.put(b"<m/>")
        h.tick()
        assert h.requested == ["0000000001"], h.requested
        children = psutil.Process().children(recursive=True)
        print(sorted(c.name() for c in children))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_sensor_messages_keep_queue_metadata(tmp_path):
    h = Harness(tmp_path)
    mid = new_message_id()
    with _queue(h).producer() as producer:
        producer.put(b"<m/>", message_id=mid)
    h.tick()
    (row,) = list(h.zone.catalog.iter_messages())
    assert row["message_id"] == mid
    assert row["delivery_count"] == 1
    assert row["put_time"] <= datetime.now(UTC)
    assert isinstance(ReceivedMessage, type)


def _run_in_flight(h: Harness, partition_key: str) -> dg.DagsterRun:
    """The requested run in progress, as the daemon would have launched it."""
    return h.instance.create_run_for_job(
        h.defs.resolve_job_def("process_batch"),
        tags={"dagster/partition": partition_key, BATCH_TAG: partition_key, **FEED_PRIORITY},
        status=dg.DagsterRunStatus.STARTED,
    )


def _backfill_run_in_flight(h: Harness, partition_key: str) -> dg.DagsterRun:
    """A backfill's run of an old batch in progress (the default priority)."""
    return h.instance.create_run_for_job(
        h.defs.resolve_job_def("process_batch"),
        tags={"dagster/partition": partition_key, "dagster/backfill": "abcdefgh"},
        status=dg.DagsterRunStatus.STARTED,
    )


@pytest.mark.parametrize(
    ("limits", "messages", "closed_by", "landed"),
    [
        (BatchLimits(max_messages=3, get_wait_seconds=0.05), 5, ClosedBy.MESSAGES, 3),
        (BatchLimits(max_bytes=20, get_wait_seconds=0.05), 5, ClosedBy.BYTES, 2),
        (BatchLimits(get_wait_seconds=0.05), 2, ClosedBy.DRAINED, 2),
    ],
)
def test_a_batch_records_why_it_ended(tmp_path, limits, messages, closed_by, landed):
    h = Harness(tmp_path)
    _put(h, messages)  # 12 bytes each
    with _queue(h).connect() as session:
        batch = consume_batch(session, h.zone.writer, limits)
    assert batch is not None
    assert (batch.messages, batch.closed_by) == (landed, closed_by)
    assert h.zone.catalog.closed_by(batch.key) == closed_by


def test_a_batch_cut_by_its_deadline_is_not_taken_for_a_drained_queue(tmp_path):
    h = Harness(tmp_path)
    _put(h, 3)
    # The three are claimed together at 1.0; the wait for a fourth runs into the deadline.
    ticks = iter([0.0, 1.0, 2.0, 10.5])

    with _queue(h).connect() as session:
        batch = consume_batch(
            session,
            h.zone.writer,
            BatchLimits(max_seconds=10, get_wait_seconds=0.05),
            clock=lambda: next(ticks),
        )
    assert batch is not None
    assert (batch.messages, batch.closed_by) == (3, ClosedBy.SECONDS)


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"SIS_MAX_RUNS_IN_FLIGHT": "1"}, "(SIS_MAX_RUNS_IN_FLIGHT=1)"),
        # A live feed keeping up: a batch landed behind the run in flight would wait for it,
        # and the messages after it for both; the next batch waits instead and takes them all.
        ({}, "the last batch, 0000000001, was sealed when the queue ran dry"),
    ],
)
def test_backpressure_leaves_messages_on_the_queue_while_runs_are_in_flight(tmp_path, env, why):
    h = Harness(tmp_path, env)
    _put(h, 2)
    first = h.tick()
    assert isinstance(first, dg.SensorResult)
    key = first.run_requests[0].partition_key
    assert h.zone.catalog.closed_by(key) == ClosedBy.DRAINED
    assert h.zone.catalog.fence_token(key) is not None  # kept beside the lease's fields
    run = _run_in_flight(h, key)
    _put(h, 3)
    held = h.tick()
    assert isinstance(held, dg.SkipReason)
    assert why in (held.skip_message or "")
    assert _queue(h).depth() == 3
    h.instance.report_run_canceled(run)  # the run ended
    assert isinstance(h.tick(), dg.SensorResult)
    assert _queue(h).depth() == 0


def test_a_backfill_in_flight_does_not_hold_the_feed_back(tmp_path):
    """A backfill of old batches fills the run queue at the default priority; the feed's next
    batch is still landed and its run requested (the queue starts it ahead of them)."""
    h = Harness(tmp_path)  # SIS_MAX_RUNS_IN_FLIGHT: 2
    _put(h, 2)
    first = h.tick()
    assert isinstance(first, dg.SensorResult)
    old = first.run_requests[0].partition_key
    h.instance.report_run_canceled(_run_in_flight(h, old))  # its run ended long ago
    for _ in range(3):
        _backfill_run_in_flight(h, old)
    _put(h, 3)
    second = h.tick()
    assert isinstance(second, dg.SensorResult)
    assert second.run_requests[0].tags["dagster/priority"] == "10"
    assert _queue(h).depth() == 0


def test_in_a_backlog_batches_are_landed_ahead_of_the_run_in_flight(tmp_path):
    h = Harness(tmp_path, {"SIS_BATCH_MAX_MESSAGES": "2"})  # SIS_MAX_RUNS_IN_FLIGHT: 2
    _put(h, 7)
    first = h.tick()
    assert isinstance(first, dg.SensorResult)
    _run_in_flight(h, first.run_requests[0].partition_key)
    second = h.tick()  # one run in flight, and the last batch was full: land the next
    assert isinstance(second, dg.SensorResult)
    assert h.zone.catalog.closed_by(second.run_requests[0].partition_key) == ClosedBy.MESSAGES
    _run_in_flight(h, second.run_requests[0].partition_key)
    held = h.tick()
    assert isinstance(held, dg.SkipReason)
    assert "SIS_MAX_RUNS_IN_FLIGHT=2" in (held.skip_message or "")
    assert _queue(h).depth() == 3


def test_a_batch_ended_by_its_deadline_is_a_live_feed_too(tmp_path):
    h = Harness(tmp_path)  # SIS_MAX_RUNS_IN_FLIGHT: 2
    # Landed by a tick cut short before registering it: a live feed's batch, ended by time.
    first = h.zone.writer.land([received(b"<m/>")], closed_by=ClosedBy.SECONDS)
    assert isinstance(h.tick(), dg.SensorResult)  # registered
    _run_in_flight(h, first.key)
    _put(h, 1)
    held = h.tick()
    assert isinstance(held, dg.SkipReason)
    assert "was sealed by age (SIS_BATCH_MAX_SECONDS) before it filled" in (held.skip_message or "")


def test_the_sensor_interval_comes_from_the_settings_the_code_location_is_built_with(tmp_path):
    assert build_queue_sensor(7).minimum_interval_seconds == 7
    defs = build_definitions(
        {"SIS_DATA_DIR": str(tmp_path), "SIS_INTAKE": "sensor", "SIS_SENSOR_INTERVAL_SECONDS": "3"}
    )
    sensor = defs.resolve_sensor_def(SENSOR)
    assert (sensor.name, sensor.minimum_interval_seconds) == (SENSOR, 3)
