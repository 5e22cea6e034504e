"""Trace one message through the message log: the answer to a dispute about it.

Given a message id, `trace_message` reads the Delta tables only (never the queue or the landing
zone) and tells, for every logged copy of the message (a redelivery is logged again, docs/design.md
invariant 1): when it was received, its batch, its delivery count, its bytes' digest and hash
chain link; how it was parsed (its items, or why the whole message was invalid); and what became
of each item (docs/feed.md "Items: splitting a message", docs/design.md invariant 4): the master
version it produced, the earlier copy it duplicated, filtered, or its dead letter.

Only committed fold steps count. The fold appends its rows first and commits by appending to
fold_steps last (sis_platform/lake/spark/fold/ledger.py), so rows tagged with a later step are an
interrupted or running step's and are ignored here, as the next step's recovery will undo
them. A copy in a batch no committed step covers is "not yet folded".

Every read filters on the message id (and, in message_items, on the copies' batches, whose
blocks are its partitions), so Delta's file statistics and Parquet's row-group filters skip
almost all of each table: a trace touches a few files, not the log.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from pyspark.sql import Column
from pyspark.sql import functions as F

from sis_platform.domain.reasons import Outcome
from sis_platform.lake.spark.fold import committed_step
from sis_platform.lake.spark.items import logged_condition
from sis_platform.lake.tables import (
    DEAD_LETTERS,
    FOLD_STEPS,
    MASTER_VERSIONS,
    MESSAGE_ITEMS,
    MESSAGE_OUTCOMES,
    RAW_MESSAGES,
)
from sis_platform.log.chain import ChainRecord, chain_link

if TYPE_CHECKING:
    from sis_platform.lake.delta import Lake

# Outcome statuses beyond the four of `Outcome` (applied, duplicate, filtered, dead-lettered).
NOT_FOLDED = "not-folded"
# Folded, yet the log records no outcome: a broken invariant 4 that a trace must show, not hide.
UNACCOUNTED = "unaccounted"

# message_items.status: one row per item, or one "invalid" row for a whole invalid message.
_ITEM_ROW = "item"
_INVALID_ROW = "invalid"

# How a copy was parsed.
PARSED_ITEMS = "items"
PARSED_INVALID = "invalid"
NOT_PARSED = "not-parsed"  # logged, but its batch's message_items were not written yet


@dataclass(frozen=True)
class CopyRef:
    """Where one copy of a message sits in the log: its batch and place in the batch."""

    batch_key: str
    batch_seq: int
    msg_seq: int

    def __str__(self) -> str:
        return f"batch {self.batch_key} message {self.msg_seq}"


@dataclass(frozen=True)
class AppliedVersion:
    """The master_versions row an applied item produced."""

    master_id: str
    version: int
    operation: str  # new | refresh | update
    fold_step: int


@dataclass(frozen=True)
class DeadLetterInfo:
    """The dead_letters row of a dead-lettered message or item."""

    reason: str
    detail: str | None
    dead_lettered_at: datetime
    fold_step: int


@dataclass(frozen=True)
class TracedOutcome:
    """What became of a message copy or item.

    `status` is one of `Outcome` (applied, duplicate, filtered, dead-lettered), `NOT_FOLDED`
    or `UNACCOUNTED`."""

    status: str
    fold_step: int | None = None
    reason: str | None = None
    detail: str | None = None
    warning: str | None = None
    version: AppliedVersion | None = None
    dead_letter: DeadLetterInfo | None = None
    duplicate_of: CopyRef | None = None  # for a duplicate: the copy that counted


@dataclass(frozen=True)
class TracedItem:
    """One item of a parsed copy: its share of the message for one master id."""

    position: int
    master_id: str
    category: str | None
    type: str | None
    outcome: TracedOutcome


@dataclass(frozen=True)
class MessageCopy:
    """One logged copy of the message (raw_messages), how it was parsed and what it became.

    `outcome` is set when the copy as a whole has one outcome (a duplicate, an invalid message
    dead-lettered before splitting, not yet folded); otherwise each item carries its own."""

    batch_key: str
    batch_seq: int
    msg_seq: int
    received_at: datetime
    put_time: datetime | None
    delivery_count: int
    body_sha256: str
    body_bytes: int
    body_intact: bool  # the logged bytes still hash to body_sha256
    prev_link: str
    chain_link: str
    link_consistent: bool  # chain_link = sha256(prev_link || its logged fields), log/chain.py
    parsed: str  # PARSED_ITEMS | PARSED_INVALID | NOT_PARSED
    invalid_reason: str | None
    invalid_detail: str | None
    items: tuple[TracedItem, ...]
    folded: bool
    outcome: TracedOutcome | None
    body: bytes | None = None  # only when asked for

    @property
    def ref(self) -> CopyRef:
        return CopyRef(self.batch_key, self.batch_seq, self.msg_seq)


@dataclass(frozen=True)
class MessageTrace:
    message_id: str
    lake_path: str
    # The last committed fold step (0 before the first step). None when the message is not in
    # the log, as nothing past raw_messages was read.
    committed_fold_step: int | None
    copies: tuple[MessageCopy, ...]
    folded_up_to_batch: int | None = None  # the last batch that committed step folded

    @property
    def found(self) -> bool:
        return bool(self.copies)

    @property
    def counted(self) -> CopyRef | None:
        """The copy whose effect counts: the first folded copy that is not a duplicate."""
        return _counted(self.copies)


def normalize_message_id(text: str) -> str:
    """A message id as the log spells it. Ids are opaque strings, except that an MQ MsgId may be
    given as its 48 hex digits (with or without "ID:", in any case): the log holds every id our
    sources produce as "ID:" + 48 lowercase hex digits (sis_platform/queues/base.py)."""
    text = text.strip()
    digits = text[3:] if text[:3].upper() == "ID:" else text
    if len(digits) == 48 and all(c in "0123456789abcdefABCDEF" for c in digits):
        return "ID:" + digits.lower()
    return text


def trace_message(lake: Lake, message_id: str, *, include_body: bool = False) -> MessageTrace:
    """Everything the message log knows about `message_id` (see the module docstring)."""
    by_id = F.col("message_id") == F.lit(message_id)
    if not lake.exists(RAW_MESSAGES):
        return MessageTrace(message_id, lake.base_path, None, ())
    raw_columns: list[str | Column] = [
        "batch_key",
        "batch_seq",
        "msg_seq",
        "put_time",
        "received_at",
        "delivery_count",
        "body_sha256",
        "prev_link",
        "chain_link",
        "message_id",
        "properties_json",
        "body_size",
        "body_location",
        F.unix_micros("put_time").alias("put_us"),
        F.unix_micros("received_at").alias("received_us"),
        F.length("body").alias("body_bytes"),
        # A body moved aside at intake is logged empty; its digest is of the moved-aside file.
        F.when(F.col("body_location").isNotNull(), F.length("body") == 0)
        .otherwise(F.sha2(F.col("body"), 256) == F.col("body_sha256"))
        .alias("body_intact"),
    ]
    if include_body:
        raw_columns.append("body")
    raw = lake.read(RAW_MESSAGES).where(by_id).select(*raw_columns).collect()
    if not raw:
        return MessageTrace(message_id, lake.base_path, None, ())
    raw = sorted(raw, key=lambda r: (int(r["batch_seq"]), int(r["msg_seq"])))

    # fold_steps first: outcome rows are then read as of this commit, even if a step commits
    # while the trace runs (later rows are filtered out below).
    step = committed_step(lake) if lake.exists(FOLD_STEPS) else None
    committed = step.fold_step if step else 0
    folded_up_to = step.last_batch_seq if step else 0
    keys = sorted({str(r["batch_key"]) for r in raw})

    items: list[Any] = []
    if lake.exists(MESSAGE_ITEMS):
        items = (
            lake.read(MESSAGE_ITEMS)
            .where(F.expr(logged_condition(keys)) & by_id)  # blocks, then statistics
            .select(
                "batch_seq",
                "msg_seq",
                "status",
                "position",
                "master_id",
                "category",
                "type",
                "reason",
                "detail",
            )
            .collect()
        )

    folded_any = any(int(r["batch_seq"]) <= folded_up_to for r in raw)
    as_committed = by_id & (F.col("fold_step") <= F.lit(committed))
    outcomes: list[Any] = []
    if folded_any:
        outcomes = (
            lake.read(MESSAGE_OUTCOMES)
            .where(as_committed)
            .select(
                "batch_seq",
                "msg_seq",
                "position",
                "master_id",
                "outcome",
                "version",
                "reason",
                "detail",
                "warning",
                "fold_step",
            )
            .collect()
        )
    statuses = {str(r["outcome"]) for r in outcomes}
    versions: list[Any] = []
    if str(Outcome.APPLIED) in statuses:
        versions = (
            lake.read(MASTER_VERSIONS)
            .where(as_committed)
            .select(
                "batch_seq", "msg_seq", "position", "master_id", "version", "operation", "fold_step"
            )
            .collect()
        )
    dead: list[Any] = []
    if str(Outcome.DEAD_LETTERED) in statuses:
        dead = (
            lake.read(DEAD_LETTERS)
            .where(as_committed)
            .select(
                "batch_seq",
                "msg_seq",
                "position",
                "reason",
                "detail",
                "dead_lettered_at",
                "fold_step",
            )
            .collect()
        )

    copies = _assemble(
        message_id, raw, items, outcomes, versions, dead, folded_up_to, include_body=include_body
    )
    return MessageTrace(message_id, lake.base_path, committed, copies, folded_up_to)


class _Key(NamedTuple):
    """Where a fold output row belongs: a copy's item, or the whole copy (position None)."""

    batch_seq: int
    msg_seq: int
    position: int | None


