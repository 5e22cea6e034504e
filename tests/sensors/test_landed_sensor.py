"""The landed-batches sensor (live intake) against a real landing zone written by GroupWriter,
as sis-live writes it, and a real embedded queue it must never touch (no Spark involved)."""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import pytest

from sis_platform.log.landing import ClosedBy, GroupWriter, LandingZone
from sis_platform.resources import config
from sis_platform.sensors import landed_sensor
from sis_platform.sensors.landed_sensor import (
    LANDED_SENSOR_NAME,
    MAX_RUNS_PER_TICK,
    build_landed_batches_sensor,
)
from tests.harness import received

pytestmark = [pytest.mark.dagster]


def _resources(tmp_path: Path, **env: str) -> dict[str, object]:
    return config.resources({"SIS_DATA_DIR": str(tmp_path), **env})


def _zone(resources: dict[str, object]) -> LandingZone:
    return resources["landing"].zone()  # type: ignore[attr-defined]


def _land(writer: GroupWriter, *groups: int) -> None:
    """Land groups of the given sizes into the open batch."""
    for size in groups:
        writer.land([received(f"<m n='{i}'/>".encode()) for i in range(size)])


class Ticker:
    """Evaluates the sensor as the daemon does: the cursor and partitions carried over."""

    def __init__(
        self, resources: dict[str, object], instance: dg.DagsterInstance | None = None
    ) -> None:
        self.sensor = build_landed_batches_sensor(5)
        self.resources = resources
        self.instance = instance or dg.DagsterInstance.ephemeral()
        self.cursor: str | None = None

    def tick(self) -> dg.SensorResult | dg.SkipReason:
        context = dg.build_sensor_context(
            instance=self.instance, cursor=self.cursor, resources=self.resources
        )
        result = self.sensor(context)
        assert isinstance(result, (dg.SensorResult, dg.SkipReason))
        if isinstance(result, dg.SensorResult):
            for request in result.dynamic_partitions_requests or []:
                assert isinstance(request, dg.AddDynamicPartitionsRequest)
                self.instance.add_dynamic_partitions(
                    request.partitions_def_name, list(request.partition_keys)
                )
            self.cursor = result.cursor
        return result


def test_registers_sealed_batches_only_and_requests_their_runs_with_their_anchor(tmp_path):
    resources = _resources(tmp_path)
    zone = _zone(resources)
    writer = GroupWriter(zone.writer)
    _land(writer, 2, 3)
    first = writer.seal(ClosedBy.MESSAGES)
    assert first is not None
    _land(writer, 4)  # batch 2 stays open

    ticker = Ticker(resources)
    result = ticker.tick()
    assert isinstance(result, dg.SensorResult)
    (request,) = result.run_requests or []
    anchor = zone.catalog.anchors.read(first.key)
    assert anchor is not None and anchor.messages == 5
    assert request.partition_key == first.key == "0000000001"
    assert request.run_key == "batch-0000000001"
    assert request.tags == {
        "sis/batch": "0000000001",
        "sis/chain_head": anchor.head,
        "sis/messages": "5",
        "dagster/priority": "10",  # ahead of backfills in the run queue
    }
    assert ticker.instance.get_dynamic_partitions("batches") == ["0000000001"]
    assert ticker.cursor == f"1:{anchor.head}"

    skipped = ticker.tick()
    assert isinstance(skipped, dg.SkipReason)
    assert skipped.skip_message == (
        "no sealed batch after 1; sis-live's open batch 0000000002 has 4 message(s) in 1 "
        f"part(s) since {writer.open_batch.opened_at:%H:%M:%S} UTC"  # type: ignore[union-attr]
    )

    writer.seal(ClosedBy.SECONDS)
    result = ticker.tick()
    assert isinstance(result, dg.SensorResult)
    assert [r.partition_key for r in result.run_requests or []] == ["0000000002"]
    assert ticker.instance.get_dynamic_partitions("batches") == ["0000000001", "0000000002"]


