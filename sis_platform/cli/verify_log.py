"""sis-verify-log: verify the whole message log, or a range of its batches, end to end.

    sis-verify-log [--from KEY] [--to KEY]

For every batch in the range (every batch that has an anchor, a landing file, rows in the
Delta table `raw_messages`, a run in Dagster or the witness's record, and every number between
them), checks its anchor and its signature with the log key, its landing file (or its parts,
for a batch landed in groups), its Delta rows and, where a Dagster instance is configured
(DAGSTER_HOME), the chain head its batch run was tagged with, against each other
(sis_platform/lake/spark/chain.py), one batch at a time: the driver holds one batch's row count,
never the log. Then the log's tail against the witness outside the data folder
(sis_platform/log/landing/signed.py): a truncated tail or a rolled-back folder. Spark, the lake,
the landing zone, the log key and the witness come from the platform's own configuration
(sis_platform/resources/config.py: SIS_PROFILE, SIS_DATA_DIR, SIS_LANDING_DIR, SIS_LAKE_PATH,
SIS_LOG_KEY_FILE, SIS_LOG_WITNESS, SIS_SPARK_MASTER, ...).

Prints each problem (at most MAX_PRINTED) on stderr and a one-line summary on stdout.
Exit status: 0 the log is intact, 1 it is not (the summary names the first broken batch and
message), 2 bad arguments or configuration.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from sis_platform.cli.platform import (
    EXIT_USAGE,
    configured_resources,
    parse_args,
    spark_session,
)
from sis_platform.lake.spark.chain import verify_batch
from sis_platform.lake.tables import RAW_MESSAGES
from sis_platform.log.landing import batch_key, batch_seq_of
from sis_platform.log.landing.signed import tail_problems
from sis_platform.runtime.private import private_files
from sis_platform.settings import dagster_home

if TYPE_CHECKING:
    from sis_platform.cli.batch_runs import BatchRuns
    from sis_platform.lake.delta import Lake
    from sis_platform.log.chain import Problem
    from sis_platform.log.landing import LandingZone

EXIT_INTACT = 0
EXIT_BROKEN = 1
MAX_PRINTED = 100


def _key(text: str) -> str:
    """A batch key given as its ten digits or as its number."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a batch key: {text!r}")
    return batch_key(int(text)) if len(text) != 10 else batch_key(batch_seq_of(text))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sis-verify-log",
        description="Verify the message log's hash chain: each batch's anchor, landing file and "
        "rows in the Delta table raw_messages, every logged field of every message.",
        epilog="Exit status: 0 intact, 1 broken (names the first broken batch and message), "
        "2 bad arguments or configuration.",
    )
    parser.add_argument(
        "--from",
        dest="first",
        type=_key,
        metavar="KEY",
        help="first batch to verify (default: the first batch)",
    )
    parser.add_argument(
        "--to",
        dest="last",
        type=_key,
        metavar="KEY",
        help="last batch to verify (default: the last batch anything knows of)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    private_files()
    parser = _parser()
    args = parse_args(parser, argv)
    if isinstance(args, int):
        return args
    if args.first and args.last and args.first > args.last:
        print(
            f"sis-verify-log: error: --from {args.first} is after --to {args.last}", file=sys.stderr
        )
        return EXIT_USAGE

    resources = configured_resources("sis-verify-log")
    if resources is None:
        return EXIT_USAGE
    lake = resources["lake"].lake(spark_session(resources["spark"]))
    zone = resources["landing"].zone()
    return verify(lake, zone, args.first, args.last, runs=dagster_runs())


def dagster_runs() -> BatchRuns | None:
    """The batch runs of the Dagster instance DAGSTER_HOME configures; None (and why, on
    stderr) when there is none to read."""
    if dagster_home() is None:
        print(
            "sis-verify-log: run tags not compared: DAGSTER_HOME is not set, so there is no "
            "Dagster instance to read them from",
            file=sys.stderr,
        )
        return None
    import dagster as dg

    from sis_platform.cli.batch_runs import BatchRuns

    return BatchRuns(dg.DagsterInstance.get())


def verify(
    lake: Lake,
    zone: LandingZone,
    first: str | None,
    last: str | None,
    *,
    runs: BatchRuns | None = None,
) -> int:
    """Verify batches `first`..`last` (None: from the first / to the last known), and the log's
    tail against its witness (unless `last` is given), print the problems and the summary; the
    exit status."""
    batches = messages = printed = 0
    problems = 0
    first_problem: Problem | None = None
    head: str | None = None  # an expired batch's last link, which the next one follows
    for key in _keys(lake, zone, first, last, runs):
        run_anchor = runs.anchor(key) if runs is not None else None
        verdict = verify_batch(lake, zone, key, run_anchor=run_anchor, expired_prev=head)
        head = verdict.head
        batches += 1
        messages += verdict.messages
        problems += len(verdict.problems)
        for problem in verdict.problems:
            if printed < MAX_PRINTED:
                print(f"sis-verify-log: {problem}", file=sys.stderr)
                printed += 1
        if first_problem is None:
            first_problem = verdict.first_problem
    if last is None:
        for problem in tail_problems(zone.catalog):
            problems += 1
            print(f"sis-verify-log: {problem}", file=sys.stderr)
            # The witness names what happened to the tail (truncated, rolled back): it says
            # more than the missing batch's own problems, so the summary gives it.
            if first_problem is None or first_problem.batch_key >= problem.batch_key:
                first_problem = problem
    where = f"{zone.catalog.root} and {lake.base_path}"
    if first_problem is None:
        print(
            f"sis-verify-log: intact: {batches} batch(es), {messages} message(s) verified ({where})"
        )
        return EXIT_INTACT
    print(
        f"sis-verify-log: BROKEN: {problems} problem(s) in {batches} batch(es); first "
        f"broken batch {first_problem.batch_key}"
        + (
            f" message {first_problem.msg_seq} ({first_problem.message_id})"
            if first_problem.message_id is not None
            else ""
        )
        + f": {first_problem.text} ({where})"
    )
    return EXIT_BROKEN


def _keys(
    lake: Lake, zone: LandingZone, first: str | None, last: str | None, runs: BatchRuns | None
) -> Iterator[str]:
    """Every batch number from `first` to `last`: the last is the highest any copy knows of
    (anchors, landed batches, Delta rows, Dagster's batch partitions, the witness), so a batch
    missing from the folder but followed by another, or known outside it, is still visited
    and reported. A batch still open (landed in parts, not sealed) is not part of the log yet
    and is not verified."""
    known = set(zone.catalog.keys()) | set(zone.catalog.anchors.keys())
    if runs is not None:
        known |= set(runs.batches())
    if zone.catalog.signer.seal is not None:
        try:
            witnessed = zone.catalog.signer.seal.witness.read()
        except ValueError:  # reported by tail_problems
            witnessed = None
        if witnessed is not None:
            known.add(witnessed.batch_key)
    if lake.exists(RAW_MESSAGES):
        # One string per batch (partitions stay well under 100k): bounded by the batch count.
        rows = lake.read(RAW_MESSAGES).select("batch_key").distinct().collect()
        known |= {str(r["batch_key"]) for r in rows}
    seqs = [batch_seq_of(k) for k in known if k.isdigit() and len(k) == 10]
    start = batch_seq_of(first) if first else 1
    end = batch_seq_of(last) if last else max(seqs, default=0)
    for seq in range(start, end + 1):
        yield batch_key(seq)
