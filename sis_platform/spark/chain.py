"""Verifying the message log's hash chain (DESIGN.md invariant 5)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sis_platform.landing import chain_link

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class ChainReport:
    messages: int
    problems: list[str] = field(default_factory=list)
    last_link: str | None = None

    @property
    def intact(self) -> bool:
        return not self.problems


def verify_rows(rows: Iterable[dict[str, object]], first_prev: str | None) -> ChainReport:
    """Rows in log order with message_id, body_sha256 (as stored), actual_sha256 (recomputed
    from the body), msg_seq, batch_seq, prev_link and chain_link. `first_prev` is the link the
    first row must follow (None: take the first row's prev_link as given)."""
    problems: list[str] = []
    expected_prev = first_prev
    last_batch, last_seq = None, -1
    n = 0
    link: str | None = None
    for r in rows:
        n += 1
        where = f"batch {r['batch_seq']} message {r['msg_seq']} ({r['message_id']})"
        if r["batch_seq"] == last_batch and r["msg_seq"] != last_seq + 1:
            problems.append(f"{where}: message sequence jumps from {last_seq}")
        if r["actual_sha256"] != r["body_sha256"]:
            problems.append(f"{where}: body changed (sha256 differs from the logged one)")
        if expected_prev is not None and r["prev_link"] != expected_prev:
            problems.append(f"{where}: chain broken (a message was deleted or inserted before it)")
        link = chain_link(
            bytes.fromhex(str(r["prev_link"])), str(r["message_id"]),
            bytes.fromhex(str(r["actual_sha256"])),
        ).hex()
        if link != r["chain_link"]:
            problems.append(f"{where}: chain link does not match its content")
        expected_prev = str(r["chain_link"])
        last_batch, last_seq = r["batch_seq"], int(str(r["msg_seq"]))
        if len(problems) >= 20:
            problems.append("... (stopped after 20 problems)")
            break
    return ChainReport(n, problems, link)


def verify_log(df: DataFrame, first_prev: str | None) -> ChainReport:
    """Verify a slice of raw_messages (a batch, or the whole log) in log order."""
    from pyspark.sql import functions as F

    ordered = df.select(
        "batch_seq", "msg_seq", "message_id", "body_sha256", "prev_link", "chain_link",
        F.sha2("body", 256).alias("actual_sha256"),
    ).orderBy("batch_seq", "msg_seq")
    return verify_rows((r.asDict() for r in ordered.toLocalIterator()), first_prev)
