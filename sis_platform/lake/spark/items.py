"""message_items: parse, validate and split one batch of the message log, on Spark executors.

Each raw message goes through the domain's `classify_message` (the same function the reference
pipeline uses), so Spark and the reference agree by construction on what a message means; what
Spark adds is running it in parallel, next to the data.

Isolation (docs/design.md invariants 4 and 6): each message is classified under the worker
guard (sis_platform/runtime/guard.py) with the per-item budget. An exception from classifying a
message
(a bug, not an invalid message: those are dead letters already) dead-letters it `quarantined` at
once, since classification is a pure function of the message. A worker that dies on a message,
or that the watchdog kills over the budget, fails the attempt; the message is recorded in
classify_failures from its in-flight marker, and later attempts of the same run hold it back:
`too-complex` after a timeout, `quarantined` after `quarantine_after` deaths. A later run (a
replay or backfill after a fix) classifies it afresh.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from sis_platform.domain.limits import Limits
from sis_platform.domain.pipeline import DeadLetter, LoggedMessage
from sis_platform.domain.reasons import Reason
from sis_platform.lake.spark.arrow import record_batches
from sis_platform.lake.tables import BATCH_LOG, CLASSIFY_FAILURES, MESSAGE_ITEMS, RAW_MESSAGES
from sis_platform.log.landing import LandingZone, batch_seq_of
from sis_platform.runtime.faults import InjectedFailure, injected_classify_failure
from sis_platform.runtime.guard import (
    RUNNING,
    TIMEOUT,
    Guard,
    Held,
    InFlightFolder,
    InFlightRecord,
    budget_detail,
    classify_deaths_detail,
    classify_watched,
)
from sis_platform.settings import DEFAULT_QUARANTINE_AFTER

if TYPE_CHECKING:
    from sis_platform.lake.delta import Lake


def _classify_batches(
    batches: Iterator[pa.RecordBatch],
    *,
    limits: Limits,
    redelivery_limit: int,
    held: Mapping[str, Held] | None = None,
    inflight_dir: str | None = None,
    injected: InjectedFailure | None = None,
    landing_root: str | None = None,
) -> Iterator[pa.RecordBatch]:
    """Raw message rows to message_items rows, Arrow batches both ways (`mapInArrow`): no
    pandas frame per batch, and the bodies reach `classify_message` as the bytes Arrow holds.
    Messages in `held` are dead-lettered as it says, without being classified."""
    schema = to_arrow_schema(MESSAGE_ITEMS.schema())
    guard = Guard(inflight_dir, limits.item_budget_seconds)
    try:
        yield from _classify_rows(
            batches,
            schema,
            guard,
            limits=limits,
            redelivery_limit=redelivery_limit,
            held=held or {},
            injected=injected,
            zone=LandingZone(Path(landing_root)) if landing_root else None,
        )
    finally:
        guard.close()


def _classify_rows(
    batches: Iterator[pa.RecordBatch],
    schema: pa.Schema,
    guard: Guard,
    *,
    limits: Limits,
    redelivery_limit: int,
    held: Mapping[str, Held],
    injected: InjectedFailure | None,
    zone: LandingZone | None,
) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        rows: list[tuple[object, ...]] = []
        columns = batch.to_pydict()
        for (
            key,
            batch_seq,
            msg_seq,
            message_id,
            delivery_count,
            body,
            size,
            sha256,
            location,
        ) in zip(
            columns["batch_key"],
            columns["batch_seq"],
            columns["msg_seq"],
            columns["message_id"],
            columns["delivery_count"],
            columns["body"],
            columns["body_size"],
            columns["body_sha256"],
            columns["body_location"],
            strict=True,
        ):
            base = (key, batch_seq, msg_seq, message_id, delivery_count)
            message = LoggedMessage(message_id, body, delivery_count, size, location)
            if location is not None and zone is not None:
                restored = zone.catalog.restored_body(
                    location, size, sha256, limits.max_message_bytes
                )
                if restored is not None:
                    message = LoggedMessage(message_id, restored, delivery_count)
            outcome = held.get(message_id) or classify_watched(
                message,
                guard=guard,
                injected=injected,
                limits=limits,
                redelivery_limit=redelivery_limit,
            )
            if isinstance(outcome, DeadLetter | Held):
                rows.append(
                    (
                        *base,
                        "invalid",
                        None,
                        None,
                        None,
                        None,
                        None,
                        str(outcome.reason),
                        outcome.detail,
                    )
                )
            else:
                for item in outcome:
                    rows.append(
                        (
                            *base,
                            "item",
                            item.position,
                            item.master_id,
                            item.category,
                            item.type,
                            item.payload,
                            None,
                            None,
                        )
                    )
        yield from record_batches(rows, schema)


def classify_batch(
    raw: DataFrame,
    *,
    limits: Limits,
    redelivery_limit: int,
    held: Mapping[str, Held] | None = None,
    inflight_dir: str | None = None,
    landing_root: str | None = None,
) -> DataFrame:
    """Raw message rows (one batch) to message_items rows; `held` and `inflight_dir` as for
    `_classify_batches` (see `write_items`)."""
    return raw.select(
        "batch_key",
        "batch_seq",
        "msg_seq",
        "message_id",
        "delivery_count",
        "body",
        "body_size",
        "body_sha256",
        "body_location",
    ).mapInArrow(
        partial(
            _classify_batches,
            limits=limits,
            redelivery_limit=redelivery_limit,
            held=held,
            inflight_dir=inflight_dir,
            injected=injected_classify_failure(),
            landing_root=landing_root,
        ),
        schema=MESSAGE_ITEMS.schema(),
    )


class ClassifyFailure(RuntimeError):
    """A message_items attempt failed on messages whose worker died or overran the budget.
    Retried by the asset's retry policy; later attempts of the run hold those messages back."""


