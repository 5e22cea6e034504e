"""What signing the message log costs on the live path: landing a group (one part, its running
anchor signed with the log key) with and without a seal, and sealing a batch (its parts read
and checked once, its anchor signed, the witness moved), for a few batch sizes.

    python scripts/bench_log_seal.py [--groups N] [--messages-per-group M]

Prints median milliseconds; writes only under a temporary folder.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from sis_platform.log.landing import ClosedBy, GroupWriter, LandingZone
from sis_platform.queues.base import ReceivedMessage, new_message_id

BODY = b"<SportsData><Event id='1'>" + b"x" * 2000 + b"</Event></SportsData>"


def _group(n: int) -> list[ReceivedMessage]:
    now = datetime.now(UTC)
    return [ReceivedMessage(new_message_id(), BODY, now, 1) for _ in range(n)]


def _zone(root: Path, signed: bool) -> LandingZone:
    if not signed:
        return LandingZone(root / "landing")
    from sis_platform.log.seal import KeySource, LogSeal, Witness

    seal = LogSeal(KeySource(root / "keys" / "log.key", create=True), Witness(root / "witness"))
    return LandingZone(root / "landing", seal)


def _run(signed: bool, groups: int, per_group: int) -> tuple[float, float]:
    """Median ms to land a group, and ms to seal the batch they made."""
    with tempfile.TemporaryDirectory() as folder:
        writer = GroupWriter(_zone(Path(folder), signed).writer)
        times = []
        for _ in range(groups):
            start = time.perf_counter()
            writer.land(_group(per_group))
            times.append(time.perf_counter() - start)
        start = time.perf_counter()
        writer.seal(ClosedBy.SECONDS)
        seal = time.perf_counter() - start
    return statistics.median(times) * 1000, seal * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=500)
    parser.add_argument("--messages-per-group", type=int, default=2)
    parser.add_argument(
        "--unsigned-only", action="store_true", help="only without a seal (code before signing)"
    )
    args = parser.parse_args()
    for groups in (args.groups, args.groups * 4):
        for signed in (False,) if args.unsigned_only else (False, True):
            land_ms, seal_ms = _run(signed, groups, args.messages_per_group)
            messages = groups * args.messages_per_group
            print(
                f"{'signed  ' if signed else 'unsigned'} {groups} groups of "
                f"{args.messages_per_group} ({messages} messages): land a group {land_ms:.2f} ms "
                f"(median), seal the batch {seal_ms:.1f} ms"
            )


if __name__ == "__main__":
    main()
