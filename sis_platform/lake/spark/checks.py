"""The lake's integrity checks: what each committed fold step (and model refresh) must leave true.

Each check reads the tables back (never the fold's in-memory results) and returns a `Finding`:
passed or not, with numeric metadata an operator can plot and the first few offenders. The
asset layer (assets/masters.py, assets/model.py) reports them as Dagster asset checks in the
same step, on the same Spark session.

Cost is bounded by the step, not the log, where the property allows: the version and end-state
checks read only the masters and batches the step touched; the once-only check reads one
column set of `message_outcomes` (semi-joined on the step's message ids); the one-row check and
the model's references read tables with one row per master (or per market/selection of a
current master).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from sis_platform.lake.spark.items import logged_condition
from sis_platform.lake.tables import (
    DEAD_LETTERS,
    EVENTS,
    MARKETS,
    MASTER_DOCUMENTS,
    MASTER_VERSIONS,
    MESSAGE_OUTCOMES,
    RAW_MESSAGES,
    SELECTIONS,
)
from sis_platform.log.landing import batch_key

if TYPE_CHECKING:
    from sis_platform.lake.delta import Lake

# Offenders named in a finding's metadata, at most.
EXAMPLES = 5
APPLIED = "applied"


@dataclass(frozen=True)
class Finding:
    passed: bool
    metadata: dict[str, Any] = field(default_factory=dict)
    examples: tuple[str, ...] = ()  # the first offenders, for the check's description


@dataclass(frozen=True)
class StepScope:
    """What a committed fold step covered (None: no step yet)."""

    fold_step: int
    first_batch_seq: int
    last_batch_seq: int


def _tally(df: DataFrame, problem: Column, label: Column) -> tuple[int, int, tuple[str, ...]]:
    """Rows, rows with a problem, and the first offenders' labels: one Spark job."""
    row = df.agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.when(problem, 1).otherwise(0)).alias("bad"),
        F.slice(F.collect_list(F.when(problem, label)), 1, EXAMPLES).alias("examples"),
    ).first()
    if row is None:
        return 0, 0, ()
    return int(row["rows"] or 0), int(row["bad"] or 0), tuple(row["examples"] or ())


def one_row_per_master(lake: Lake) -> Finding:
    """`master_documents` holds exactly one row per master id."""
    if not lake.exists(MASTER_DOCUMENTS):
        return Finding(True, {"masters": 0, "duplicated_masters": 0})
    counts = lake.read(MASTER_DOCUMENTS).groupBy("master_id").count()
    masters, duplicated, examples = _tally(counts, F.col("count") > 1, F.col("master_id"))
    return Finding(
        duplicated == 0, {"masters": masters, "duplicated_masters": duplicated}, examples
    )


def versions_gap_free(lake: Lake, scope: StepScope) -> Finding:
    """Every master the step wrote versions for has versions 1, 2, ... n in log order (committed
    steps only): none missing, none twice, none out of order."""
    versions = lake.read(MASTER_VERSIONS).where(F.col("fold_step") <= scope.fold_step)
    touched = versions.where(F.col("fold_step") == scope.fold_step).select("master_id").distinct()
    order = Window.partitionBy("master_id").orderBy("batch_seq", "msg_seq", "position")
    wrong = (
        versions.join(F.broadcast(touched), "master_id", "left_semi")
        .withColumn("expected", F.row_number().over(order))
        .groupBy("master_id")
        .agg(F.sum(F.when(F.col("version") != F.col("expected"), 1).otherwise(0)).alias("wrong"))
    )
    masters, broken, examples = _tally(wrong, F.col("wrong") > 0, F.col("master_id"))
    return Finding(broken == 0, {"masters_checked": masters, "masters_with_gaps": broken}, examples)


def applied_at_most_once(lake: Lake, scope: StepScope) -> Finding:
    """No (message id, master id) is applied twice: the step's applied items against every
    committed step's (exactly once, invariant 2)."""
    outcomes = lake.read(MESSAGE_OUTCOMES).where(
        (F.col("fold_step") <= scope.fold_step) & (F.col("outcome") == APPLIED)
    )
    step_ids = outcomes.where(F.col("fold_step") == scope.fold_step).select("message_id").distinct()
    pairs = (
        outcomes.join(F.broadcast(step_ids), "message_id", "left_semi")
        .groupBy("message_id", "master_id")
        .count()
    )
    label = F.concat_ws(" -> ", "message_id", "master_id")
    items, twice, examples = _tally(pairs, F.col("count") > 1, label)
    return Finding(twice == 0, {"applied_items_checked": items, "applied_twice": twice}, examples)


