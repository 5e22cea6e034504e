"""The landed-batches sensor: the lake's intake when sis-live consumes the queue (SIS_INTAKE=live).

sis-live lands the feed in groups and seals them into batches (sis_platform/log/landing). Each
tick this sensor takes the batches sealed after its cursor, found by probing the next keys
(`Catalog.sealed_after`: the cost is the number of new batches, never the size of the
zone), and hands them on to Dagster as the queue sensor does
(sis_platform/sensors/batch_runs.py): a `batches` partition each, with the chain anchor in its
run's tags, and the cursor at the last of them. It never touches the queue.

Batches that wait together share a run (`run_groups`): one run over their range, up to
MAX_BATCHES_PER_RUN batches (a day of the feed's) and SIS_BATCH_MAX_MESSAGES messages in all,
the bound a single batch has. At the feed's pace each batch gets a run of its own; after an
outage a day's backlog of small batches is a few runs. A tick requests at most
MAX_RUNS_PER_TICK runs, no more than SIS_MAX_RUNS_IN_FLIGHT leaves room for, and none while
that many batch runs are queued or running: sealed batches wait durably in the landing zone
meanwhile, so Dagster's run queue stays short in a backlog.

Without a cursor (a new deployment, or one switching from SIS_INTAKE=sensor) it starts after
the last `batches` partition already registered, so no batch is requested twice.

The cursor also holds the chain head of the last batch registered (`LandedCursor`). A landing
zone that went backwards under the lake (a volume snapshot restored, a replica promoted) would
land new batches under numbers already registered, whose runs (`run_key`) are never requested
again: each tick first checks that the cursor's batch is still in the zone with the head it was
registered with, and fails the tick loudly otherwise (`landing_went_back`), registering nothing.
"""

from __future__ import annotations

from typing import NamedTuple

import dagster as dg

from sis_platform.assets.jobs import process_batch_job
from sis_platform.assets.partitions import BATCHES
from sis_platform.intake.tick import ready_batch
from sis_platform.log.landing import Catalog, batch_key, batch_seq_of
from sis_platform.log.landing.groups import open_batch_of
from sis_platform.resources.platform import LandingZoneResource
from sis_platform.sensors.batch_runs import (
    RunBounds,
    batches_result,
    run_groups,
    runs_in_flight,
)

LANDED_SENSOR_NAME = "landed_batches_sensor"
# A day of the feed's batches (one sealed every two minutes): bounds what one run takes on,
# and the length of a run's range.
MAX_BATCHES_PER_RUN = 720
# Runs a tick requests at most (fewer when SIS_MAX_RUNS_IN_FLIGHT leaves less room): a tick
# probes and reads the anchors of at most this many runs' batches.
MAX_RUNS_PER_TICK = 2


def build_landed_batches_sensor(minimum_interval_seconds: int) -> dg.SensorDefinition:
    """The landed-batches sensor, evaluated at most every `minimum_interval_seconds`."""

    @dg.sensor(
        name=LANDED_SENSOR_NAME,
        job=process_batch_job,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Registers the batches sis-live has landed and sealed as partitions and "
        "requests their runs (the lake's intake in live mode; it never reads the queue).",
    )
    def landed_batches_sensor(
        context: dg.SensorEvaluationContext, landing: LandingZoneResource
    ) -> dg.SensorResult | dg.SkipReason:
        zone = landing.zone()
        cursor = (
            LandedCursor.parse(context.cursor)
            if context.cursor
            else LandedCursor(_last_registered(context.instance), None)
        )
        went_back = landing_went_back(zone.catalog, cursor)
        if went_back is not None:
            raise dg.Failure(description=went_back)
        after = cursor.seq
        room = landing.max_runs_in_flight - runs_in_flight(
            context.instance, landing.max_runs_in_flight
        )
        if room <= 0:
            return dg.SkipReason(
                f"backpressure: {landing.max_runs_in_flight} batch run(s) queued or running "
                f"(SIS_MAX_RUNS_IN_FLIGHT); batches sealed after {after} wait in the landing "
                "zone"
            )
        room = min(room, MAX_RUNS_PER_TICK)
        keys = zone.catalog.sealed_after(after, room * MAX_BATCHES_PER_RUN)
        if not keys:
            return dg.SkipReason(_nothing_sealed(zone.catalog, after))
        batches = [ready_batch(zone, key, context.log) for key in keys]
        runs = run_groups(batches, RunBounds(landing.max_messages, MAX_BATCHES_PER_RUN))[:room]
        last = runs[-1][-1]
        context.log.info(
            f"registering sealed batch(es) {keys[0]}..{last.key} in {len(runs)} run(s)"
        )
        moved_to = LandedCursor(last.seq, last.anchor.head if last.anchor else None)
        return batches_result(context.instance, runs, cursor=moved_to.text)

    return landed_batches_sensor


class LandedCursor(NamedTuple):
    """The sensor's cursor: the last batch registered and its anchored chain head (None: not
    known, e.g. a cursor written before heads were kept)."""

    seq: int
    head: str | None

    @property
    def text(self) -> str:
        return f"{self.seq}:{self.head}" if self.head else str(self.seq)

    @classmethod
    def parse(cls, text: str) -> LandedCursor:
        seq, _, head = text.partition(":")
        return cls(int(seq), head or None)


def landing_went_back(catalog: Catalog, cursor: LandedCursor) -> str | None:
    """Why the landing zone is no longer the one the cursor's batches were registered from, or
    None: the cursor's batch must still be landed, with the chain head it was registered with
    (one anchor read a tick)."""
    if cursor.seq == 0:
        return None
    key = batch_key(cursor.seq)
    anchor = catalog.anchors.read(key)
    if anchor is None and not catalog.batch_path(key).is_file():
        last_seq, _ = catalog.last()
        return (
            f"the landing zone went backwards: batch {key}, which was registered, is gone (the "
            f"zone's last batch is {last_seq}); was it restored from an earlier copy? Batches "
            "landed under registered numbers would never run: nothing is registered until the "
            "landing zone is put right (docs/operations.md)"
        )
    if anchor is not None and cursor.head is not None and anchor.head != cursor.head:
        return (
            f"the landing zone went backwards: batch {key} differs from the one registered "
            f"(chain head {anchor.head}, registered with {cursor.head}); was it restored from "
            "an earlier copy and landed again? Its run was requested for the other content and "
            "will not run again: nothing is registered until the landing zone is put right "
            "(docs/operations.md)"
        )
    return None


def _last_registered(instance: dg.DagsterInstance) -> int:
    """The number of the last `batches` partition registered (0: none), read once when the
    sensor has no cursor yet."""
    keys = instance.get_dynamic_partitions(BATCHES)
    return max((batch_seq_of(k) for k in keys), default=0)


def _nothing_sealed(catalog: Catalog, after: int) -> str:
    """Why there is nothing to register, with the open batch's size when there is one (read
    from its last part's metadata: one folder listed)."""
    key = batch_key(after + 1)
    parts = catalog.parts(key)
    if not parts:
        return (
            f"no sealed batch after {after}; no batch is open (sis-live has landed nothing since)"
        )
    batch = open_batch_of(key, parts)
    return (
        f"no sealed batch after {after}; sis-live's open batch {key} has {batch.messages} "
        f"message(s) in {batch.parts} part(s) since {batch.opened_at:%H:%M:%S} UTC"
    )