def write_items(
    lake: Lake,
    key: str,
    *,
    limits: Limits,
    redelivery_limit: int,
    run_id: str | None,
    quarantine_after: int = DEFAULT_QUARANTINE_AFTER,
    landing_root: str | None = None,
) -> None:
    """Classify one batch's raw_messages into its message_items (replacing them), holding back
    the messages earlier attempts of this run failed on (see the module docstring). With
    `landing_root`, a body moved aside at intake that fits `limits` now is read back from its
    overflow file and classified (Catalog.restored_body)."""
    where = batch_condition(key)
    raw = lake.read(RAW_MESSAGES).where(where)
    held = _held_messages(lake, key, run_id=run_id, quarantine_after=quarantine_after)
    folder = InFlightFolder.create(lake.base_path, f"items-{key}")
    try:
        items = classify_batch(
            raw,
            limits=limits,
            redelivery_limit=redelivery_limit,
            held=held,
            inflight_dir=folder.path,
            landing_root=landing_root,
        )
        try:
            lake.replace_where(MESSAGE_ITEMS, items, where)
        except Exception as error:
            died = _deaths(folder.records(), cause=error)
            if not died:
                raise  # not attributable to a message: a transient failure, retried as such
            _record_deaths(lake, key, died, run_id=run_id)
            raise ClassifyFailure(
                f"message_items of batch {key} failed on message(s) "
                f"{', '.join(f'{d.message_id} ({d.kind})' for d in died)}; held back at the "
                f"next attempt after a timeout, after {quarantine_after} deaths otherwise"
            ) from error
    finally:
        folder.remove()


def _held_messages(
    lake: Lake, key: str, *, run_id: str | None, quarantine_after: int
) -> dict[str, Held]:
    """The messages of batch `key` this run's earlier attempts died on, to hold back."""
    if not lake.exists(CLASSIFY_FAILURES) or lake.version(CLASSIFY_FAILURES) == 0:
        return {}  # no failure ever recorded (the usual case): no Spark job
    rows = (
        lake.read(CLASSIFY_FAILURES)
        .where(
            (F.col("batch_key") == key)
            & (F.col("run_id").isNull() if run_id is None else F.col("run_id") == run_id)
        )
        .select("message_id", "kind", "error")
        .collect()
    )
    deaths: Counter[str] = Counter()
    held: dict[str, Held] = {}
    for r in rows:
        message_id = str(r["message_id"])
        if r["kind"] == TIMEOUT:
            held[message_id] = Held(Reason.TOO_COMPLEX, str(r["error"]))
        else:
            deaths[message_id] += 1
    for message_id, n in deaths.items():
        if n >= quarantine_after and message_id not in held:
            held[message_id] = Held(Reason.QUARANTINED, classify_deaths_detail(n))
    return held


@dataclass(frozen=True)
class _Death:
    message_id: str
    kind: str  # TIMEOUT | "crash"
    error: str


def _deaths(records: list[InFlightRecord], *, cause: BaseException) -> list[_Death]:
    """The messages workers died on, from their markers. A timeout explains the failure: any
    other marker left then is a task Spark cancelled for it, not a crash."""
    timeouts = {
        _Death(r.key, TIMEOUT, budget_detail(r.budget_seconds))
        for r in records
        if r.state == TIMEOUT
    }
    crashes = {
        _Death(r.key, "crash", f"its Python worker died ({type(cause).__name__})")
        for r in records
        if r.state == RUNNING
    }
    return sorted(timeouts or crashes, key=lambda d: d.message_id)


