"""`sis-feed`: generate a simulated Sportsdata feed, publish it to a queue, or count a feed file.

    sis-feed generate --seed 1 --messages 12000 [--invalid not-well-formed=0.01 ...]
                      [--duplicates 0.02] [--start 2026-11-21] [--max-bytes N] --out feed.jsonl
    sis-feed publish --to embedded:///abs/queue-dir (--from-file feed.jsonl | generator options)
                     [--rate MSGS_PER_S | --backlog]
    sis-feed stats feed.jsonl

Publishing puts every message with its simulated message id, so a redelivered duplicate
reaches the queue with the id of its original, as the provider's redeliveries do.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import date, datetime
from pathlib import Path

from sis_platform.queues.base import SourceUnavailable
from sis_platform.queues.factory import open_source_from_environment
from sis_platform.runtime.private import private_files
from sis_platform.simulator.feedfile import FeedFileError, read_feed, write_feed, write_stream
from sis_platform.simulator.generator import (
    DEFAULT_MAX_BYTES,
    INVALID_REASONS,
    KIND_MASTER_NEW,
    FeedSimulator,
    SimulatedMessage,
)

# A progress line at most this often while publishing: as sis-live reports (live/config.py).
PROGRESS_SECONDS = 30.0
_ROOT_IDS = re.compile(rb"<sportsdata\b[^>]*?\sid=\"([^\"]*)\"")


# --- argument types ---------------------------------------------------------------------------


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a share must be within [0, 1], got {text}")
    return value


def _invalid_share(text: str) -> tuple[str, float]:
    reason, sep, share = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected REASON=SHARE, got {text!r}")
    if reason not in INVALID_REASONS:
        known = ", ".join(INVALID_REASONS)
        raise argparse.ArgumentTypeError(f"unknown reason {reason!r}; known: {known}")
    return reason, _share(share)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive_int(text: str) -> int:
    value = _count(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0.0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"a rate must be a positive number, got {text}")
    return value


def _start_date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date (YYYY-MM-DD)") from None


# --- parser -----------------------------------------------------------------------------------


def _add_generator_options(parser: argparse.ArgumentParser, *, with_defaults: bool) -> None:
    # publish leaves them unset so that combining them with --from-file can be refused.
    def default(value: object) -> object:
        return value if with_defaults else None

    group = parser.add_argument_group("generator options")
    group.add_argument("--seed", type=int, default=default(1), help="RNG seed (default 1)")
    group.add_argument(
        "--messages",
        type=_count,
        default=default(12_000),
        help="exactly this many messages (default 12000, about one racing day)",
    )
    group.add_argument(
        "--start", type=_start_date, default=None, help="first racing day, YYYY-MM-DD"
    )
    group.add_argument(
        "--invalid",
        type=_invalid_share,
        action="append",
        default=None,
        metavar="REASON=SHARE",
        help=f"share of invalid messages of a kind (repeatable): {', '.join(INVALID_REASONS)}",
    )
    group.add_argument(
        "--duplicates",
        type=_share,
        default=default(0.0),
        help="share of redelivered duplicates (default 0)",
    )
    group.add_argument(
        "--max-bytes",
        type=_positive_int,
        default=default(DEFAULT_MAX_BYTES),
        help="the consumer's body limit; too-large messages go over it (default 4 MiB)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sis-feed", description="Simulated SIS Sportsdata feed for UK/IE racing."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    generate = commands.add_parser("generate", help="write a simulated feed to a file")
    _add_generator_options(generate, with_defaults=True)
    generate.add_argument(
        "--out", required=True, help="feed file to write (JSON lines), or - for stdout"
    )
    generate.set_defaults(handler=_generate, command_parser=generate)

    publish = commands.add_parser("publish", help="put a feed on a queue")
    publish.add_argument(
        "--to", required=True, metavar="URL", help="queue URL (embedded:///dir, stomp://...)"
    )
    publish.add_argument(
        "--from-file", metavar="FILE", help="publish this feed file instead of generating"
    )
    _add_generator_options(publish, with_defaults=False)
    pacing = publish.add_mutually_exclusive_group()
    pacing.add_argument(
        "--rate", type=_rate, metavar="MSGS_PER_S", help="publish at this steady rate"
    )
    pacing.add_argument(
        "--backlog", action="store_true", help="publish as fast as possible (the default)"
    )
    publish.set_defaults(handler=_publish, command_parser=publish)

    stats = commands.add_parser("stats", help="count the messages of a feed file by kind")
    stats.add_argument("file", metavar="FILE")
    stats.set_defaults(handler=_stats, command_parser=stats)
    return parser


def _simulator(args: argparse.Namespace, parser: argparse.ArgumentParser) -> FeedSimulator:
    invalid: dict[str, float] = {}
    for reason, share in args.invalid or ():
        if reason in invalid:
            parser.error(f"--invalid {reason} given twice")
        invalid[reason] = share
    try:
        return FeedSimulator(
            1 if args.seed is None else args.seed,
            12_000 if args.messages is None else args.messages,
            start=args.start,
            invalid=invalid,
            duplicates=args.duplicates or 0.0,
            max_bytes=DEFAULT_MAX_BYTES if args.max_bytes is None else args.max_bytes,
        )
    except ValueError as error:
        parser.error(str(error))


# --- commands ---------------------------------------------------------------------------------


def _generate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    simulator = _simulator(args, parser)
    kinds: Counter[str] = Counter()

    def counted(messages: Iterable[SimulatedMessage]) -> Iterator[SimulatedMessage]:
        for message in messages:
            kinds[message.kind] += 1
            yield message

    if args.out == "-":
        written = write_stream(counted(simulator), sys.stdout)
        sys.stdout.flush()
    else:
        try:
            written = write_feed(counted(simulator), args.out)
        except OSError as error:
            print(f"sis-feed: cannot write {args.out}: {error}", file=sys.stderr)
            return 1
    summary = ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items()))
    print(f"wrote {written} messages to {args.out} ({summary})", file=sys.stderr)
    return 0


class Pacer:
    """Holds message i back until `start + i / rate` on a monotonic clock.

    Deadlines come from the start time and the message count, not from adding up sleeps, so
    time lost to slow puts or oversleeping is made up rather than accumulated as drift.
    `rate=None` (backlog) never waits.
    """

    def __init__(
        self,
        rate: float | None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self._rate = rate
        self._clock = time.monotonic if clock is None else clock
        self._sleep = time.sleep if sleep is None else sleep
        self._start = self._clock()

    def wait(self, index: int) -> None:
        """Block until message `index` (0-based) is due."""
        if self._rate is None:
            return
        delay = self._start + index / self._rate - self._clock()
        if delay > 0:
            self._sleep(delay)


def _publish(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    generator_options = ("seed", "messages", "start", "invalid", "duplicates", "max_bytes")
    if args.from_file is not None:
        given = [name for name in generator_options if getattr(args, name) is not None]
        if given:
            options = ", ".join("--" + name.replace("_", "-") for name in given)
            parser.error(f"--from-file cannot be combined with generator options ({options})")
        if not Path(args.from_file).is_file():
            parser.error(f"--from-file {args.from_file}: no such file")
        messages: Iterable[SimulatedMessage] = read_feed(args.from_file)
        total: int | None = None
    else:
        simulator = _simulator(args, parser)
        messages = simulator
        total = 12_000 if args.messages is None else args.messages

    try:
        source = open_source_from_environment(args.to)
    except ValueError as error:
        parser.error(f"--to: {error}")

    published = 0
    started = time.monotonic()

    def progress(final: bool = False) -> None:
        elapsed = max(time.monotonic() - started, 1e-9)
        of = "" if total is None else f"/{total}"
        word = "published" if final else "publishing:"
        print(
            f"{word} {published}{of} messages to {source.description}"
            f" in {elapsed:.1f}s ({published / elapsed:.0f} msg/s)",
            file=sys.stderr,
        )

    try:
        with source.producer() as producer:
            pacer = Pacer(args.rate)
            next_report = time.monotonic() + PROGRESS_SECONDS
            for index, message in enumerate(messages):
                pacer.wait(index)
                producer.put(message.body, message_id=message.message_id)
                published += 1
                if time.monotonic() >= next_report:
                    progress()
                    next_report = time.monotonic() + PROGRESS_SECONDS
    except SourceUnavailable as error:
        print(f"sis-feed: queue unavailable after {published} messages: {error}", file=sys.stderr)
        return 1
    except FeedFileError as error:
        print(f"sis-feed: {error} (after {published} messages)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"sis-feed: interrupted after {published} messages", file=sys.stderr)
        return 130
    progress(final=True)
    return 0


def _stats(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if not Path(args.file).is_file():
        parser.error(f"{args.file}: no such file")
    kinds: Counter[str] = Counter()
    ids: set[str] = set()
    masters: set[str] = set()
    multi_id = 0
    total_bytes = largest = 0
    first: datetime | None = None
    last: datetime | None = None
    try:
        for message in read_feed(args.file):
            kinds[message.kind] += 1
            ids.add(message.message_id)
            total_bytes += len(message.body)
            largest = max(largest, len(message.body))
            first = message.sent if first is None else first
            last = message.sent
            if message.kind.startswith("invalid:") or message.kind == "duplicate":
                continue
            match = _ROOT_IDS.search(message.body)
            listed = match.group(1).split() if match else []
            if len(listed) > 1:
                multi_id += 1
            if message.kind == KIND_MASTER_NEW:
                masters.update(x.decode() for x in listed)
    except FeedFileError as error:
        print(f"sis-feed: {error}", file=sys.stderr)
        return 1
    count = sum(kinds.values())
    print(f"messages        {count}")
    for kind, n in sorted(kinds.items()):
        print(f"  {kind:<28} {n:>9}  {100 * n / count:6.2f}%")
    print(f"message ids     {len(ids)}")
    print(f"masters created {len(masters)}")
    print(f"multi-id valid  {multi_id}")
    if first is not None and last is not None:
        print(f"bytes           {total_bytes} (mean {total_bytes // count}, largest {largest})")
        print(f"sent            {first.isoformat()} .. {last.isoformat()}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    private_files()
    parser = build_parser()
    args = parser.parse_args(argv)
    command: Callable[[argparse.Namespace, argparse.ArgumentParser], int] = args.handler
    # The subcommand's own parser, so that errors print that command's usage.
    command_parser: argparse.ArgumentParser = args.command_parser
    return command(args, command_parser)


if __name__ == "__main__":
    sys.exit(main())
