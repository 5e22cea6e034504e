"""What Dagster's own storage holds of the message log: the batches registered as partitions
and the anchored chain head and message count each feed batch run was tagged with
(sis_platform/sensors/batch_runs.py). Dagster's storage lies outside the data folder, so
`sis-verify-log` compares these copies with the folder's anchors and visits every batch Dagster
knows of, which a truncated or rolled-back folder no longer has.

Also `sis-batch-runs restore FROM TO`: register a retired range of `batches` partitions again
(sis_platform/sensors/partition_retirement.py), so a backfill of it can be launched from the UI:

    sis-batch-runs restore FROM TO

FROM and TO are batch keys or numbers; at most RESTORE_MAX batches at once, and only batches
the landing zone holds (sealed: an anchor or a batch file). The retirement sensor never looks
again at batches at or before its cursor, so a restored range stays registered until
`sis-batch-runs retire FROM TO` removes it once its backfill has run (a run queued or running
for a batch of the range refuses it). Exit status 0 done, 2 bad arguments or configuration.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import dagster as dg

from sis_platform.assets.partitions import BATCHES
from sis_platform.assets.run_tags import BATCH_TAG, CHAIN_HEAD_TAG, MESSAGES_TAG
from sis_platform.cli.platform import EXIT_USAGE, configured_resources, parse_args
from sis_platform.lake.spark.chain import RunAnchor
from sis_platform.log.landing import Catalog, batch_key, batch_seq_of
from sis_platform.runtime.private import private_files
from sis_platform.sensors.partition_retirement import oldest_in_flight

PROGRAM = "sis-batch-runs"
# A restore registers one partition per batch: 10,000 is two weeks of the feed, half the keys
# retirement keeps at its default, so repeated restores stay far under Dagster's 100,000.
RESTORE_MAX = 10_000


class BatchRuns:
    """The batch runs and partitions of one Dagster instance."""

    def __init__(self, instance: dg.DagsterInstance) -> None:
        self.instance = instance

    def batches(self) -> list[str]:
        """The batch partitions Dagster has registered (one per batch, the retired ones not:
        about SIS_PARTITION_RETAIN_DAYS of batches, well under 100k)."""
        return list(self.instance.get_dynamic_partitions(BATCHES))

    def anchor(self, key: str) -> RunAnchor | None:
        """The chain head and message count batch `key`'s feed run was requested with (the
        latest such run); None when no run of it carries them (a batch landed by hand)."""
        records = self.instance.get_run_records(
            dg.RunsFilter(tags={BATCH_TAG: key}), limit=20, order_by="create_timestamp"
        )
        for record in records:
            tags = record.dagster_run.tags
            if CHAIN_HEAD_TAG in tags and MESSAGES_TAG in tags:
                return RunAnchor(tags[CHAIN_HEAD_TAG], int(tags[MESSAGES_TAG]))
        return None


def restore(instance: dg.DagsterInstance, catalog: Catalog, first: int, last: int) -> list[str]:
    """Register the batches `first`..`last` the landing zone holds and Dagster does not; the
    keys registered."""
    keys = [
        key
        for key in (batch_key(seq) for seq in range(first, last + 1))
        if (catalog.anchors.path(key).exists() or catalog.batch_path(key).exists())
        and not instance.has_dynamic_partition(BATCHES, key)
    ]
    if keys:
        instance.add_dynamic_partitions(BATCHES, keys)
    return keys


def retire(instance: dg.DagsterInstance, first: int, last: int) -> list[str]:
    """Remove the registered batches `first`..`last` from the partition set again (a restored
    range whose backfill has run); the keys removed. Refused (ValueError) while a run is queued
    or running for a batch at or before `last`."""
    held = oldest_in_flight(instance)
    if held is not None and held <= last:
        raise ValueError(
            f"a run for batch {held} is queued or running; retire the range once it has finished"
        )
    keys = [
        key
        for key in (batch_key(seq) for seq in range(first, last + 1))
        if instance.has_dynamic_partition(BATCHES, key)
    ]
    for key in keys:
        instance.delete_dynamic_partition(BATCHES, key)
    return keys


def _seq(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a batch key or number: {text!r}")
    return batch_seq_of(text) if len(text) == 10 else int(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROGRAM, description="Register a retired range of batches partitions again."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("restore", "register the batches FROM..TO again, for a backfill from the UI"),
        ("retire", "remove the batches FROM..TO from the partition set again (the data stays)"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument("first", metavar="FROM", type=_seq)
        command.add_argument("last", metavar="TO", type=_seq)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    private_files()
    args = parse_args(_parser(), argv)
    if isinstance(args, int):
        return args
    if args.last < args.first or args.last - args.first + 1 > RESTORE_MAX:
        print(
            f"{PROGRAM}: FROM..TO must be an ascending range of at most {RESTORE_MAX} batches",
            file=sys.stderr,
        )
        return EXIT_USAGE
    resources = configured_resources(PROGRAM)
    if resources is None:
        return EXIT_USAGE
    instance = dg.DagsterInstance.get()
    span = f"{batch_key(args.first)}..{batch_key(args.last)}"
    if args.command == "restore":
        keys = restore(instance, resources["landing"].catalog(), args.first, args.last)
        print(
            f"{PROGRAM}: registered {len(keys)} batch partition(s) of {span}; launch their "
            "backfill from the UI (process_batch), then `sis-batch-runs retire` the range"
        )
        return 0
    try:
        keys = retire(instance, args.first, args.last)
    except ValueError as error:
        print(f"{PROGRAM}: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{PROGRAM}: retired {len(keys)} batch partition(s) of {span}; the data stays")
    return 0


if __name__ == "__main__":
    sys.exit(main())
