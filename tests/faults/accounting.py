"""What the fault tests check after catch-up, beyond the reference comparison: the message log
accounts for every logged message exactly once."""

from __future__ import annotations

from collections import Counter
from typing import Any

from sis_platform.lake.tables import MESSAGE_OUTCOMES, RAW_MESSAGES
from sis_platform.log.landing import LandingZone
from tests.harness import logged_messages

__all__ = ["assert_log_accounts_for_every_message", "logged_messages"]


def assert_log_accounts_for_every_message(lake: Any, zone: LandingZone) -> None:
    """Every landed message is in raw_messages once, has outcome rows, and no item (message id,
    position) is applied twice; message-level outcomes appear once per logged copy."""
    landed = Counter((int(r["batch_seq"]), int(r["msg_seq"])) for r in zone.catalog.iter_messages())
    logged = Counter(
        (int(r["batch_seq"]), int(r["msg_seq"]))
        for r in lake.read(RAW_MESSAGES).select("batch_seq", "msg_seq").collect()
    )
    assert logged == landed, "raw_messages differs from the landing zone"

    rows = (
        lake.read(MESSAGE_OUTCOMES)
        .select("message_id", "batch_seq", "msg_seq", "position", "outcome")
        .collect()
    )
    with_outcome = {(int(r["batch_seq"]), int(r["msg_seq"])) for r in rows}
    missing = set(landed) - with_outcome
    assert not missing, f"{len(missing)} logged message(s) have no outcome, e.g. {min(missing)}"
    assert with_outcome <= set(landed)

    applied = Counter((r["message_id"], r["position"]) for r in rows if r["outcome"] == "applied")
    twice = [k for k, n in applied.items() if n > 1]
    assert not twice, f"applied more than once: {twice[:5]}"
    # One outcome row per item, or one per message for a message-level outcome: the same
    # (copy, position) never twice (a step's rows written again would repeat them).
    per_entry = Counter((r["batch_seq"], r["msg_seq"], r["position"]) for r in rows)
    repeated = [k for k, n in per_entry.items() if n > 1]
    assert not repeated, f"outcome rows written twice: {repeated[:5]}"