def test_never_touches_the_queue(tmp_path):
    resources = _resources(tmp_path)
    queue = resources["queue"].open()  # type: ignore[attr-defined]
    with queue.producer() as producer:
        for i in range(3):
            producer.put(f"<m n='{i}'/>".encode())
    writer = GroupWriter(_zone(resources).writer)
    _land(writer, 1)
    writer.seal(ClosedBy.DRAINED)

    ticker = Ticker(resources)
    assert isinstance(ticker.tick(), dg.SensorResult)
    assert isinstance(ticker.tick(), dg.SkipReason)
    assert queue.depth() == 3
    # It is not even given the queue: its only resource is the landing zone.
    assert ticker.sensor.required_resource_keys == {"landing"}
    assert ticker.sensor.name == LANDED_SENSOR_NAME


def _ranges(result: dg.SensorResult) -> list[tuple[str, str]]:
    """Each requested run's first and last batch."""
    ranges = []
    for request in result.run_requests or []:
        span = request.partition_key_range
        if span is None:
            assert request.partition_key is not None
            ranges.append((request.partition_key, request.partition_key))
        else:
            assert request.partition_key is None
            ranges.append((span.start, span.end))
    return ranges


def test_batches_waiting_together_share_a_run_within_the_message_bound(tmp_path):
    resources = _resources(tmp_path, SIS_MAX_RUNS_IN_FLIGHT="1000", SIS_BATCH_MAX_MESSAGES="5")
    writer = GroupWriter(_zone(resources).writer)
    for size in (2, 2, 1, 3, 6, 1):
        _land(writer, size)
        writer.seal(ClosedBy.MESSAGES)
    ticker = Ticker(resources)
    result = ticker.tick()
    assert isinstance(result, dg.SensorResult)
    # 2+2+1 = 5 fit; 3 then 6 would not (6 runs alone, though over the bound), then 1.
    assert _ranges(result) == [("0000000001", "0000000003"), ("0000000004", "0000000004")]
    assert ticker.cursor is not None and ticker.cursor.split(":")[0] == "4"
    assert _ranges(ticker.tick()) == [  # type: ignore[arg-type]
        ("0000000005", "0000000005"),
        ("0000000006", "0000000006"),
    ]
    assert isinstance(ticker.tick(), dg.SkipReason)
    (run,) = ticker.instance.get_dynamic_partitions("batches")[:1]
    assert run == "0000000001"
    assert len(ticker.instance.get_dynamic_partitions("batches")) == 6


def test_a_range_run_is_requested_once_with_the_last_batchs_anchor(tmp_path):
    resources = _resources(tmp_path)
    zone = _zone(resources)
    writer = GroupWriter(zone.writer)
    for _ in range(3):
        _land(writer, 2)
        writer.seal(ClosedBy.MESSAGES)
    result = Ticker(resources).tick()
    assert isinstance(result, dg.SensorResult)
    (request,) = result.run_requests or []
    anchor = zone.catalog.anchors.read("0000000003")
    assert anchor is not None
    assert request.run_key == "batches-0000000001-0000000003"
    assert request.tags["sis/chain_head"] == anchor.head
    assert request.tags["sis/messages"] == "2"
    assert request.tags["sis/batch"] == "0000000003"
    assert request.tags["sis/first_batch"] == "0000000001"
    assert request.tags["dagster/priority"] == "10"


def test_a_bounded_number_of_runs_and_batches_per_tick(tmp_path, monkeypatch):
    monkeypatch.setattr(landed_sensor, "MAX_BATCHES_PER_RUN", 3)
    resources = _resources(tmp_path, SIS_MAX_RUNS_IN_FLIGHT="1000")
    writer = GroupWriter(_zone(resources).writer)
    for _ in range(3 * MAX_RUNS_PER_TICK + 2):
        _land(writer, 1)
        writer.seal(ClosedBy.MESSAGES)
    ticker = Ticker(resources)
    sizes = []
    while isinstance(result := ticker.tick(), dg.SensorResult):
        sizes.append([int(last) - int(first) + 1 for first, last in _ranges(result)])
    assert sizes == [[3] * MAX_RUNS_PER_TICK, [2]]
    assert ticker.cursor is not None
    assert ticker.cursor.split(":")[0] == str(3 * MAX_RUNS_PER_TICK + 2)


