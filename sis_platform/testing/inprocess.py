"""Run the platform in this process: consume the queue, tick the intake sensor and execute the
runs it requests.

`InProcessPlatform` drives the code location the way the daemon does, through Dagster's public
APIs, without a daemon: a tick evaluates the real sensor with a real instance (in memory by
default, or on disk), and every run the sensor requests is executed with `execute_in_process`
for its partition, in the order requested or any order the caller chooses. The landing zone,
the lake, the queue and the serving store live under the data folder it is given. The tests and
the benchmark (scripts/bench.py) drive the platform through it.

Both intake modes (SIS_INTAKE, in `overrides`; sensor unless told):
- `sensor`: a tick is the queue sensor's: it gets one batch from the queue and lands it.
- `live`: a tick first drains the queue through sis-live's own service (sis_platform/live),
  run in a thread until a get that waited SIS_GET_WAIT_SECONDS found the queue empty and the
  serving store has applied everything landed; the service is stopped and the batch it left
  open is sealed (`ClosedBy.DRAINED`, as the sensor closes a batch when the queue runs dry);
  then the landed-batches sensor registers the sealed batches and requests their runs.
  `live()` runs the service for a caller that wants to act while it runs (an outage).

`logged_messages` reads the message log back in landing order, as the reference pipeline
(`domain/pipeline.py`) consumes it.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import dagster as dg

from sis_platform.assets.run_tags import RANGE_END_TAG, RANGE_START_TAG
from sis_platform.definitions import build_definitions
from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.domain.pipeline import LoggedMessage
from sis_platform.live.config import LiveConfig
from sis_platform.live.service import LiveService
from sis_platform.log.landing import (
    START_POSITION,
    Catalog,
    ClosedBy,
    GroupWriter,
    LandingZone,
    batch_key,
    batch_seq_of,
)
from sis_platform.queues.base import (
    QueueProducer,
    QueueSession,
    QueueSource,
    ReceivedMessage,
)
from sis_platform.queues.factory import open_configured_from_environment
from sis_platform.resources import config
from sis_platform.sensors.landed_sensor import LANDED_SENSOR_NAME
from sis_platform.sensors.queue_sensor import SENSOR_NAME
from sis_platform.serving import ServingReader, ServingWriter, open_reader, open_writer

if TYPE_CHECKING:
    from sis_platform.lake.delta import Lake

SENSOR: Final = SENSOR_NAME
LANDED_SENSOR: Final = LANDED_SENSOR_NAME
BATCH_JOB: Final = "process_batch"
LIVE_CHECK_JOB: Final = "check_live_matches_lake"
# The assets of a batch's message log: logged and parsed, before the fold.
LOG_ASSETS: Final = ("raw_messages", "message_items")
# How long a live drain may take before it is reported as stuck (a generous bound: a drain of
# the suite's feeds takes seconds).
LIVE_DRAIN_SECONDS: Final = 300.0

# Small by default, for one process on a small machine; `overrides` replace any of them.
IN_PROCESS_DEFAULTS: Final[Mapping[str, str]] = {
    # The queue sensor consumes unless the overrides choose SIS_INTAKE=live.
    "SIS_INTAKE": "sensor",
    "SIS_SPARK_MASTER": "local[2]",
    "SIS_SPARK_SHUFFLE_PARTITIONS": "2",
    "SIS_GET_WAIT_SECONDS": "0.05",
}


class RunFailed(RuntimeError):
    """A run executed in process did not succeed."""


class QueueNotDrained(RuntimeError):
    """The intake still had messages to land, or sis-live had landed messages it had not
    applied to the serving store, after the most ticks or seconds the caller allowed."""


@dataclass
class InProcessPlatform:
    """The platform on `data_dir` (SIS_DATA_DIR), with IN_PROCESS_DEFAULTS and then `overrides`
    (a mapping of SIS_* variables) as its settings.

    `requested` lists the partitions the intake sensor has requested, in order, and
    `requested_runs` the runs it requested them in (a run over a range of batches lists them
    all); `cursor` is the
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
        self.settings = config.settings_of(self.env)
        self.defs = build_definitions(self.settings)
        self.resources: dict[str, Any] = config.resources(self.settings)
        self.cursor: str | None = None
        self.requested: list[str] = []
        self.requested_runs: list[list[str]] = []

    @property
    def intake(self) -> str:
        """The intake mode: "live" (sis-live consumes) or "sensor" (the queue sensor does)."""
        return self.settings.intake

    @property
    def sensor_name(self) -> str:
        """The intake's sensor: the landed-batches sensor in live mode, else the queue's."""
        return LANDED_SENSOR if self.intake == "live" else SENSOR

    @property
    def zone(self) -> LandingZone:
        return self.resources["landing"].zone()

    @property
    def serving_url(self) -> str:
        """The serving store's URL (SIS_SERVING_URL; live intake keeps it)."""
        return self.settings.serving.url

    def open_reader(self) -> ServingReader:
        """The serving store, opened for reading (the caller closes it)."""
        return open_reader(self.serving_url)

    def open_writer(self) -> ServingWriter:
        """The serving store, opened for writing as sis-live does (the caller closes it)."""
        return open_writer(self.serving_url)

    def lake(self, spark: Any) -> Lake:
        """The lake's tables on `spark` (a SparkSession with Delta)."""
        return self.resources["lake"].lake(spark)

    def tick(self) -> dg.SensorResult | dg.SkipReason:
        """One intake tick: in live mode the queue drained by sis-live first (`drain_live`);
        then the intake sensor evaluated once, the partitions it adds registered and the runs
        it requests recorded (in `requested`); the runs are not executed."""
        if self.intake == "live":
            self.drain_live()
        return self.tick_sensor()

    def tick_sensor(self) -> dg.SensorResult | dg.SkipReason:
        """Evaluate the intake sensor once (see `tick`), without draining the queue."""
        sensor = self.defs.resolve_sensor_def(self.sensor_name)
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
                keys = _requested_keys(run_request)
                self.requested += keys
                self.requested_runs.append(keys)
            self.cursor = result.cursor
        return result

    def drain(self, max_ticks: int = 1000) -> int:
        """Land everything on the queue and request the batches' runs: tick until the sensor
        skips (sensor mode: the queue is empty; live mode: after one live drain, no sealed
        batch is left to register). Returns the batches requested."""
        before = len(self.requested)
        if self.intake == "live":
            self.drain_live()
        for _ in range(max_ticks):
            if isinstance(self.tick_sensor(), dg.SkipReason):
                return len(self.requested) - before
        raise QueueNotDrained(f"queue not drained after {max_ticks} ticks")

    def live_config(self) -> LiveConfig:
        """sis-live's settings, with the sensor's get wait as its idle wait: a drain ends
        after a get that waited SIS_GET_WAIT_SECONDS found nothing, as a sensor tick does."""
        return dataclasses.replace(
            LiveConfig.from_settings(self.settings),
            idle_wait_seconds=self.settings.batch.get_wait_seconds,
        )

    @contextmanager
    def live(
        self, source: QueueSource | None = None, live_config: LiveConfig | None = None
    ) -> Iterator[LiveRun]:
        """sis-live's service (sis_platform.live.service) consuming `source` (the configured
        queue unless given) in a thread, with `live_config` (`live_config()` unless given).
        On leaving, the service is stopped and its thread joined; after a block that raised
        nothing, the batch it left open is sealed (`seal_open_batch`)."""
        if self.intake != "live":
            raise RuntimeError("sis-live consumes only with SIS_INTAKE=live")
        config = live_config or self.live_config()
        watched = WatchedSource(
            source or open_configured_from_environment(self.settings.source),
            config.idle_wait_seconds / 2,
        )
        service = LiveService(
            watched,
            self.zone,
            self.resources["landing"].lease(),
            self.open_writer,
            config,
        )
        run = LiveRun(service, watched)
        thread = threading.Thread(target=run.serve, name="sis-live", daemon=True)
        thread.start()
        try:
            yield run
        finally:
            service.request_stop()
            thread.join(LIVE_DRAIN_SECONDS)
            if thread.is_alive():
                raise QueueNotDrained(f"sis-live did not stop within {LIVE_DRAIN_SECONDS}s")
        run.raise_failure()
        self.seal_open_batch()

    def drain_live(self, timeout: float = LIVE_DRAIN_SECONDS) -> None:
        """Run sis-live until the queue is empty and the store has applied everything landed,
        then stop it and seal the batch it left open."""
        with self.live() as run:
            run.wait_drained(timeout)

    def seal_open_batch(self) -> None:
        """Seal the batch sis-live left open (it leaves it for its next start), under the
        consumer lease, as `ClosedBy.DRAINED`: the lake gets every landed message."""
        lease = self.resources["landing"].lease()
        current = lease.acquire()
        writer = GroupWriter(self.zone.writer, lease.fence(current))
        try:
            writer.seal(ClosedBy.DRAINED)
        finally:
            lease.release()

    def run(self, partition_key: str | Sequence[str]) -> dg.ExecuteInProcessResult:
        """Execute the batch job for one partition, or for a range of them in one run (their
        keys, in order), as the run the sensor requested."""
        keys = [partition_key] if isinstance(partition_key, str) else list(partition_key)
        job = self.defs.resolve_job_def(BATCH_JOB)
        if len(keys) == 1:
            result = job.execute_in_process(partition_key=keys[0], instance=self.instance)
        else:
            result = job.execute_in_process(
                instance=self.instance,
                tags={RANGE_START_TAG: keys[0], RANGE_END_TAG: keys[-1]},
            )
        if not result.success:
            raise RunFailed(f"the run of batch(es) {keys[0]}..{keys[-1]} failed")
        return result

    def materialize(self, partition_key: str, *assets: str) -> dg.ExecuteInProcessResult:
        """Run the batch job for some of its steps only: those that materialize `assets`, each
        with every table it writes (e.g. LOG_ASSETS: logged and parsed, as if the rest of the
        run had failed)."""
        keys = {k for a in assets for k in self.defs.resolve_assets_def(a).keys}
        result = job_subset(self.defs.resolve_job_def(BATCH_JOB), keys).execute_in_process(
            partition_key=partition_key, instance=self.instance
        )
        if not result.success:
            raise RunFailed(f"the run of {', '.join(assets)} for batch {partition_key} failed")
        return result

    def run_requested(self, order: Iterable[str] | None = None) -> None:
        """Execute the requested runs, as requested (a range in one run); with `order`, a run
        of each of those batches, in that order."""
        runs = [[key] for key in order] if order is not None else list(self.requested_runs)
        for keys in runs:
            self.run(keys)

    def check_live_matches_lake(self) -> dg.AssetCheckEvaluation:
        """Execute the live_matches_lake check (live intake) as its job does; its evaluation."""
        result = self.defs.resolve_job_def(LIVE_CHECK_JOB).execute_in_process(
            instance=self.instance
        )
        if not result.success:
            raise RunFailed("the run of the live_matches_lake check failed")
        (evaluation,) = result.get_asset_check_evaluations()
        return evaluation

    def logged_messages(self, limits: Limits = DEFAULT_LIMITS) -> list[LoggedMessage]:
        """The message log in landing order, as the reference pipeline consumes it."""
        return logged_messages(self.zone.catalog, limits)


