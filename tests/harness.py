"""Drive the platform the way the daemon does, through Dagster's public APIs, in-process.

A tick evaluates the real sensor with a real (ephemeral) instance; every run it requests is
executed with `execute_in_process` for its partition, in the order requested (or any order the
test chooses). The Delta tables and the landing zone live under `tmp_path`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg

from sis_platform import config
from sis_platform.definitions import build_definitions
from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.domain.pipeline import LoggedMessage
from sis_platform.landing import LandingZone

SENSOR = "sportsdata_queue_sensor"
LOG_ASSETS = ("raw_messages", "message_items")
T0 = datetime(2026, 11, 21, 12, tzinfo=UTC)


def received(body: bytes, message_id: str | None = None, delivery_count: int = 1) -> Any:
    """A message as a source returns it (put at T0), to land straight into the landing zone."""
    from sis_platform.queues.base import ReceivedMessage, new_message_id

    return ReceivedMessage(message_id or new_message_id(), body, T0, delivery_count)


@dataclass
class Harness:
    data_dir: Path
    overrides: Mapping[str, str] = field(default_factory=dict)
    # In memory unless given; one that two threads write at once (scripts/bench.py lands
    # batches while runs run) must be on disk.
    instance: dg.DagsterInstance = field(default_factory=dg.DagsterInstance.ephemeral)

    def __post_init__(self) -> None:
        self.env = {
            "SIS_DATA_DIR": str(self.data_dir),
            "SIS_SPARK_MASTER": "local[2]",
            "SIS_SPARK_SHUFFLE_PARTITIONS": "2",
            "SIS_GET_WAIT_SECONDS": "0.05",
            **self.overrides,
        }
        self.defs = build_definitions(self.env)
        self.resources: dict[str, Any] = config.resources(self.env)
        self.cursor: str | None = None
        self.requested: list[str] = []

    @property
    def zone(self) -> LandingZone:
        return self.resources["landing"].zone()

    def lake(self, spark: Any) -> Any:
        return self.resources["lake"].lake(spark)

    def tick(self) -> dg.SensorResult | dg.SkipReason:
        sensor = self.defs.resolve_sensor_def(SENSOR)
        context = dg.build_sensor_context(
            instance=self.instance, cursor=self.cursor, resources=self.resources
        )
        result = sensor(context)
        if isinstance(result, dg.SensorResult):
            for request in result.dynamic_partitions_requests or []:
                assert isinstance(request, dg.AddDynamicPartitionsRequest)
                self.instance.add_dynamic_partitions(
                    request.partitions_def_name, list(request.partition_keys)
                )
            self.requested += [r.partition_key for r in result.run_requests or []]
            self.cursor = result.cursor
        return result

    def drain(self, max_ticks: int = 1000) -> int:
        """Tick until the sensor skips because the queue is empty; returns batches landed."""
        before = len(self.requested)
        for _ in range(max_ticks):
            if isinstance(self.tick(), dg.SkipReason):
                return len(self.requested) - before
        raise AssertionError(f"queue not drained after {max_ticks} ticks")

    def run(self, partition_key: str) -> dg.ExecuteInProcessResult:
        job = self.defs.resolve_job_def("process_batch")
        result = job.execute_in_process(partition_key=partition_key, instance=self.instance)
        assert result.success
        return result

    def materialize(self, partition_key: str, *assets: str) -> dg.ExecuteInProcessResult:
        """Run the batch job for some of its assets only (e.g. LOG_ASSETS: logged and parsed,
        as if the rest of the run had failed)."""
        result = self.defs.resolve_job_def("process_batch").execute_in_process(
            partition_key=partition_key,
            instance=self.instance,
            asset_selection=[dg.AssetKey(a) for a in assets],
        )
        assert result.success
        return result

    def run_requested(self, order: Iterable[str] | None = None) -> None:
        for key in list(order if order is not None else self.requested):
            self.run(key)

    def logged_messages(self, limits: Limits = DEFAULT_LIMITS) -> list[LoggedMessage]:
        """The message log in landing order, as the reference pipeline consumes it."""
        return logged_messages(self.zone, limits)


def logged_messages(zone: LandingZone, limits: Limits = DEFAULT_LIMITS) -> list[LoggedMessage]:
    """The message log in landing order, as the reference pipeline consumes it: a body moved
    aside at intake stays aside unless it fits `limits` now, as message_items reads it back
    (LandingZone.restored_body)."""
    logged = []
    for r in zone.iter_messages():
        message_id, count = str(r["message_id"]), int(r["delivery_count"])
        location = r["body_location"]
        if location is None:
            logged.append(LoggedMessage(message_id, bytes(r["body"]), count))
            continue
        size = int(r["body_size"])
        restored = zone.restored_body(
            str(location), size, str(r["body_sha256"]), limits.max_message_bytes
        )
        if restored is None:
            logged.append(LoggedMessage(message_id, b"", count, size, str(location)))
        else:
            logged.append(LoggedMessage(message_id, restored, count))
    return logged
