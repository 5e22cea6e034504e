"""`sis-trace --as-of MASTER_ID TIME`: a master document as the platform showed it at TIME.

The answer comes from sis_platform/lake/asof.py: the lake's committed versions of that master and,
where the live path runs (SIS_INTAKE=live, the default), the serving store's change log. This
module parses TIME, opens the store and prints the answer; sis-trace's `main` calls `run`.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sis_platform.lake.asof import AsOf, MasterVersion
    from sis_platform.lake.delta import Lake
    from sis_platform.serving import ServingReader

EXIT_SHOWN = 0
EXIT_NOTHING_SHOWN = 1


def parse_instant(text: str) -> datetime:
    """An ISO 8601 instant ("2026-11-21T14:29:58Z", "2026-11-21 14:29:58.250+01:00"); without a
    zone it is UTC. ValueError for anything else."""
    from sis_platform.serving.backend import as_utc

    value = datetime.fromisoformat(text.strip())
    return as_utc(value) or value


def run(
    lake: Lake, store: ServingReader | None, master_id: str, at: datetime, *, as_json: bool
) -> int:
    from sis_platform.lake.asof import master_as_of

    answer = master_as_of(lake, master_id, at, store=store)
    if as_json:
        print(json.dumps(to_json(answer), indent=2))
    else:
        print(render(answer), end="")
    if answer.shown is None:
        print(
            f"sis-trace: {master_id} had no version shown by the {answer.shown_by} at "
            f"{_time(answer.at)}",
            file=sys.stderr,
        )
        return EXIT_NOTHING_SHOWN
    return EXIT_SHOWN


def render(answer: AsOf) -> str:
    lines = [f"Master {answer.master_id} as of {_time(answer.at)}"]
    shown = answer.shown
    if shown is None:
        lines.append(f"  shown           nothing yet (read from the {answer.shown_by})")
    else:
        lines.append(f"  shown           version {shown.version}{_operation(shown)}")
        lines.extend(_facts(shown))
    received = answer.received
    if received is not None and (shown is None or received.version != shown.version):
        lines.append(
            f"  received by then version {received.version}: message {received.message_id} "
            f"received {_maybe(received.received_at)}, not shown yet at {_time(answer.at)}"
        )
    if shown is not None:
        if shown.document is None:
            lines.append(
                "  document        not available: the serving store has moved past this "
                "version and the lake has not folded it yet"
            )
        else:
            lines.append(f"  document sha256 {shown.document_sha256}")
            lines.append("  document")
            lines.extend(f"    {line}" for line in shown.document.splitlines() or [""])
    return "\n".join(lines) + "\n"


def _facts(v: MasterVersion) -> list[str]:
    return [
        f"  made by         message {v.message_id}, batch_seq {v.batch_seq} message {v.msg_seq}",
        f"  received        {_maybe(v.received_at)}",
        f"  in the lake     {_from(v.in_lake_from, v.fold_step)}",
        *([f"  in the store    from {_time(v.in_store_from)}"] if v.in_store_from else []),
    ]


def _operation(v: MasterVersion) -> str:
    return f" ({v.operation})" if v.operation else ""


def _from(when: datetime | None, step: int | None) -> str:
    return "not folded yet" if when is None else f"from {_time(when)} (fold step {step})"


def _maybe(when: datetime | None) -> str:
    return "(not in the lake's message log yet)" if when is None else _time(when)


def _time(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def to_json(answer: AsOf) -> dict[str, Any]:
    def version(v: MasterVersion | None) -> dict[str, Any] | None:
        if v is None:
            return None
        return {
            "master_id": v.master_id,
            "version": v.version,
            "operation": v.operation or None,
            "message_id": v.message_id,
            "batch_seq": v.batch_seq,
            "msg_seq": v.msg_seq,
            "received_at": _iso(v.received_at),
            "in_lake_from": _iso(v.in_lake_from),
            "fold_step": v.fold_step,
            "in_store_from": _iso(v.in_store_from),
            "document_sha256": v.document_sha256,
            "document": v.document,
        }

    return {
        "master_id": answer.master_id,
        "at": _iso(answer.at),
        "shown_by": answer.shown_by,
        "shown": version(answer.shown),
        "received": version(answer.received),
        "committed_fold_step": answer.committed_fold_step,
    }


def _iso(value: datetime | None) -> str | None:
    return None if value is None else _time(value)