@dataclass
class LiveRun:
    """sis-live's service running in a thread of the in-process platform (`live()`)."""

    service: LiveService
    source: WatchedSource
    failure: list[BaseException] = field(default_factory=list)

    def serve(self) -> None:
        """The thread's body: the service's loop; a failure is kept for `raise_failure`."""
        try:
            self.service.run()
        except BaseException as error:
            self.failure.append(error)

    def raise_failure(self) -> None:
        if self.failure:
            raise QueueNotDrained(f"sis-live failed: {self.failure[0]!r}") from self.failure[0]

    def wait_until(
        self, done: Callable[[LiveService], bool], timeout: float = LIVE_DRAIN_SECONDS
    ) -> None:
        """Wait until `done(service)` holds after one of the service's steps; QueueNotDrained
        when `timeout` seconds pass first or the service fails."""
        if not self.service.wait_until(lambda s: bool(self.failure) or done(s), timeout):
            raise QueueNotDrained(f"sis-live: condition not reached within {timeout}s")
        self.raise_failure()

    def drained(self, service: LiveService) -> bool:
        """The queue found empty and everything landed applied to the store."""
        return (
            self.source.found_empty
            and service.holding
            and service.applier.applied == service.landed_to
        )

    def wait_drained(self, timeout: float = LIVE_DRAIN_SECONDS) -> None:
        """Wait until `drained`: the queue found empty after the last get, the store caught up.
        The queue is seen empty afresh: an emptiness noted before this call does not count."""
        self.source.found_empty = False
        self.wait_until(self.drained, timeout)


