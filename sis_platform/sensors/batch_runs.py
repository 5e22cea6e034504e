"""Batch runs in Dagster's terms, shared by both intake sensors (queue and landed batches).

A landed batch becomes a `batches` dynamic partition, taken on by a run of the per-batch job,
requested once (`run_key` `batch-<key>`) and tagged with its anchored chain head and message
count, so Dagster's own database keeps a copy of every anchor (sis_platform/log/chain.py).
Batches waiting together (a backlog: the lake was down, or slower than the feed) are taken on
by one run over their range (Dagster's partition-range run, `run_key` `batches-<first>-<last>`)
within `RunBounds`: a run's cost is mostly fixed (a Spark driver, a job per step), so a day of
small batches is a few runs, not 720. The
sensor's cursor is the number of the last batch handed on. Runs in flight are counted here too:
both sensors hold back while enough of the feed's batch runs wait or run (a backfill's runs do
not count: they wait behind the feed's in the run queue).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import dagster as dg

from sis_platform.assets.jobs import process_batch_job
from sis_platform.assets.partitions import BATCHES, batches_partitions
from sis_platform.assets.run_tags import (
    BATCH_TAG,
    CHAIN_HEAD_TAG,
    FIRST_BATCH_TAG,
    MESSAGES_TAG,
    RANGE_END_TAG,
    RANGE_START_TAG,
)
from sis_platform.intake.tick import ReadyBatch

# Dagster's run queue launches higher priorities first (equal ones in submission order): the
# feed's batch runs go ahead of a backfill or replay queued before them (those run at the
# default 0), so re-materializing old partitions never makes the live feed wait behind it
# for more than the run in flight.
FEED_PRIORITY = {"dagster/priority": "10"}
IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def runs_in_flight(instance: dg.DagsterInstance, limit: int) -> int:
    """The feed's batch runs queued or running, counted up to `limit` (all backpressure
    needs). Only runs at the feed's priority count: a backfill or replay of old batches (the
    default priority) must not hold back the feed's next run, which the run queue then starts
    ahead of the backfill's queued runs."""
    records = instance.get_run_records(
        dg.RunsFilter(job_name=process_batch_job.name, statuses=IN_FLIGHT, tags=FEED_PRIORITY),
        limit=max(limit, 1),
    )
    return len(records)


class RunBounds(NamedTuple):
    """How many sealed batches one run may take on: at most `max_batches`, and no more
    messages together than `max_messages` (a lone batch over it still gets its run)."""

    max_messages: int
    max_batches: int


def run_groups(batches: Sequence[ReadyBatch], bounds: RunBounds) -> list[list[ReadyBatch]]:
    """`batches` (consecutive, in landing order) cut into the runs that take them on: each run
    the longest run of batches within `bounds`. A batch without an anchor (its size unknown)
    runs alone."""
    groups: list[list[ReadyBatch]] = []
    messages = 0
    for batch in batches:
        size = batch.anchor.messages if batch.anchor is not None else None
        current = groups[-1] if groups else None
        if (
            current is not None
            and size is not None
            and current[-1].anchor is not None
            and len(current) < bounds.max_batches
            and messages + size <= bounds.max_messages
        ):
            current.append(batch)
            messages += size
        else:
            groups.append([batch])
            messages = size or 0
    return groups


def batches_result(
    instance: dg.DagsterInstance,
    runs: Sequence[Sequence[ReadyBatch]],
    *,
    cursor: str | None = None,
) -> dg.SensorResult:
    """The batches of `runs` (in landing order, at least one) registered as partitions where
    new, and each run requested (`run_request`); the cursor moves to the last batch (`cursor`:
    as the sensor writes it; by default the last batch's number)."""
    batches = [b for run in runs for b in run]
    if not batches or not all(runs):
        raise ValueError("a batch result needs at least one batch, and every run one")
    # Probed one by one: listing every registered partition would grow with the log.
    new_keys = [b.key for b in batches if not instance.has_dynamic_partition(BATCHES, b.key)]
    return dg.SensorResult(
        run_requests=[run_request(run) for run in runs],
        dynamic_partitions_requests=[batches_partitions.build_add_request(new_keys)]
        if new_keys
        else [],
        cursor=cursor if cursor is not None else str(batches[-1].seq),
    )


def run_request(batches: Sequence[ReadyBatch]) -> dg.RunRequest:
    """The run of `batches` (one, or a range of consecutive ones), requested once (`run_key`),
    at the feed's priority, tagged with the last batch's anchor when it has one (its head
    commits to every link of the range before it)."""
    first, last = batches[0], batches[-1]
    tags = {BATCH_TAG: last.key, **FEED_PRIORITY}
    if last.anchor is not None:
        tags |= {CHAIN_HEAD_TAG: last.anchor.head, MESSAGES_TAG: str(last.anchor.messages)}
    if len(batches) == 1:
        return dg.RunRequest(partition_key=last.key, run_key=f"batch-{last.key}", tags=tags)
    # Dagster's partition-range run: one run, one materialization per partition of the range.
    tags |= {
        FIRST_BATCH_TAG: first.key,
        RANGE_START_TAG: first.key,
        RANGE_END_TAG: last.key,
    }
    return dg.RunRequest(run_key=f"batches-{first.key}-{last.key}", tags=tags)
