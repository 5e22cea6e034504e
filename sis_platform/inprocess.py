"""Run the platform in this process: tick the queue sensor and execute the runs it requests.

`InProcessPlatform` drives the code location the way the daemon does, through Dagster's public
APIs, without a daemon: a tick evaluates the real sensor with a real instance (in memory by
default, or on disk), and every run the sensor requests is executed with `execute_in_process`
for its partition, in the order requested or any order the caller chooses. The landing zone,
the lake and the queue live under the data folder it is given. The tests and the benchmark
(scripts/bench.py) drive the platform through it.

`logged_messages` reads the message log back in landing order, as the reference pipeline
(`domain/pipeline.py`) consumes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import dagster as dg

from sis_platform import config
from sis_platform.definitions import build_definitions
from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.domain.pipeline import LoggedMessage
from sis_platform.landing import START_POSITION, LandingZone
from sis_platform.sensors.queue_sensor import SENSOR_NAME

if TYPE_CHECKING:
    from sis_platform.lake.delta import Lake

SENSOR: Final = SENSOR_NAME
BATCH_JOB: Final = "process_batch"
# The assets of a batch's message log: logged and parsed, before the fold.
LOG_ASSETS: Final = ("raw_messages", "message_items")

# Small by default, for one process on a small machine; `overrides` replace any of them.
IN_PROCESS_DEFAULTS: Final[Mapping[str, str]] = {
    # It drives the queue sensor: sensor intake (sis-live is a process of its own).
    "SIS_INTAKE": "sensor",
    "SIS_SPARK_MASTER": "local[2]",
    "SIS_SPARK_SHUFFLE_PARTITIONS": "2",
    "SIS_GET_WAIT_SECONDS": "0.05",
}


class RunFailed(RuntimeError):
    """A run executed in process did not succeed."""


class QueueNotDrained(RuntimeError):
    """The sensor still had messages to land after the most ticks the caller allowed."""


@dataclass
class InProcessPlatform:
    """The platform on `data_dir` (SIS_DATA_DIR), with IN_PROCESS_DEFAULTS and then `overrides`
    (a mapping of SIS_* variables) as its settings.

    `requested` lists the partitions the sensor has requested, in order; `cursor` is the
    sensor's cursor between ticks. The instance is in memory unless given; one that two threads
    write at once (scripts/bench.py lands batches while runs run) must be on disk.
    """

    data_dir: Path
    overrides: Mapping[str, str] = field(default_factory=dict)
    instance: dg.DagsterInstance = field(default_factory=dg.DagsterInstance.ephemeral)

    def __post_init__(self) -> None:
        self.env: dict[str, str] = {
            "SIS_DATA_DIR": str(self.data_dir),
            **IN_PROCESS_DEFAULTS,
            **self.overrides,
        }
        self.defs = build_definitions(self.env)
        self.resources: dict[str, Any] = config.resources(self.env)
        self.cursor: str | None = None
        self.requested: list[str] = []

    @property
    def zone(self) -> LandingZone:
        return self.resources["landing"].zone()

    def lake(self, spark: Any) -> Lake:
        """The lake's tables on `spark` (a SparkSession with Delta)."""
        return self.resources["lake"].lake(spark)

    def tick(self) -> dg.SensorResult | dg.SkipReason:
        """Evaluate the sensor once: register the partitions it adds and record the runs it
        requests (in `requested`); the runs are not executed."""
        sensor = self.defs.resolve_sensor_def(SENSOR)
        context = dg.build_sensor_context(
            instance=self.instance, cursor=self.cursor, resources=self.resources
        )
        result = sensor(context)
        if not isinstance(result, (dg.SensorResult, dg.SkipReason)):
            raise TypeError(f"the sensor returned {type(result).__name__}")
        if isinstance(result, dg.SensorResult):
            for request in result.dynamic_partitions_requests or []:
                if not isinstance(request, dg.AddDynamicPartitionsRequest):
                    raise TypeError(f"the sensor asked to {type(request).__name__}")
                self.instance.add_dynamic_partitions(
                    request.partitions_def_name, list(request.partition_keys)
                )
            for run_request in result.run_requests or []:
                if run_request.partition_key is None:
                    raise TypeError("the sensor requested a run without a partition")
                self.requested.append(run_request.partition_key)
            self.cursor = result.cursor
        return result

    def drain(self, max_ticks: int = 1000) -> int:
        """Tick until the sensor skips because the queue is empty; returns batches landed."""
        before = len(self.requested)
        for _ in range(max_ticks):
            if isinstance(self.tick(), dg.SkipReason):
                return len(self.requested) - before
        raise QueueNotDrained(f"queue not drained after {max_ticks} ticks")

    def run(self, partition_key: str) -> dg.ExecuteInProcessResult:
        """Execute the batch job for one partition, as the run the sensor requested."""
        job = self.defs.resolve_job_def(BATCH_JOB)
        result = job.execute_in_process(partition_key=partition_key, instance=self.instance)
        if not result.success:
            raise RunFailed(f"the run of batch {partition_key} failed")
        return result

    def materialize(self, partition_key: str, *assets: str) -> dg.ExecuteInProcessResult:
        """Run the batch job for some of its steps only: those that materialize `assets`, each
        with every table it writes (e.g. LOG_ASSETS: logged and parsed, as if the rest of the
        run had failed)."""
        keys = {k for a in assets for k in self.defs.resolve_assets_def(a).keys}
        result = self.defs.resolve_job_def(BATCH_JOB).execute_in_process(
            partition_key=partition_key,
            instance=self.instance,
            asset_selection=sorted(keys),
        )
        if not result.success:
            raise RunFailed(f"the run of {', '.join(assets)} for batch {partition_key} failed")
        return result

    def run_requested(self, order: Iterable[str] | None = None) -> None:
        """Execute the requested runs, in the order requested unless `order` is given."""
        for key in list(order if order is not None else self.requested):
            self.run(key)

    def logged_messages(self, limits: Limits = DEFAULT_LIMITS) -> list[LoggedMessage]:
        """The message log in landing order, as the reference pipeline consumes it."""
        return logged_messages(self.zone, limits)


def logged_messages(zone: LandingZone, limits: Limits = DEFAULT_LIMITS) -> list[LoggedMessage]:
    """The message log in landing order, as the reference pipeline consumes it: a body moved
    aside at intake stays aside unless it fits `limits` now, as message_items reads it back
    (LandingZone.landed_after)."""
    return [landed.message for landed in zone.landed_after(START_POSITION, limits)]
