"""Files in the landing zone in the feed's real shape, before and after the landing merge
(sis_platform/log/landing/merge.py): N batches landed by sis-live's writer one message per group
(each its own part, as at the feed's average of 0.42 msg/s), sealed every M messages (0.42 msg/s
x SIS_LIVE_BATCH_SECONDS 120 s = 50), on a signed zone; then every batch merged and its parts
removed by sis-live's `Merger` in idle turns (its 50 ms budget, no grace), each turn timed.

Then, with `--expire`, every batch but the newest expired (sis_platform/log/landing/expiry.py)
by sis-live's `Expirer` in idle turns, as if the lake had checked them all and the retention
had passed: the first expiry of a zone that kept everything, the largest amount of work one
look can find.

    python scripts/bench_landing_merge.py [--batches N] [--messages-per-batch M] [--expire]

Prints files and bytes under landing/ before and after, per batch and per day (720 batches),
and the turns it took with their median, 99th-percentile and largest milliseconds (a message
arriving during an idle turn waits at most one turn). Writes only under a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path

from sis_platform.log.landing import ClosedBy, GroupWriter, LandingZone, batch_key
from sis_platform.log.landing.expiry import Expirer
from sis_platform.log.landing.merge import Merger
from sis_platform.log.seal import KeySource, LogSeal, Witness
from sis_platform.queues.base import ReceivedMessage
from sis_platform.simulator.generator import generate_feed

BATCHES_PER_DAY = 720  # one every SIS_LIVE_BATCH_SECONDS (120 s)


def _usage(root: Path) -> tuple[int, int]:
    """Files and bytes under `root`."""
    files = size = 0
    for folder, _, names in os.walk(root):
        for name in names:
            files += 1
            size += (Path(folder) / name).stat().st_size
    return files, size


def _land(zone: LandingZone, batches: int, per_batch: int) -> None:
    writer = GroupWriter(zone.writer)
    feed = generate_feed(7, batches * per_batch)
    for _ in range(batches):
        for message in islice(feed, per_batch):
            now = datetime.now(UTC)
            writer.land([ReceivedMessage(message.message_id, message.body, now, 1)], now=now)
        writer.seal(ClosedBy.SECONDS)


def _line(what: str, files: int, size: int, batches: int) -> str:
    return (
        f"{what:<14} {files:>8} files {size / 1e6:>9.2f} MB | per batch {files / batches:>7.1f} "
        f"files | per day {files / batches * BATCHES_PER_DAY:>9.0f} files "
        f"{size / batches * BATCHES_PER_DAY / 1e6:>8.1f} MB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--messages-per-batch", type=int, default=50)
    parser.add_argument("--expire", action="store_true", help="then expire all but the newest")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        seal = LogSeal(KeySource(root / "keys" / "log.key", create=True), Witness(root / "w"))
        zone = LandingZone(root / "landing", seal)
        _land(zone, args.batches, args.messages_per_batch)
        before = _usage(zone.catalog.root)
        merger = Merger(zone.upkeep, None, grace_seconds=0.0)
        turns = []
        while merger.pending:
            start = time.perf_counter()
            merger.turn()
            turns.append(time.perf_counter() - start)
        after = _usage(zone.catalog.root)
        assert not zone.catalog.batch_dir(batch_key(args.batches)).exists()
        expire_turns = _expire(zone, args.batches) if args.expire else []
        expired = _usage(zone.catalog.root)
    print(
        f"{args.batches} batches of {args.messages_per_batch} messages, one message per part "
        "(anchors included in the counts)"
    )
    print(_line("before merge", *before, args.batches))
    print(_line("after merge", *after, args.batches))
    print(_turns("merge turns", turns, args.batches))
    if args.expire:
        print(_line("after expiry", *expired, args.batches))
        print(_turns("expiry turns", expire_turns, args.batches))


def _expire(zone: LandingZone, batches: int) -> list[float]:
    """Expire every batch but the newest in idle turns; each turn's seconds."""
    expirer = Expirer(zone.upkeep, None, retain_seconds=0.0, check_seconds=0.0)
    turns = []
    while True:
        start = time.perf_counter()
        expirer.turn(checked_batch=batches)
        turns.append(time.perf_counter() - start)
        expiry = zone.catalog.expiry()
        if (
            expiry is not None
            and expiry.through_seq == batches - 1
            and len(zone.catalog.keys()) == 1
        ):
            return turns


def _turns(what: str, turns: list[float], batches: int) -> str:
    ms = sorted(t * 1000 for t in turns)
    return (
        f"{what}: {len(ms)} ({len(ms) / batches:.1f} per batch); median "
        f"{statistics.median(ms):.1f} ms, p99 {ms[int(len(ms) * 0.99)]:.1f} ms, "
        f"largest {ms[-1]:.1f} ms"
    )


if __name__ == "__main__":
    main()
