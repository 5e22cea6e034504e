"""Verifying the message log's hash chain, one batch at a time (docs/design.md invariant 5).

A batch is checked three ways against its anchors (sis_platform/log/chain.py): its anchor file
must exist, be signed with the log key (sis_platform/log/seal.py) and start where the previous
batch's anchor ends; its landing file (or its parts in
order, for a batch landed in groups: read as one sequence) and its rows in
the Delta table `raw_messages` must each hold exactly the anchored number of messages, every
one matching its link and every link following the one before, ending on the anchored head;
and, inside a batch run, the run's tags (`sis/chain_head`, `sis/messages`) must agree with the
anchor. The blocking check on `raw_messages` and `sis-verify-log` both call `verify_batch`
(the check of a run over a range of batches `verify_batches`: one Spark job for all of them).

Memory: the landing file is read a thousand rows at a time, and the Delta rows come to the
driver as one Arrow table without their bodies (Spark hashes them), so a batch costs the
driver its row count, not its bytes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F

from sis_platform.lake.spark.items import logged_condition
from sis_platform.lake.tables import RAW_MESSAGES
from sis_platform.log.chain import (
    GENESIS_LINK,
    Anchor,
    ChainRecord,
    Problem,
    StoredMessage,
    anchor_problems,
    verify_messages,
)
from sis_platform.log.landing import batch_key, batch_seq_of
from sis_platform.log.landing.expiry import Expiry
from sis_platform.log.landing.rows import READ_ROWS
from sis_platform.log.landing.signed import signature_problems

if TYPE_CHECKING:
    from sis_platform.lake.delta import Lake
    from sis_platform.log.landing import LandingZone

LANDING_SOURCE = "landing file"
DELTA_SOURCE = "raw_messages"


@dataclass(frozen=True)
class RunAnchor:
    """The chain head and message count a batch run was requested with (its tags)."""

    head: str
    messages: int


@dataclass(frozen=True)
class BatchVerdict:
    """What verifying one batch found, across its anchors, landing file and Delta rows."""

    batch_key: str
    messages: int  # messages checked in the Delta table
    problems: tuple[Problem, ...]
    # The last link of its rows in the Delta table, where an expired batch's verification
    # gives it (the next expired batch must start from it); None otherwise.
    head: str | None = None

    @property
    def intact(self) -> bool:
        return not self.problems

    def with_problems(self, problems: list[Problem]) -> BatchVerdict:
        return BatchVerdict(self.batch_key, self.messages, (*self.problems, *problems))

    @property
    def first_problem(self) -> Problem | None:
        """The first problem that names a message, else the first problem."""
        return next(
            (p for p in self.problems if p.message_id is not None),
            self.problems[0] if self.problems else None,
        )


def verify_batch(
    lake: Lake,
    zone: LandingZone,
    key: str,
    *,
    run_anchor: RunAnchor | None = None,
    expired_prev: str | None = None,
    rows: pa.Table | None = None,
) -> BatchVerdict:
    """Check batch `key` (see the module docstring). `expired_prev`: for a batch expired from
    the landing zone, the last link of the batch before it (the verdict's `head` of that
    batch), which its first row must follow; None: from the genesis link for the first batch,
    else from its own first row. `rows`: the batch's `delta_rows`, when read already (with
    other batches': `verify_batches`)."""
    seq = batch_seq_of(key)
    expiry = _expiry(zone, key)
    if expiry is not None:
        return _verify_expired(lake, zone, key, expiry, expired_prev)
    problems: list[Problem] = []
    anchor = _read_anchor(zone, key, problems)
    previous = _read_anchor(zone, batch_key(seq - 1), problems) if seq > 1 else None
    first_prev, found = anchor_problems(key, anchor, previous, first=seq == 1)
    problems += found
    problems += signature_problems(zone.catalog, key, anchor)
    if (
        run_anchor is not None
        and anchor is not None
        and (run_anchor.head != anchor.head or run_anchor.messages != anchor.messages)
    ):
        problems.append(
            Problem(
                key,
                f"the run was requested for {run_anchor.messages} "
                f"message(s) ending on {run_anchor.head[:16]}..., the anchor "
                f"says {anchor.messages} ending on {anchor.head[:16]}...",
            )
        )
    problems += verify_landing_file(zone, key, first_prev, anchor)
    if lake.exists(RAW_MESSAGES):
        if rows is None:
            rows = delta_rows(lake, [key])
        stored = stored_messages(batch_rows(rows, key))
        report = verify_messages(
            key,
            stored,
            first_prev=first_prev,
            source=DELTA_SOURCE,
            anchor=anchor,
        )
        problems += report.problems
        checked = report.messages
    else:
        problems.append(Problem(key, f"the table {RAW_MESSAGES.name} does not exist"))
        checked = 0
    return BatchVerdict(key, checked, tuple(problems))


def verify_batches(
    lake: Lake, zone: LandingZone, keys: Sequence[str], *, run_anchor: RunAnchor | None = None
) -> list[BatchVerdict]:
    """`verify_batch` of each of `keys`, their raw_messages rows read in one Spark job (a run
    over a range of batches); `run_anchor`: the tags of the run, which name the last batch's
    anchor (its head commits to every link before it)."""
    rows = delta_rows(lake, keys) if lake.exists(RAW_MESSAGES) else None
    return [
        verify_batch(
            lake,
            zone,
            key,
            run_anchor=run_anchor if key == keys[-1] else None,
            rows=rows,
        )
        for key in keys
    ]


def _expiry(zone: LandingZone, key: str) -> Expiry | None:
    """The zone's expiry record when it covers batch `key`."""
    expiry = zone.catalog.expiry()
    return expiry if expiry is not None and expiry.covers(key) else None


