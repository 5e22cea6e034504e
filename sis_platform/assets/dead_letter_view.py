"""The `dead_letters` asset's view: a small markdown table (reason, count, the latest example
with its message id) and a count per reason, on each materialization of the table.

Message ids, master ids and details come from the feed, so they are untrusted text: every
character markdown or HTML could act on is escaped, line breaks flattened and each cell
shortened, so a hostile message can neither break the table nor make the UI fetch anything.
"""

from typing import Any

import dagster as dg

from sis_platform.lake.spark.dead_letter_summary import ReasonSummary

# Longest cell text shown for a feed-supplied value.
MAX_CELL = 120
REPLAY_HINT = (
    "Replay after a fix: launch the `replay_dead_letters` job (docs/operations.md, "
    '"Dead-letter replay"); `sis-trace MESSAGE_ID` tells one message\'s story.'
)
# Every character CommonMark gives a meaning to, and the HTML brackets.
_SPECIAL = set("\\`*_{}[]()#+-.!|<>~&")


def dead_letter_metadata(summaries: list[ReasonSummary]) -> dict[str, Any]:
    """`dead_letters_total`, `dead_letters_<reason>` per reason (plotted over time) and
    `dead_letters_by_reason` (the table)."""
    metadata: dict[str, Any] = {"dead_letters_total": sum(s.count for s in summaries)}
    for s in summaries:
        metadata[f"dead_letters_{s.reason.replace('-', '_')}"] = s.count
    metadata["dead_letters_by_reason"] = dg.MetadataValue.md(markdown(summaries))
    return metadata


def markdown(summaries: list[ReasonSummary]) -> str:
    if not summaries:
        return "No dead letters.\n"
    lines = [
        "| reason | count | latest | message id | master id | detail |",
        "|---|---:|---|---|---|---|",
    ]
    for s in summaries:
        cells = (
            _cell(s.reason),
            str(s.count),
            s.latest_at.isoformat().replace("+00:00", "Z"),
            _cell(s.latest_message_id),
            _cell(s.latest_master_id) if s.latest_master_id else "(whole message)",
            _cell(s.latest_detail or ""),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + REPLAY_HINT + "\n"


def _cell(text: str) -> str:
    flat = "".join(c if c.isprintable() else "\ufffd" for c in " ".join(text.split()))
    if len(flat) > MAX_CELL:
        flat = flat[: MAX_CELL - 1] + "…"
    return "".join("\\" + c if c in _SPECIAL else c for c in flat)