def _record_deaths(lake: Lake, key: str, died: list[_Death], *, run_id: str | None) -> None:
    now = datetime.now(UTC)
    rows = [
        CLASSIFY_FAILURES.row(
            batch_key=key,
            message_id=d.message_id,
            kind=d.kind,
            error=d.error,
            failed_at=now,
            run_id=run_id,
        )
        for d in died
    ]
    lake.ensure(CLASSIFY_FAILURES)
    lake.append(CLASSIFY_FAILURES, lake.spark.createDataFrame(rows, CLASSIFY_FAILURES.schema()))


@dataclass(frozen=True)
class ItemsSummary:
    digest: str
    messages: int
    items: int
    invalid_by_reason: dict[str, int]


def items_summary(items: DataFrame) -> ItemsSummary:
    """Counts and a digest of a batch's items in feed order, in one pass over the batch. The
    fold records the digest of what it folded, so a batch re-materialized with different
    content (a backfill after a fix) is noticed."""
    row_hash = F.sha2(
        F.concat_ws(
            "\x1f",
            F.col("msg_seq").cast("string"),
            F.coalesce(F.col("position").cast("string"), F.lit("")),
            F.col("message_id"),
            F.col("status"),
            F.coalesce(F.col("master_id"), F.lit("")),
            F.coalesce(F.col("category"), F.lit("")),
            F.coalesce(F.col("type"), F.lit("")),
            F.coalesce(F.sha2(F.col("payload"), 256), F.lit("")),
            F.coalesce(F.col("reason"), F.lit("")),
        ),
        256,
    )
    # One batch's rows (bounded by the batch bounds) come to the driver as one Arrow table, no
    # Row object per item, and are put in feed order there: a Spark sort of the same rows is a
    # sampling job and a shuffle, ~0.5 s of a 50,000-message batch. An invalid message's one
    # row has no position: -1 sorts it first among its message's rows, where Spark puts nulls.
    rows = items.select(
        row_hash.alias("h"),
        "msg_seq",
        F.coalesce("position", F.lit(-1)).alias("order"),
        "status",
        "reason",
    ).toArrow()
    rows = rows.sort_by([("msg_seq", "ascending"), ("order", "ascending")])
    digest = hashlib.sha256()
    for h in rows.column("h").to_pylist():
        digest.update(bytes.fromhex(h))
    messages = set(rows.column("msg_seq").to_pylist())
    n_items = 0
    invalid: Counter[str] = Counter()
    for status, reason in zip(
        rows.column("status").to_pylist(), rows.column("reason").to_pylist(), strict=True
    ):
        if status == "item":
            n_items += 1
        else:
            invalid[str(reason)] += 1
    return ItemsSummary(digest.hexdigest(), len(messages), n_items, dict(invalid))


def batch_condition(key: str) -> str:
    batch_seq_of(key)  # validates: partition keys are ten digits, safe to inline in SQL
    return f"batch_key = '{key}'"


def log_items(
    lake: Lake,
    key: str,
    *,
    limits: Limits,
    redelivery_limit: int,
    run_id: str | None,
    quarantine_after: int = DEFAULT_QUARANTINE_AFTER,
    landing_root: str | None = None,
) -> ItemsSummary:
    """(Re)write one batch's message_items from its raw_messages, then its batch_log row (in
    that order: the fold reads batch_log's version first, see lake/spark/fold/plan.py)."""
    lake.ensure(MESSAGE_ITEMS, BATCH_LOG)
    where = batch_condition(key)
    write_items(
        lake,
        key,
        limits=limits,
        redelivery_limit=redelivery_limit,
        run_id=run_id,
        quarantine_after=quarantine_after,
        landing_root=landing_root,
    )

    summary = items_summary(lake.read(MESSAGE_ITEMS).where(where))
    log_row = lake.spark.createDataFrame(
        [
            BATCH_LOG.row(
                batch_key=key,
                batch_seq=batch_seq_of(key),
                messages=summary.messages,
                items=summary.items,
                invalid=sum(summary.invalid_by_reason.values()),
                items_digest=summary.digest,
                processed_at=datetime.now(UTC),
                run_id=run_id,
            )
        ],
        BATCH_LOG.schema(),
    )
    lake.merge_rows(BATCH_LOG, log_row, keys=("batch_key",))
    return summary