def _key(row: Any) -> _Key:
    position = row["position"]
    return _Key(
        int(row["batch_seq"]), int(row["msg_seq"]), None if position is None else int(position)
    )


def _latest(rows: list[Any]) -> dict[_Key, Any]:
    # One row per key is what the fold writes; should a key ever hold several (a refold after a
    # rewind), the latest committed step's row is the one in force.
    latest: dict[_Key, Any] = {}
    for row in sorted(rows, key=lambda r: int(r["fold_step"])):
        latest[_key(row)] = row
    return latest


def _assemble(
    message_id: str,
    raw: list[Any],
    items: list[Any],
    outcomes: list[Any],
    versions: list[Any],
    dead: list[Any],
    folded_up_to: int,
    *,
    include_body: bool,
) -> tuple[MessageCopy, ...]:
    outcome_by = _latest(outcomes)
    version_by = _latest(versions)
    dead_by = _latest(dead)
    items_by: dict[tuple[int, int], list[Any]] = {}
    for row in items:
        items_by.setdefault((int(row["batch_seq"]), int(row["msg_seq"])), []).append(row)

    def outcome_of(key: _Key) -> TracedOutcome:
        row = outcome_by.get(key)
        if row is None:
            return TracedOutcome(UNACCOUNTED)
        version = version_by.get(key)
        letter = dead_by.get(key)
        return TracedOutcome(
            status=str(row["outcome"]),
            fold_step=int(row["fold_step"]),
            reason=row["reason"],
            detail=row["detail"],
            warning=row["warning"],
            version=AppliedVersion(
                master_id=str(version["master_id"]),
                version=int(version["version"]),
                operation=str(version["operation"]),
                fold_step=int(version["fold_step"]),
            )
            if version is not None
            else None,
            dead_letter=DeadLetterInfo(
                reason=str(letter["reason"]),
                detail=letter["detail"],
                dead_lettered_at=spark_utc(letter["dead_lettered_at"]),
                fold_step=int(letter["fold_step"]),
            )
            if letter is not None
            else None,
        )

    drafts: list[MessageCopy] = []
    for r in raw:
        batch_seq, msg_seq = int(r["batch_seq"]), int(r["msg_seq"])
        folded = batch_seq <= folded_up_to
        parsed_rows = items_by.get((batch_seq, msg_seq), [])
        invalid = next((p for p in parsed_rows if p["status"] == _INVALID_ROW), None)
        item_rows = sorted(
            (p for p in parsed_rows if p["status"] == _ITEM_ROW), key=lambda p: p["position"]
        )
        whole: TracedOutcome | None = None
        if not folded:
            whole = TracedOutcome(NOT_FOLDED)
        elif (batch_seq, msg_seq, None) in outcome_by:
            whole = outcome_of(_Key(batch_seq, msg_seq, None))
        elif invalid is not None or not item_rows:
            whole = TracedOutcome(UNACCOUNTED)
        traced_items = tuple(
            TracedItem(
                position=int(p["position"]),
                master_id=str(p["master_id"]),
                category=p["category"],
                type=p["type"],
                outcome=whole
                if whole is not None
                else outcome_of(_Key(batch_seq, msg_seq, int(p["position"]))),
            )
            for p in item_rows
        )
        sha = str(r["body_sha256"])
        link = chain_link(
            bytes.fromhex(str(r["prev_link"])),
            ChainRecord(
                batch_seq,
                msg_seq,
                message_id,
                r["put_us"],
                int(r["received_us"]),
                int(r["delivery_count"]),
                r["properties_json"],
                int(r["body_size"]),
                sha,
                r["body_location"],
            ),
        ).hex()
        drafts.append(
            MessageCopy(
                batch_key=str(r["batch_key"]),
                batch_seq=batch_seq,
                msg_seq=msg_seq,
                received_at=spark_utc(r["received_at"]),
                put_time=spark_utc(r["put_time"]) if r["put_time"] is not None else None,
                delivery_count=int(r["delivery_count"]),
                body_sha256=sha,
                body_bytes=int(r["body_bytes"]),
                body_intact=bool(r["body_intact"]),
                prev_link=str(r["prev_link"]),
                chain_link=str(r["chain_link"]),
                link_consistent=link == str(r["chain_link"]),
                parsed=PARSED_INVALID
                if invalid is not None
                else PARSED_ITEMS
                if item_rows
                else NOT_PARSED,
                invalid_reason=invalid["reason"] if invalid is not None else None,
                invalid_detail=invalid["detail"] if invalid is not None else None,
                items=traced_items,
                folded=folded,
                outcome=whole,
                body=bytes(r["body"]) if include_body else None,
            )
        )
    return _link_duplicates(drafts)


