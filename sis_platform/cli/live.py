"""`sis-live`: the live path's resident consumer (docs/live.md). It takes everything from the
settings (SIS_* variables, sis_platform/settings/) and runs until SIGTERM or SIGINT, which end
it cleanly (exit 0) after the group in hand. It refuses to start when SIS_INTAKE=sensor: one
intake mode consumes at a time.

`sis-live health` answers a liveness probe from the running process's heartbeat
(sis_platform/runtime/heartbeat.py): exit 0 when its loop went round within
SIS_LIVE_STALL_SECONDS, 1 otherwise; `sis-live health --ready`, a readiness probe: 0 when it is
alive, holds the consumer lease and its serving store has caught up. Neither touches the store,
the queue or Dagster; each prints one line saying why. A running sis-live answers the same
verdicts over HTTP, with its metrics, on SIS_METRICS_ADDRESS (/healthz, /readyz, /metrics:
sis_platform/live/endpoint.py).

`sis-live merge` merges an existing landing zone offline (sis_platform/log/landing/merge.py): every
sealed batch still in parts becomes one file, and the parts of batches merged more than
SIS_LANDING_MERGE_GRACE_SECONDS ago are removed. It takes the consumer lease under a holder of
its own, so it refuses while a sis-live (which merges in its idle turns) holds it, and no
consumer lands meanwhile; it releases the lease when done. Exit 0 when every sealed batch
verified, 1 when a batch's parts did not (named, left as they are) or the lease is held.

`sis-live new-log` starts a new log where one was removed whole (the data folder deleted on
purpose): the earlier log's witness, which would otherwise refuse to seal the new log's batches
as a rollback, is moved aside beside itself (sis_platform/log/landing/signed.py
`retire_witness`). It refuses (exit 1) unless the landing zone is empty and the lake, where it
is a local folder, holds no message log, and takes the consumer lease as `merge` does."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sis_platform.runtime.logs import configure_logging
from sis_platform.runtime.private import private_files, private_folder
from sis_platform.settings import ConfigurationError, Settings, load_settings

if TYPE_CHECKING:
    from sis_platform.intake.lease import ConsumerLease, Lease

DESCRIPTION = (
    "Consume the queue: land small groups durably, commit the queue, fold them in memory and "
    "commit the result with its log position to the serving store. Configured by the SIS_* "
    "variables (docs/configuration.md); SIGTERM or SIGINT stop it after the group in hand."
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sis-live", description=DESCRIPTION)
    parser.add_argument(
        "command",
        nargs="?",
        default="run",
        choices=("run", "health", "merge", "new-log"),
        help="run (the default): consume; health: probe the running process's heartbeat "
        "(exit 0 alive, 1 not); merge: merge the landing zone's sealed batches into one file "
        "each, offline; new-log: retire the witness of a log whose data folder was removed, so "
        "that a new log starts there",
    )
    parser.add_argument(
        "--ready",
        action="store_true",
        help="with health: exit 0 only if it also holds the consumer lease and has caught up",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="how much to log (default INFO: a line per interval, never one per message)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    private_files()
    args = _parser().parse_args(argv)
    configure_logging(args.log_level, "text")
    try:
        settings = load_settings()
    except ConfigurationError as error:
        print(f"sis-live: {error}", file=sys.stderr)
        return 2
    configure_logging(args.log_level, settings.log_format)  # SIS_LOG_FORMAT
    if args.command == "health":
        return _health(settings, ready=args.ready)
    if args.command == "merge":
        return _merge(settings)
    if args.command == "new-log":
        return _new_log(settings)
    if settings.intake == "sensor":
        print(
            "sis-live: SIS_INTAKE=sensor: the queue sensor is this deployment's consumer, and "
            "one intake mode consumes at a time; unset SIS_INTAKE (or set it to live) to run "
            "sis-live",
            file=sys.stderr,
        )
        return 2
    private_folder(settings.data_dir, create=True)  # only once it will run: a refusal makes nothing
    # Imported once the arguments are parsed: the service's modules (pyarrow, lxml, the store)
    # take 0.36 s to import (measured with -X importtime), which `sis-live --help` need not pay.
    from sis_platform.live.process import build_service, run_with_endpoint, start_traces

    try:
        traces = start_traces(settings)  # None unless OTEL_EXPORTER_OTLP_ENDPOINT is set
    except ConfigurationError as error:
        print(f"sis-live: {error}", file=sys.stderr)
        return 2
    try:
        run_with_endpoint(build_service(settings, traces), settings)
    finally:
        if traces is not None:
            traces.shutdown()  # the spans still queued are exported on an orderly stop
    return 0


def _health(settings: Settings, *, ready: bool) -> int:
    """The probe: the heartbeat file's verdict, printed, as the exit status."""
    from sis_platform.runtime.heartbeat import health, read_beat

    beat = read_beat(settings.live.heartbeat_file)
    verdict = health(beat, time.monotonic(), settings.live.stall_seconds)
    print(f"sis-live: {verdict.reason}")
    return 0 if (verdict.ready if ready else verdict.alive) else 1