def test_backpressure_leaves_sealed_batches_in_the_landing_zone(tmp_path):
    resources = _resources(tmp_path, SIS_MAX_RUNS_IN_FLIGHT="0")
    writer = GroupWriter(_zone(resources).writer)
    _land(writer, 1)
    writer.seal(ClosedBy.MESSAGES)
    ticker = Ticker(resources)
    held = ticker.tick()
    assert isinstance(held, dg.SkipReason)
    assert "backpressure" in (held.skip_message or "")
    assert ticker.instance.get_dynamic_partitions("batches") == []


def test_without_a_cursor_it_starts_after_the_partitions_already_registered(tmp_path):
    """A deployment switching from SIS_INTAKE=sensor: the queue sensor registered (and
    requested) batch 1; the landed-batches sensor requests only what follows."""
    resources = _resources(tmp_path)
    zone = _zone(resources)
    zone.writer.land([received(b"<m/>")], closed_by=ClosedBy.DRAINED)  # as the queue sensor did
    writer = GroupWriter(zone.writer)
    _land(writer, 2)
    writer.seal(ClosedBy.MESSAGES)
    ticker = Ticker(resources)
    ticker.instance.add_dynamic_partitions("batches", ["0000000001"])
    result = ticker.tick()
    assert isinstance(result, dg.SensorResult)
    assert [r.partition_key for r in result.run_requests or []] == ["0000000002"]


def _registered_then_rolled_back(tmp_path: Path) -> tuple[Ticker, GroupWriter]:
    """Batches 1 and 2 registered; then the landing zone put back to its copy holding batch 1
    only (a volume snapshot restored under the lake); a writer on the zone as it is now."""
    resources = _resources(tmp_path)
    zone = _zone(resources)
    writer = GroupWriter(zone.writer)
    _land(writer, 2)
    writer.seal(ClosedBy.MESSAGES)
    snapshot = tmp_path / "landing-snapshot"
    shutil.copytree(zone.catalog.root, snapshot)
    _land(writer, 3)
    writer.seal(ClosedBy.MESSAGES)
    ticker = Ticker(resources)
    result = ticker.tick()
    assert isinstance(result, dg.SensorResult)
    assert _ranges(result) == [("0000000001", "0000000002")]
    shutil.rmtree(zone.catalog.root)
    shutil.copytree(snapshot, zone.catalog.root)
    return ticker, GroupWriter(zone.writer)


def test_a_landing_rolled_back_behind_the_cursor_fails_the_tick(tmp_path):
    ticker, _ = _registered_then_rolled_back(tmp_path)
    with pytest.raises(dg.Failure, match="batch 0000000002, which was registered, is gone"):
        ticker.tick()


def test_a_registered_batch_landed_again_with_other_content_fails_the_tick(tmp_path):
    # After the rollback new messages land as batch 2 again: its run_key was requested
    # already, so the lake would never run them.
    ticker, writer = _registered_then_rolled_back(tmp_path)
    # The log's witness refuses to seal over a rollback (sis_platform/log/seal.py); a site whose
    # witness went back with the folder (or was lost) lands over it, which the sensor must see.
    writer.zone.signer.seal.witness.path.unlink()
    _land(writer, 4)
    writer.seal(ClosedBy.MESSAGES)
    _land(writer, 1)
    writer.seal(ClosedBy.MESSAGES)  # batch 3: new to the sensor, but after a changed batch 2
    with pytest.raises(dg.Failure, match="batch 0000000002 differs from the one registered"):
        ticker.tick()
