"""sis-trace: answer a dispute about one message from the message log (the Delta tables).

    sis-trace MESSAGE_ID [--json] [--show-body]
    sis-trace --as-of MASTER_ID TIME [--json]

Prints every logged copy of the message (batch, when received, delivery count, digest, hash
chain link), how it was parsed and what became of each item (see sis_platform/lake/trace.py).
With --as-of: the master document as it was shown at TIME, the message that made that version
and when it was received (sis_platform/cli/asof.py).
Spark and the lake come from the platform's own configuration (sis_platform/resources/config.py:
SIS_PROFILE, SIS_DATA_DIR, SIS_LAKE_PATH, SIS_SPARK_MASTER, ...).

Exit status: 0 the message is in the log (--as-of: a version was shown at TIME), 1 it is not,
2 bad arguments or configuration.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sis_platform.cli import asof
from sis_platform.cli.platform import (
    EXIT_USAGE,
    configured_resources,
    parse_args,
    spark_session,
)
from sis_platform.lake.trace import (
    NOT_FOLDED,
    NOT_PARSED,
    PARSED_INVALID,
    UNACCOUNTED,
    MessageCopy,
    MessageTrace,
    TracedItem,
    TracedOutcome,
    normalize_message_id,
    trace_message,
)
from sis_platform.runtime.private import private_files

if TYPE_CHECKING:
    from sis_platform.serving import ServingReader

EXIT_FOUND = 0
EXIT_NOT_FOUND = 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sis-trace",
        description="Trace one message through the message log: every logged copy, its items "
        "and what became of each (master version applied, duplicate, filtered, dead letter, "
        "or not yet folded). Reads the Delta tables under SIS_LAKE_PATH (default "
        "$SIS_DATA_DIR/lake).",
        epilog="Exit status: 0 found (--as-of: a version was shown at TIME), 1 not in the "
        "message log (--as-of: none shown yet), 2 bad arguments.",
    )
    parser.add_argument(
        "message_id",
        metavar="MESSAGE_ID",
        nargs="?",
        help='the JMS message id, e.g. "ID:" + 48 hex digits (an MQ MsgId\'s 48 hex digits '
        "alone are accepted too)",
    )
    parser.add_argument(
        "--as-of",
        nargs=2,
        metavar=("MASTER_ID", "TIME"),
        help="instead of a message: the master document as shown at TIME (ISO 8601, e.g. "
        "2026-11-21T14:29:58Z; UTC without a zone), by the serving store when SIS_INTAKE=live, "
        "else by the lake; with the message that made that version and when it was received",
    )
    parser.add_argument("--json", action="store_true", help="print the trace as JSON")
    parser.add_argument("--show-body", action="store_true", help="include each copy's logged bytes")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    private_files()
    parser = _parser()
    args = parse_args(parser, argv)
    if isinstance(args, int):
        return args
    if (args.as_of is None) == (args.message_id is None):
        return _usage(parser, "give either MESSAGE_ID or --as-of MASTER_ID TIME")
    if args.as_of is not None:
        return _as_of(parser, *args.as_of, as_json=args.json)
    message_id = normalize_message_id(args.message_id)
    if not message_id or any(c.isspace() or not c.isprintable() for c in message_id):
        return _usage(parser, f"not a message id: {args.message_id!r}")

    resources = configured_resources("sis-trace")
    if resources is None:
        return EXIT_USAGE
    lake = resources["lake"].lake(spark_session(resources["spark"]))
    trace = trace_message(lake, message_id, include_body=args.show_body)

    if args.json:
        print(json.dumps(to_json(trace), indent=2))
    elif trace.found:
        print(render(trace), end="")
    if not trace.found:
        print(
            f"sis-trace: {message_id} is not in the message log at {lake.base_path} "
            "(a message still on the queue, in a batch sis-live has not sealed yet, or in a "
            "landing batch whose run has not logged it yet, is not in the log)",
            file=sys.stderr,
        )
        return EXIT_NOT_FOUND
    return EXIT_FOUND


def _usage(parser: argparse.ArgumentParser, error: str) -> int:
    parser.print_usage(sys.stderr)
    print(f"sis-trace: error: {error}", file=sys.stderr)
    return EXIT_USAGE


def _as_of(parser: argparse.ArgumentParser, master_id: str, time: str, *, as_json: bool) -> int:
    try:
        at = asof.parse_instant(time)
    except ValueError:
        return _usage(parser, f"not an ISO 8601 time: {time!r}")
    if not master_id.strip() or not master_id.isprintable():
        return _usage(parser, f"not a master id: {master_id!r}")
    resources = configured_resources("sis-trace")
    if resources is None:
        return EXIT_USAGE
    lake = resources["lake"].lake(spark_session(resources["spark"]))
    with _live_store(resources) as store:
        return asof.run(lake, store, master_id.strip(), at, as_json=as_json)


@contextmanager
def _live_store(resources: dict[str, Any]) -> Iterator[ServingReader | None]:
    """The serving store where the live path runs (None otherwise, or when it cannot be read:
    the answer then comes from the lake alone, and stderr says so)."""
    from sis_platform.serving import ServingUnavailable, open_reader
    from sis_platform.settings import load_settings

    if load_settings().intake != "live":
        yield None
        return
    try:
        store = open_reader(resources["serving"].url)
    except (ServingUnavailable, ValueError) as error:
        print(
            f"sis-trace: serving store not read ({error}): answering from the lake", file=sys.stderr
        )
        yield None
        return
    with store:
        yield store


def to_json(trace: MessageTrace) -> dict[str, Any]:
    """The trace as JSON-ready data: timestamps in ISO 8601 (UTC), bodies in base64."""
    copies = []
    for copy in trace.copies:
        data = _jsonable(dataclasses.asdict(copy))
        body = data.pop("body")
        if copy.body is not None:
            data["body_base64"] = body
        copies.append(data)
    counted = trace.counted
    return {
        "message_id": trace.message_id,
        "found": trace.found,
        "lake_path": trace.lake_path,
        "committed_fold_step": trace.committed_fold_step,
        "folded_up_to_batch": trace.folded_up_to_batch,
        "counted": _jsonable(dataclasses.asdict(counted)) if counted is not None else None,
        "copies": copies,
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return value


def render(trace: MessageTrace) -> str:
    """The human-readable report."""
    lines = [f"Message {trace.message_id}"]
    n = len(trace.copies)
    counted = trace.counted
    lines.append(f"  logged          {n} cop{'y' if n == 1 else 'ies'} in {trace.lake_path}")
    lines.append(f"  folded up to    {_folded_up_to(trace)}")
    if counted is not None:
        lines.append(f"  counted copy    {counted}")
    lines.append(f"  verdict         {_verdict(trace)}")
    for i, copy in enumerate(trace.copies, 1):
        lines.append("")
        lines.extend(_render_copy(trace, copy, i, n))
    return "\n".join(lines) + "\n"


def _render_copy(trace: MessageTrace, copy: MessageCopy, i: int, n: int) -> list[str]:
    lines = [
        f"Copy {i} of {n}: batch {copy.batch_key} (batch_seq {copy.batch_seq}), "
        f"message {copy.msg_seq}",
        f"  received        {_time(copy.received_at)}",
        f"  put             {_time(copy.put_time) if copy.put_time else '(not given)'}",
        f"  delivery count  {copy.delivery_count}",
        f"  body            {copy.body_bytes} bytes, sha256 {copy.body_sha256}"
        + ("" if copy.body_intact else "  ** LOGGED BYTES DO NOT MATCH THIS DIGEST **"),
        f"  chain link      {copy.chain_link}"
        + ("" if copy.link_consistent else "  ** INCONSISTENT WITH ITS INPUTS **"),
        f"  previous link   {copy.prev_link}",
    ]
    if copy.parsed == PARSED_INVALID:
        detail = f" ({copy.invalid_detail})" if copy.invalid_detail else ""
        lines.append(f"  parsed          invalid message: {copy.invalid_reason}{detail}")
    elif copy.parsed == NOT_PARSED:
        lines.append("  parsed          not yet (no message_items rows for this copy)")
    else:
        first = copy.items[0]
        kind = " ".join(p for p in (first.category, first.type) if p)
        count = len(copy.items)
        lines.append(f"  parsed          {kind}, {count} item{'s' if count != 1 else ''}")
    if copy.outcome is not None:
        lines.append(f"  outcome         {_describe(trace, copy.outcome, copy)}")
    width = max((len(item.master_id) for item in copy.items), default=0)
    for item in copy.items:
        if copy.outcome is not None:
            outcome = f"({copy.outcome.status}, as the whole message)"
        else:
            outcome = _describe(trace, item.outcome, copy)
        lines.append(f"    item {item.position}  {item.master_id:<{width}}  {outcome}")
    if copy.body is not None:
        lines.append("  body text")
        lines.extend(
            f"    {line}" for line in copy.body.decode("utf-8", "replace").splitlines() or [""]
        )
    return lines


def _describe(trace: MessageTrace, o: TracedOutcome, copy: MessageCopy) -> str:
    step = f"fold step {o.fold_step}"
    if o.status == "applied":
        warning = f", warning {o.warning}" if o.warning else ""
        if o.version is None:
            return f"applied in {step}{warning}, ** but no master_versions row found **"
        v = o.version
        return f"applied: version {v.version} ({v.operation}), fold step {v.fold_step}{warning}"
    if o.status == "duplicate":
        if o.duplicate_of is None:
            return f"duplicate ({step}); the copy that counted is not in the log"
        return f"duplicate of {o.duplicate_of}, not applied again ({step})"
    if o.status == "filtered":
        return f"filtered: {o.detail or 'not selected'} ({step})"
    if o.status == "dead-lettered":
        detail = f" ({o.detail})" if o.detail else ""
        if o.dead_letter is None:
            return f"dead-lettered: {o.reason}{detail} in {step}, ** but no dead_letters row **"
        d = o.dead_letter
        return (
            f"dead-lettered: {d.reason}{detail} at {_time(d.dead_lettered_at)}, "
            f"fold step {d.fold_step}"
        )
    if o.status == NOT_FOLDED:
        return (
            f"not yet folded: no committed fold step covers batch {copy.batch_seq} "
            f"(folded up to: {_folded_up_to(trace)})"
        )
    if o.status == UNACCOUNTED:
        return "** folded, yet the log records no outcome for it **"
    return o.status


def _verdict(trace: MessageTrace) -> str:
    counted = trace.counted
    copy = next((c for c in trace.copies if c.ref == counted), None)
    if copy is None:
        if any(not c.folded for c in trace.copies):
            return "not yet folded"
        return "** no copy is accounted for **"
    if copy.outcome is not None:
        return _describe(trace, copy.outcome, copy)
    statuses = [item.outcome.status for item in copy.items]
    counts = ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses))
    return f"{counts}: " + ", ".join(_in_brief(item) for item in copy.items)


def _in_brief(item: TracedItem) -> str:
    o = item.outcome
    if o.version is not None:
        return f"{item.master_id} v{o.version.version}"
    return f"{item.master_id} {o.reason or o.status}"


def _folded_up_to(trace: MessageTrace) -> str:
    step, batch = trace.committed_fold_step, trace.folded_up_to_batch
    return "nothing folded yet" if not step else f"batch {batch} (fold step {step})"


def _time(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")
