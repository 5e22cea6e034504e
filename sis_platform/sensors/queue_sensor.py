"""The only component that talks to the queue: it lands batches and registers them.

Every tick first renews (or takes) the consumer lease in the landing zone (sis_platform.lease):
a deployment that does not hold it is a standby and does nothing but say who does. The holder
lands through the lease's fence, so if it was paused past its lease and another deployment
took over, its batch is refused and its messages stay on the queue.

A body over SIS_MAX_MESSAGE_BYTES (the `processing` resource's limits) is moved aside as it is
got, never held in the batch (sis_platform/consumer.py). Each batch run is requested with the
batch's anchored chain head and message count as tags, so Dagster's database keeps a copy of
every anchor (sis_platform/logchain.py); a batch left without its anchor file by a crash right
after landing gets it from its landing file's metadata before it is registered.
"""

import dagster as dg

from sis_platform import config
from sis_platform.assets.message_log import CHAIN_HEAD_TAG, MESSAGES_TAG
from sis_platform.assets.partitions import BATCHES, batches_partitions
from sis_platform.consumer import BatchLimits, consume_batch
from sis_platform.faults import crash_point
from sis_platform.jobs import process_batch_job
from sis_platform.landing import ClosedBy, batch_seq_of
from sis_platform.lease import LeaseError
from sis_platform.queues.base import FencedOff, SourceUnavailable
from sis_platform.resources.platform import FeedProcessingResource, LandingZoneResource
from sis_platform.resources.sources import QueueSourceResource

IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


@dg.sensor(
    job=process_batch_job,
    minimum_interval_seconds=config.sensor_interval_seconds(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Gets a bounded batch from the Sportsdata queue under syncpoint, lands it "
    "durably, commits the queue, then registers the batch as a partition and requests its run.",
)
def sportsdata_queue_sensor(
    context: dg.SensorEvaluationContext,
    queue: QueueSourceResource,
    landing: LandingZoneResource,
    processing: FeedProcessingResource,
) -> dg.SensorResult | dg.SkipReason:
    zone = landing.zone()
    zone.ensure()
    lease = landing.lease()
    try:
        current = lease.acquire()
    except (LeaseError, OSError) as exc:
        # Without the lease nothing may be consumed; an unreadable lease is an outage to see.
        raise dg.Failure(
            description=f"consumer lease in {zone.root} unavailable: {exc}; retrying next tick"
        ) from exc
    if not lease.holds(current):
        # Loud but not a failure: standing by is this deployment's job until the holder stops.
        return dg.SkipReason(
            f"standby: the consumer lease in {zone.root} is held by {current.holder} "
            f"(fencing token {current.token}) until {current.expires_at:%Y-%m-%d %H:%M:%S} UTC; "
            f"{lease.holder} takes over if it is not renewed by then"
        )
    if current.acquired_at == current.renewed_at:
        context.log.warning(
            f"{lease.holder} acquired the consumer lease with fencing token {current.token}"
            + (f", taking over from {current.previous_holder}" if current.previous_holder else "")
        )
    # Only the holder cleans up: a standby must not delete the holder's file in progress.
    if removed := zone.clean_partials():
        context.log.warning(f"removed {removed} partial batch file(s) left by a crash")
    registered = int(context.cursor) if context.cursor else 0

    # Batches landed but not yet registered (a crash between landing and the end of the tick)
    # are registered before anything new is consumed.
    pending = zone.keys_after(registered)
    if not pending:
        # Backpressure: while enough batch runs wait or run, leave messages on the queue. The
        # next batch is then larger (up to its bounds), so batch size follows processing speed
        # instead of the run queue growing without bound behind a slow fold. Landing ahead of
        # the run in flight pays only in a backlog (the last batch filled up to a bound). A
        # live feed keeping up ends its batches by time or by running dry: a batch landed now
        # would wait behind the run in flight, and the messages after it behind both, so the
        # next batch waits for that run instead and takes them all at once.
        limit = landing.max_runs_in_flight
        last = zone.keys()[-1:]
        closed_by = zone.closed_by(last[0]) if last else None
        live = limit > 1 and closed_by in (ClosedBy.SECONDS, ClosedBy.DRAINED)
        if live:
            limit = 1
        in_flight = context.instance.get_run_records(
            dg.RunsFilter(job_name=process_batch_job.name, statuses=IN_FLIGHT), limit=limit
        )
        if len(in_flight) >= limit:
            return dg.SkipReason(
                f"backpressure: {len(in_flight)} batch run(s) queued or running "
                + (
                    f"and batch {last[0]} was not full (it ended: {closed_by}), so a batch "
                    "landed now would wait for the run in flight"
                    if live
                    else f"(SIS_MAX_RUNS_IN_FLIGHT={limit})"
                )
                + "; messages wait on the queue and the next batch takes more of them"
            )
        source = queue.open()
        limits = BatchLimits(
            max_messages=landing.max_messages,
            max_bytes=landing.max_bytes,
            max_seconds=landing.max_seconds,
            get_wait_seconds=landing.get_wait_seconds,
        )
        try:
            with source.connect() as session:
                batch = consume_batch(
                    session,
                    zone,
                    limits,
                    fence=lease.fence(current),
                    message_limits=processing.limits(),
                )
        except FencedOff as exc:
            raise dg.Failure(
                description=f"lost the consumer lease during the tick (paused past its expiry?): "
                f"{exc}; the messages got in this tick were backed out and stay on "
                f"{source.description} for the holder"
            ) from exc
        except OSError as exc:
            # The landing zone is probed before the first get, so an outage found there got
            # nothing; one found while landing backed out what it got (it stays on the queue).
            raise dg.Failure(
                description=f"landing zone {zone.root} unavailable: {exc}; nothing was "
                f"committed off {source.description}; retrying next tick"
            ) from exc
        except SourceUnavailable as exc:
            # A failed tick, not a skip: an outage must be visible in the UI.
            raise dg.Failure(
                description=f"queue unavailable ({source.description}): {exc}; retrying next tick"
            ) from exc
        if batch is None:
            return dg.SkipReason(
                f"queue empty: no message within {landing.get_wait_seconds}s "
                f"({source.description}); {registered} batch(es) registered so far"
            )
        crash_point("sensor.after_commit")
        context.log.info(
            f"landed batch {batch.key}: {batch.messages} message(s), {batch.bytes} bytes "
            f"from {source.description}"
        )
        pending = zone.keys_after(registered)

    known = set(context.instance.get_dynamic_partitions(BATCHES))
    new_keys = [k for k in pending if k not in known]
    run_requests = []
    for key in pending:
        tags = {"sis/batch": key}
        had_anchor = zone.anchors.path(key).exists()
        anchor = zone.ensure_anchor(key)
        if anchor is None:
            context.log.error(
                f"batch {key} has no chain anchor and its landing file carries "
                "none: its run's hash_chain_intact check will fail"
            )
        else:
            if not had_anchor:
                context.log.warning(
                    f"batch {key} had no anchor file (a crash right after it "
                    "landed): written from its landing file's metadata"
                )
            tags |= {CHAIN_HEAD_TAG: anchor.head, MESSAGES_TAG: str(anchor.messages)}
        run_requests.append(dg.RunRequest(partition_key=key, run_key=f"batch-{key}", tags=tags))
    return dg.SensorResult(
        run_requests=run_requests,
        dynamic_partitions_requests=[batches_partitions.build_add_request(new_keys)]
        if new_keys
        else [],
        cursor=str(batch_seq_of(pending[-1])),
    )
