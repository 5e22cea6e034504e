"""message_items: parse, validate and split batches of the message log, on Spark executors.

A run classifies one batch, or a range of batches in one Spark job (a run the landed-batches
sensor requests over a backlog: sis_platform/sensors/landed_sensor.py), with the same result
per batch either way.

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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from sis_platform.domain.limits import Limits
from sis_platform.domain.pipeline import DeadLetter, LoggedMessage
from sis_platform.domain.poison import Held, PoisonPolicy, budget_detail
from sis_platform.lake.spark.arrow import record_batches
from sis_platform.lake.tables import (
    BATCH_BLOCK,
    BATCH_LOG,
    CLASSIFY_FAILURES,
    MESSAGE_ITEMS,
    RAW_MESSAGES,
    batch_block,
)
from sis_platform.lake.upkeep import compact_blocks
from sis_platform.log.landing import LandingZone, batch_seq_of
from sis_platform.runtime.faults import InjectedFailure, injected_classify_failure
from sis_platform.runtime.guard import (
    RUNNING,
    TIMEOUT,
    Guard,
    InFlightFolder,
    InFlightRecord,
    classify_watched,
)
from sis_platform.settings import DEFAULT_QUARANTINE_AFTER

if TYPE_CHECKING:
    from sis_platform.lake.delta import Lake


class HeldKey(NamedTuple):
    """A message held back from classification: the same message id may be logged in two
    batches of one range (a redelivery), and only the one an attempt died on is held."""

    batch_key: str
    message_id: str


def _classify_batches(
    batches: Iterator[pa.RecordBatch],
    *,
    limits: Limits,
    redelivery_limit: int,
    held: Mapping[HeldKey, Held] | None = None,
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
    held: Mapping[HeldKey, Held],
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
            message = LoggedMessage(
                message_id, body, delivery_count, size, location, batch_seq=batch_seq
            )
            if location is not None and zone is not None:
                restored = zone.catalog.restored_body(
                    location, size, sha256, limits.max_message_bytes
                )
                if restored is not None:
                    message = LoggedMessage(
                        message_id, restored, delivery_count, batch_seq=batch_seq
                    )
            outcome = held.get(HeldKey(key, message_id)) or classify_watched(
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
    held: Mapping[HeldKey, Held] | None = None,
    inflight_dir: str | None = None,
    landing_root: str | None = None,
) -> DataFrame:
    """Raw message rows (of one batch or several) to message_items rows; `held` and
    `inflight_dir` as for `_classify_batches` (see `write_items`)."""
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
    keys: Sequence[str],
    *,
    limits: Limits,
    redelivery_limit: int,
    run_id: str | None,
    quarantine_after: int = DEFAULT_QUARANTINE_AFTER,
    landing_root: str | None = None,
) -> None:
    """Classify the raw_messages of batches `keys` into their message_items (replacing them, in
    one commit), holding back the messages earlier attempts of this run failed on (see the
    module docstring). With `landing_root`, a body moved aside at intake that fits `limits` now
    is read back from its overflow file and classified (Catalog.restored_body)."""
    where = logged_condition(keys)
    raw = lake.read(RAW_MESSAGES).where(where)
    held = _held_messages(lake, keys, run_id=run_id, quarantine_after=quarantine_after)
    folder = InFlightFolder.create(lake.base_path, f"items-{keys[0]}")
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
            _record_deaths(lake, raw, died, run_id=run_id)
            raise ClassifyFailure(
                f"message_items of {_batches_text(keys)} failed on message(s) "
                f"{', '.join(f'{d.message_id} ({d.kind})' for d in died)}; held back at the "
                f"next attempt after a timeout, after {quarantine_after} deaths otherwise"
            ) from error
        compact_blocks(lake, MESSAGE_ITEMS, map(batch_seq_of, keys), lake.upkeep)
    finally:
        folder.remove()


def _batches_text(keys: Sequence[str]) -> str:
    return f"batch {keys[0]}" if len(keys) == 1 else f"batches {keys[0]}..{keys[-1]}"


def _held_messages(
    lake: Lake, keys: Sequence[str], *, run_id: str | None, quarantine_after: int
) -> dict[HeldKey, Held]:
    """The messages of batches `keys` this run's earlier attempts died on, to hold back."""
    if not lake.exists(CLASSIFY_FAILURES) or lake.version(CLASSIFY_FAILURES) == 0:
        return {}  # no failure ever recorded (the usual case): no Spark job
    rows = (
        lake.read(CLASSIFY_FAILURES)
        .where(batch_condition(keys))
        .where(F.col("run_id").isNull() if run_id is None else F.col("run_id") == run_id)
        .select("batch_key", "message_id", "kind", "error")
        .collect()
    )
    deaths: Counter[HeldKey] = Counter()
    timed_out: dict[HeldKey, str] = {}
    for r in rows:
        message = HeldKey(str(r["batch_key"]), str(r["message_id"]))
        if r["kind"] == TIMEOUT:
            timed_out[message] = str(r["error"])
        else:
            deaths[message] += 1
    policy = PoisonPolicy(quarantine_after)
    verdicts = {
        message: policy.held_message(timed_out=timed_out.get(message), deaths=deaths[message])
        for message in timed_out.keys() | deaths.keys()
    }
    return {message: held for message, held in verdicts.items() if held is not None}


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