def _counted(copies: tuple[MessageCopy, ...] | list[MessageCopy]) -> CopyRef | None:
    """The first of `copies`, in the order given, that the fold counted (not a duplicate)."""
    for copy in copies:
        if copy.folded and not _is_duplicate(copy) and not _is_unaccounted(copy):
            return copy.ref
    return None


def _is_duplicate(copy: MessageCopy) -> bool:
    return copy.outcome is not None and copy.outcome.status == str(Outcome.DUPLICATE)


def _is_unaccounted(copy: MessageCopy) -> bool:
    return copy.outcome is not None and copy.outcome.status == UNACCOUNTED


def _link_duplicates(copies: list[MessageCopy]) -> tuple[MessageCopy, ...]:
    # The fold records a duplicate without saying which copy counted (exactly once by message
    # id within the dedup window, docs/feed.md): it is the latest copy before it in landing
    # order that was not itself a duplicate (a copy beyond the window counts anew).
    linked: list[MessageCopy] = []
    for index, copy in enumerate(copies):
        if _is_duplicate(copy) and copy.outcome is not None:
            counted = _counted(copies[index - 1 :: -1]) if index else None
            outcome = replace(copy.outcome, duplicate_of=counted)
            copy = replace(
                copy,
                outcome=outcome,
                items=tuple(replace(i, outcome=outcome) for i in copy.items),
            )
        linked.append(copy)
    return tuple(linked)


def spark_utc(value: datetime) -> datetime:
    """A timestamp PySpark returned (naive, in this process's local time) as a UTC instant."""
    # PySpark returns timestamps as naive datetimes in the Python process's local time zone;
    # astimezone() reads a naive value as local time, so this is the instant in UTC either way.
    return value.astimezone(UTC)