def _verify_expired(
    lake: Lake, zone: LandingZone, key: str, expiry: Expiry, prev: str | None
) -> BatchVerdict:
    """A batch expired from the landing zone (sis_platform/log/landing/expiry.py): only its
    rows in the lake are left, checked for their chain from `prev` (the genesis link for the
    first batch; its own first link when not given); the last expired batch's rows also
    against the expiry record's signed anchor, which the first kept batch's anchor follows."""
    last = expiry.anchor if expiry.anchor.batch_key == key else None
    problems = signature_problems(zone.catalog, key, last) if last is not None else []
    if not lake.exists(RAW_MESSAGES):
        problems.append(Problem(key, f"the table {RAW_MESSAGES.name} does not exist"))
        return BatchVerdict(key, 0, tuple(problems))
    rows = list(delta_messages(lake, key))
    if not rows:
        problems.append(Problem(key, f"expired from the landing zone and not in {DELTA_SOURCE}"))
    if prev is None and batch_seq_of(key) == 1:
        prev = GENESIS_LINK.hex()
    first_prev = prev if prev is not None else (rows[0].prev_link if rows else "")
    if last is not None and last.first_prev != first_prev:
        problems.append(
            Problem(key, "the expiry record's anchor does not follow the batch before it")
        )
    report = verify_messages(
        key, iter(rows), first_prev=first_prev, source=DELTA_SOURCE, anchor=last
    )
    return BatchVerdict(key, report.messages, (*problems, *report.problems), report.head)


def _read_anchor(zone: LandingZone, key: str, problems: list[Problem]) -> Anchor | None:
    try:
        return zone.catalog.anchor(key)
    except ValueError as exc:
        problems.append(Problem(key, str(exc)))
        return None


def verify_landing_file(
    zone: LandingZone, key: str, first_prev: str, anchor: Anchor | None
) -> list[Problem]:
    """What is wrong with batch `key`'s landing file (or parts) against `anchor` and the
    previous batch's head `first_prev`; empty when intact. Needs no Spark session."""
    if not zone.catalog.batch_files(key):
        return [Problem(key, "its landing file is missing")]
    try:
        claimed = zone.catalog.anchor_from_file(key)
        if claimed is None:
            return [
                Problem(
                    key,
                    "its landing file carries no chain metadata (rewritten, or not a landing file)",
                )
            ]
        problems: list[Problem] = []
        # The chain fields only: a batch in parts carries its last part's running anchor, signed
        # as a part, and each signature is checked against its own kind (log/landing/signed.py).
        if anchor is not None and claimed.unsigned() != anchor.unsigned():
            problems.append(
                Problem(key, "its landing file's chain metadata differs from its anchor")
            )
        report = verify_messages(
            key,
            zone.catalog.stored_messages(key),
            first_prev=first_prev,
            source=LANDING_SOURCE,
            anchor=anchor or claimed,
        )
        return problems + list(report.problems)
    except (OSError, KeyError, pa.ArrowException) as exc:
        return [Problem(key, f"its landing file cannot be read as a landing batch: {exc}")]


def delta_messages(lake: Lake, key: str) -> Iterator[StoredMessage]:
    """The batch's rows in `raw_messages`, in message order, bodies hashed by Spark."""
    return stored_messages(delta_rows(lake, [key]))


def delta_rows(lake: Lake, keys: Sequence[str]) -> pa.Table:
    """What the check reads of the rows of batches `keys` in `raw_messages`, bodies hashed by
    Spark: one Arrow table (bounded by the run's batches, and without their bodies), far
    cheaper than a Row object per message."""
    return (
        lake.read(RAW_MESSAGES)
        .where(logged_condition(keys))
        .select(
            "batch_key",
            "batch_seq",
            "msg_seq",
            "message_id",
            F.unix_micros("put_time").alias("put_us"),
            F.unix_micros("received_at").alias("received_us"),
            "delivery_count",
            "properties_json",
            "body_size",
            "body_sha256",
            "body_location",
            F.length("body").alias("row_size"),
            F.sha2("body", 256).alias("row_sha256"),
            "prev_link",
            "chain_link",
        )
        .toArrow()
    )


def batch_rows(rows: pa.Table, key: str) -> pa.Table:
    """The rows of batch `key` among `delta_rows` of several."""
    return rows.filter(pc.equal(rows.column("batch_key"), key))


def stored_messages(rows: pa.Table) -> Iterator[StoredMessage]:
    """`delta_rows` of one batch as stored messages, in message order."""
    # Put in message order here, where a Spark sort would be a sampling job and a shuffle more;
    # the link orders rows that claim one msg_seq (an inserted row). Made into Python objects a
    # thousand rows at a time.
    rows = rows.sort_by([("msg_seq", "ascending"), ("chain_link", "ascending")])
    for chunk in rows.to_batches(max_chunksize=READ_ROWS):
        for r in chunk.to_pylist():
            yield StoredMessage(
                batch_key=str(r["batch_key"]),
                record=ChainRecord(
                    batch_seq=int(r["batch_seq"]),
                    msg_seq=int(r["msg_seq"]),
                    message_id=str(r["message_id"]),
                    put_time_us=r["put_us"],
                    received_at_us=int(r["received_us"]),
                    delivery_count=int(r["delivery_count"]),
                    properties_json=r["properties_json"],
                    # Null in rows logged before the column existed (the link then fails).
                    body_size=int(r["body_size"] if r["body_size"] is not None else r["row_size"]),
                    body_sha256=str(r["body_sha256"]),
                    body_location=r["body_location"],
                ),
                prev_link=str(r["prev_link"]),
                chain_link=str(r["chain_link"]),
                row_body_size=int(r["row_size"]),
                row_body_sha256=str(r["row_sha256"]),
            )