def _offline_lease(
    settings: Settings, landing: Path, command: str
) -> tuple[ConsumerLease, Lease] | None:
    """The consumer lease taken for an offline `command` on the landing zone (under a holder of
    its own, so that no consumer lands meanwhile), or None, the holder printed, when a consumer
    holds it."""
    from sis_platform.intake.lease import ConsumerLease, holder_id

    lease = ConsumerLease(
        landing, holder_id(f"{settings.batch.deployment}.{command}"), settings.batch.lease_seconds
    )
    current = lease.acquire()
    if lease.holds(current):
        return lease, current
    print(
        f"sis-live {command}: the consumer lease is held by {current.holder} (a running "
        f"consumer): nothing done",
        file=sys.stderr,
    )
    return None


def _merge(settings: Settings) -> int:
    """`sis-live merge`: the zone merged under the consumer lease, what was done printed."""
    from sis_platform.live.process import landing_zone

    zone = landing_zone(settings)
    taken = _offline_lease(settings, zone.catalog.root, "merge")
    if taken is None:
        return 1
    lease, current = taken
    grace = settings.live.merge_grace_seconds
    try:
        zone.writer.clean_partials()  # as any new lease holder: what a crash left half-written
        report = zone.upkeep.merge_all(
            lease.fence(current), grace, still_held=lambda: lease.holds(lease.acquire())
        )
    finally:
        lease.release()
    print(
        f"sis-live merge: {report.merged} batch(es) merged into one file; {report.removed} "
        f"parts folder(s) removed, {report.kept} kept for their grace ({grace:g} s)"
    )
    if report.refused:
        print(
            f"sis-live merge: not merged, their parts do not verify against their anchors: "
            f"{', '.join(report.refused)} (run sis-verify-log)",
            file=sys.stderr,
        )
        return 1
    return 0


def _new_log(settings: Settings) -> int:
    """`sis-live new-log`: the earlier log's witness retired under the consumer lease, when
    nothing of that log is left; what was done printed."""
    from datetime import UTC, datetime

    from sis_platform.lake.tables import RAW_MESSAGES
    from sis_platform.lake.upkeep import local_folder
    from sis_platform.live.process import landing_zone
    from sis_platform.log.landing.signed import LogNotNew, retire_witness

    lake = local_folder(settings.lake_path)
    if lake is not None:
        log = lake / RAW_MESSAGES.name / "_delta_log"
        if log.exists():
            print(
                f"sis-live new-log: the lake at {settings.lake_path} still holds a message log "
                f"({log}): a new log needs a new lake too; the witness stays",
                file=sys.stderr,
            )
            return 1
    zone = landing_zone(settings)
    if zone.catalog.signer.seal is None:
        print("sis-live new-log: the log is not signed (no log key configured): no witness")
        return 0
    taken = _offline_lease(settings, zone.catalog.root, "new-log")
    if taken is None:
        return 1
    lease = taken[0]
    try:
        retired = retire_witness(zone.catalog, datetime.now(UTC))
    except LogNotNew as error:
        print(f"sis-live new-log: {error}", file=sys.stderr)
        return 1
    finally:
        lease.release()
    if retired is None:
        witness = zone.catalog.signer.seal.witness.path
        print(f"sis-live new-log: no witness at {witness}: the next batch starts a new log")
        return 0
    seen = retired.witnessed
    earlier = (
        f"batch {seen.batch_key} sealed with {seen.messages} message(s)"
        if seen is not None
        else "an unreadable witness"
    )
    print(
        f"sis-live new-log: the earlier log's witness ({earlier}) moved to {retired.path}; "
        "the next batch landed starts a new log"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