def _record_deaths(lake: Lake, raw: DataFrame, died: list[_Death], *, run_id: str | None) -> None:
    """A classify_failures row per message workers died on, in each batch of `raw` (the
    attempt's raw_messages) that logged it (markers name the message, not its batch)."""
    by_id = {d.message_id: d for d in died}
    logged = (
        raw.where(F.col("message_id").isin(list(by_id)))
        .select("batch_key", "message_id")
        .distinct()
        .collect()
    )
    now = datetime.now(UTC)
    rows = [
        CLASSIFY_FAILURES.row(
            batch_key=str(r["batch_key"]),
            message_id=str(r["message_id"]),
            kind=by_id[str(r["message_id"])].kind,
            error=by_id[str(r["message_id"])].error,
            failed_at=now,
            run_id=run_id,
        )
        for r in logged
    ]
    lake.ensure(CLASSIFY_FAILURES)
    lake.append(CLASSIFY_FAILURES, lake.spark.createDataFrame(rows, CLASSIFY_FAILURES.schema()))


@dataclass(frozen=True)
class ItemsSummary:
    digest: str
    messages: int
    items: int
    invalid_by_reason: dict[str, int]

    @staticmethod
    def total(summaries: Sequence[ItemsSummary]) -> ItemsSummary:
        """Several batches' summaries as one (a run over a range of batches): counts summed,
        and the digest of their digests in batch order (one batch: its own summary)."""
        if len(summaries) == 1:
            return summaries[0]
        digest = hashlib.sha256()
        invalid: Counter[str] = Counter()
        for s in summaries:
            digest.update(bytes.fromhex(s.digest))
            invalid.update(s.invalid_by_reason)
        return ItemsSummary(
            digest.hexdigest(),
            sum(s.messages for s in summaries),
            sum(s.items for s in summaries),
            dict(invalid),
        )


def items_summary(items: DataFrame) -> ItemsSummary:
    """Counts and a digest of a batch's items in feed order, in one pass over the batch. The
    fold records the digest of what it folded, so a batch re-materialized with different
    content (a backfill after a fix) is noticed."""
    return _summary(_summary_rows(items))


def items_summaries(items: DataFrame, keys: Sequence[str]) -> dict[str, ItemsSummary]:
    """`items_summary` of each batch of `keys` whose items `items` holds, in one pass over all
    of them (a batch without rows has the summary of none)."""
    rows = _summary_rows(items, "batch_key")
    by_batch = rows.column("batch_key")
    return {key: _summary(rows.filter(pc.equal(by_batch, key))) for key in keys}


def _summary_rows(items: DataFrame, *by: str) -> pa.Table:
    """What a summary reads of each item, as one Arrow table on the driver (no Row object per
    item; the rows are bounded by the run's batches), in feed order."""
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
    # Put in feed order here: a Spark sort of the same rows is a sampling job and a shuffle,
    # ~0.5 s of a 50,000-message batch. An invalid message's one row has no position: -1 sorts
    # it first among its message's rows, where Spark puts nulls.
    rows = items.select(
        *by,
        row_hash.alias("h"),
        "msg_seq",
        F.coalesce("position", F.lit(-1)).alias("order"),
        "status",
        "reason",
    ).toArrow()
    return rows.sort_by([("msg_seq", "ascending"), ("order", "ascending")])


def _summary(rows: pa.Table) -> ItemsSummary:
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


def batch_condition(keys: str | Sequence[str]) -> str:
    """The SQL condition selecting the rows of batch `keys` (one key, or several)."""
    if isinstance(keys, str):
        keys = [keys]
    if not keys:
        raise ValueError("a batch condition needs at least one batch")
    for key in keys:
        batch_seq_of(key)  # validates: partition keys are ten digits, safe to inline in SQL
    if len(keys) == 1:
        return f"batch_key = '{keys[0]}'"
    listed = ", ".join(f"'{k}'" for k in keys)
    return f"batch_key IN ({listed})"


def logged_condition(keys: str | Sequence[str]) -> str:
    """The SQL condition selecting the rows of batch `keys` in raw_messages or message_items:
    their blocks first (the tables' partitions, lake/tables.py), then their keys."""
    if isinstance(keys, str):
        keys = [keys]
    condition = batch_condition(keys)
    blocks = ", ".join(str(b) for b in sorted({batch_block(batch_seq_of(k)) for k in keys}))
    return f"{BATCH_BLOCK.name} IN ({blocks}) AND {condition}"


def log_items(
    lake: Lake,
    keys: str | Sequence[str],
    *,
    limits: Limits,
    redelivery_limit: int,
    run_id: str | None,
    quarantine_after: int = DEFAULT_QUARANTINE_AFTER,
    landing_root: str | None = None,
) -> dict[str, ItemsSummary]:
    """(Re)write the message_items of batch `keys` (one key, or several in one Spark job) from
    their raw_messages, then their batch_log rows (in that order: the fold reads batch_log's
    version first, see lake/spark/fold/plan.py); each batch's summary."""
    keys = [keys] if isinstance(keys, str) else list(keys)
    lake.ensure(MESSAGE_ITEMS, BATCH_LOG)
    write_items(
        lake,
        keys,
        limits=limits,
        redelivery_limit=redelivery_limit,
        run_id=run_id,
        quarantine_after=quarantine_after,
        landing_root=landing_root,
    )
    summaries = items_summaries(lake.read(MESSAGE_ITEMS).where(logged_condition(keys)), keys)
    processed_at = datetime.now(UTC)
    log_rows = lake.spark.createDataFrame(
        [
            BATCH_LOG.row(
                batch_key=key,
                batch_seq=batch_seq_of(key),
                messages=summary.messages,
                items=summary.items,
                invalid=sum(summary.invalid_by_reason.values()),
                items_digest=summary.digest,
                processed_at=processed_at,
                run_id=run_id,
            )
            for key, summary in summaries.items()
        ],
        BATCH_LOG.schema(),
    )
    lake.merge_rows(BATCH_LOG, log_rows, keys=("batch_key",))
    return summaries