def one_end_state_per_message(lake: Lake, scope: StepScope) -> Finding:
    """Every logged message of the step's batches has exactly one end state: one outcome for
    the whole message, or one per item, never both, none missing, none twice."""
    seqs = list(range(scope.first_batch_seq, scope.last_batch_seq + 1))
    logged = (
        lake.read(RAW_MESSAGES)
        .where(logged_condition([batch_key(s) for s in seqs]))  # the batches' blocks, then keys
        .select("batch_seq", "msg_seq", "message_id")
    )
    per_key = (
        lake.read(MESSAGE_OUTCOMES)
        .where((F.col("fold_step") <= scope.fold_step) & F.col("batch_seq").isin(seqs))
        .groupBy("batch_seq", "msg_seq", "position")
        .count()
    )
    per_message = per_key.groupBy("batch_seq", "msg_seq").agg(
        F.sum(F.when(F.col("position").isNull(), F.col("count")).otherwise(0)).alias("whole"),
        F.sum(F.when(F.col("position").isNotNull(), 1).otherwise(0)).alias("items"),
        F.max("count").alias("most"),
    )
    problem = (
        F.when(F.col("most").isNull(), F.lit("no end state"))
        .when(F.col("most") > 1, F.lit("an end state twice"))
        .when((F.col("whole") > 0) & (F.col("items") > 0), F.lit("whole and per item"))
    )
    judged = logged.join(per_message, ["batch_seq", "msg_seq"], "left").withColumn(
        "problem", problem
    )
    label = F.format_string(
        "%s (batch %d message %d): %s", "message_id", "batch_seq", "msg_seq", "problem"
    )
    messages, broken, examples = _tally(judged, F.col("problem").isNotNull(), label)
    return Finding(
        broken == 0,
        {"messages_checked": messages, "messages_without_one_end_state": broken},
        examples,
    )


def model_references_hold(lake: Lake) -> Finding:
    """Every market belongs to an event in the model, every selection to a market."""
    if not all(lake.exists(t) for t in (EVENTS, MARKETS, SELECTIONS)):
        return Finding(True, {"orphan_markets": 0, "orphan_selections": 0})
    # Broadcast: a row per master and per market, small next to the selections.
    events = F.broadcast(lake.read(EVENTS).select("master_id").distinct())
    markets = lake.read(MARKETS).select("master_id", "market_id")
    orphan_markets = markets.join(events, "master_id", "left_anti")
    orphan_selections = (
        lake.read(SELECTIONS)
        .select("master_id", "market_id", "selection_id")
        .join(F.broadcast(markets.distinct()), ["master_id", "market_id"], "left_anti")
    )
    n_markets, _, market_examples = _tally(
        orphan_markets, F.lit(True), F.concat_ws("/", F.lit("market"), "master_id", "market_id")
    )
    n_selections, _, selection_examples = _tally(
        orphan_selections,
        F.lit(True),
        F.concat_ws("/", F.lit("selection"), "master_id", "market_id", "selection_id"),
    )
    return Finding(
        n_markets == 0 and n_selections == 0,
        {"orphan_markets": n_markets, "orphan_selections": n_selections},
        (market_examples + selection_examples)[:EXAMPLES],
    )


def dead_letter_rate(
    lake: Lake,
    fold_step: int,
    batches: range,
    threshold: float,
    batch_messages: Callable[[int], int | None],
) -> Finding:
    """The share of each batch's messages that the fold step dead-lettered (a message counts
    once, whether it was dead-lettered whole or for one of its items), with the dead-lettered
    messages by reason: passed when no batch is over `threshold`. `batches` are the batches the
    step folded; a batch it dead-lettered messages of outside them (a replay's) is judged too.
    `batch_messages(seq)`: how many messages batch `seq` logged (None: not known).

    One small Spark job: the step's dead letters as distinct (batch, reason, message id), at
    most a row per dead-lettered message and reason, counted here. (Counting distinct ids per
    batch and reason in Spark, with a rollup, measured slower: each distinct count is a shuffle
    of its own. The batches' sizes come from the caller, the landing zone's anchors, rather
    than from a second job over batch_log.)"""
    seen: dict[int, dict[str, set[str]]] = {}  # batch -> reason -> message ids
    if lake.exists(DEAD_LETTERS):
        letters = (
            lake.read(DEAD_LETTERS)
            .where(F.col("fold_step") == F.lit(fold_step))
            .select("batch_seq", "reason", "message_id")
            .distinct()
            .collect()
        )
        for row in letters:
            of_batch = seen.setdefault(int(row["batch_seq"]), {})
            of_batch.setdefault(str(row["reason"]), set()).add(str(row["message_id"]))
    known = {b: batch_messages(b) for b in sorted(set(batches) | set(seen))}
    messages = {b: n for b, n in known.items() if n is not None}  # batch -> messages logged

    dead = {b: len(set().union(*reasons.values())) for b, reasons in seen.items()}
    by_reason: dict[str, int] = {}
    for reasons in seen.values():
        for reason, ids in reasons.items():
            by_reason[reason] = by_reason.get(reason, 0) + len(ids)
    # A batch whose size is not known (never so after a fold) is judged on what it lost.
    rates = {b: n / max(messages.get(b, n), n, 1) for b, n in dead.items()}
    over = sorted((b for b, rate in rates.items() if rate > threshold), key=lambda b: -rates[b])
    total = sum(messages.values())
    step_dead = sum(dead.values())
    metadata: dict[str, Any] = {
        "batches_checked": len(set(messages) | set(dead)),
        "messages": total,
        "dead_lettered_messages": step_dead,
        "dead_letter_rate": round(step_dead / total, 6) if total else 0.0,
        "worst_batch_rate": round(max(rates.values(), default=0.0), 6),
        "batches_over_threshold": len(over),
        "threshold": threshold,
    }
    for reason, n in sorted(by_reason.items()):
        metadata[f"dead_letters_{reason.replace('-', '_')}"] = n
    examples = tuple(
        f"batch {b}: {dead[b]} of {messages.get(b, dead[b])} messages ({rates[b]:.1%}): "
        + ", ".join(f"{reason} {len(ids)}" for reason, ids in sorted(seen[b].items()))
        for b in over[:EXAMPLES]
    )
    return Finding(not over, metadata, examples)