class WatchedSource(QueueSource):
    """A source that notes when its consumer found the queue empty: a get that waited at least
    `min_wait_seconds`, with nothing got in its unit of work, returned no message
    (`found_empty`, cleared by the next message got)."""

    def __init__(self, inner: QueueSource, min_wait_seconds: float) -> None:
        self.inner = inner
        self.min_wait_seconds = min_wait_seconds
        self.found_empty = False

    @property
    def description(self) -> str:
        return self.inner.description

    def connect(self) -> QueueSession:
        return _WatchedSession(self.inner.connect(), self)

    def producer(self) -> QueueProducer:
        return self.inner.producer()


class _WatchedSession(QueueSession):
    def __init__(self, inner: QueueSession, source: WatchedSource) -> None:
        self.inner = inner
        self.source = source
        self.unit = 0  # messages got in the open unit of work

    def get(self, wait_seconds: float = 0.0) -> ReceivedMessage | None:
        message = self.inner.get(wait_seconds)
        if message is not None:
            self.unit += 1
            self.source.found_empty = False
        elif not self.unit and wait_seconds >= self.source.min_wait_seconds:
            self.source.found_empty = True
        return message

    def commit(self) -> None:
        self.inner.commit()
        self.unit = 0

    def backout(self) -> None:
        self.inner.backout()
        self.unit = 0

    def close(self) -> None:
        self.unit = 0
        self.inner.close()


def job_subset(job: dg.JobDefinition, keys: Iterable[dg.AssetKey]) -> dg.JobDefinition:
    """`job` for the assets `keys` only, with the job's own checks on them. Selecting the
    assets alone (`execute_in_process(asset_selection=...)`) would add every check that targets
    them, the lake's integrity checks included, which the batch job leaves to their own job
    (assets/jobs.py): seconds of Spark queries on every fold step."""
    selected = set(keys)
    checks = {k for k in job.asset_layer.asset_graph.asset_check_keys if k.asset_key in selected}
    return job.get_subset(asset_selection=selected, asset_check_selection=checks)


def logged_messages(catalog: Catalog, limits: Limits = DEFAULT_LIMITS) -> list[LoggedMessage]:
    """The message log in landing order, as the reference pipeline consumes it: a body moved
    aside at intake stays aside unless it fits `limits` now, as message_items reads it back
    (Catalog.landed_after)."""
    return [landed.message for landed in catalog.landed_after(START_POSITION, limits)]


def _requested_keys(request: dg.RunRequest) -> list[str]:
    """The batches a run request of the intake sensor is for: its partition, or its range."""
    if request.partition_key is not None:
        return [request.partition_key]
    span = request.partition_key_range
    if span is None:
        raise TypeError("the sensor requested a run without a partition")
    return [batch_key(seq) for seq in range(batch_seq_of(span.start), batch_seq_of(span.end) + 1)]
