"""Unknown fold failures and the quarantine (docs/design.md invariants 4 and 6): fold_failures.

Each master is folded under the worker guard (sis_platform/runtime/guard.py): an in-flight marker
and a per-item wall-clock budget. A master whose fold raises yields one `failure` row, its id a
column; the driver collects those rows before it writes anything. A worker that dies leaves its
master in its marker; one the watchdog killed leaves the item too. Either way the failure is
recorded in fold_failures against exactly those masters (never against a name found in an error's
text) and the step fails, to be retried: an item over the budget is then dead-lettered `too-complex`
without being folded again, and a master that failed `quarantine_after` times is quarantined: its
items are held back as dead letters so the fold of every other master goes on. On object storage
there are no markers: a dying worker is retried as a transient failure, and only failure rows
attribute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, NoReturn

from pyspark.sql import functions as F

from sis_platform.domain.poison import FAILURE_DETAIL_CHARS, PoisonPolicy, budget_detail
from sis_platform.lake.delta import sql_in
from sis_platform.lake.tables import FOLD_FAILURES
from sis_platform.runtime.guard import RUNNING, TIMEOUT, InFlightFolder

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row

    from sis_platform.lake.delta import Lake

# Kinds of fold failure (fold_failures.kind).
ERROR, CRASH = "error", "crash"  # and guard.TIMEOUT

# The outcome a `failure` row of the fold takes among the step's outcomes (never written).
FAILED = "failed"


class FoldFailure(RuntimeError):
    """The fold failed for an unknown reason (not a content error: those are dead letters).
    Retried by the asset's retry policy; the masters it names are quarantined once they have
    failed `quarantine_after` times, and an item that overran its budget is dead-lettered
    `too-complex` at the next attempt."""


@dataclass(frozen=True)
class MasterFailure:
    """One master a failed fold attempt was folding, as a structured fact: its failure row, or
    the in-flight marker its worker left."""

    master_id: str
    kind: str  # ERROR | CRASH | TIMEOUT
    error: str
    message_id: str | None = None  # TIMEOUT: the item that overran
    position: int | None = None


def failure_rows(rows: list[Row]) -> list[MasterFailure]:
    """The fold's `failure` rows (master_id, detail), collected before anything is written."""
    return [MasterFailure(str(r["master_id"]), ERROR, str(r["detail"])) for r in rows]


def died_in_flight(folder: InFlightFolder, error: BaseException) -> list[MasterFailure]:
    """The masters fold workers died on, from their markers: killed by the watchdog over an
    item (TIMEOUT) or dead of anything else mid-fold (CRASH). A timeout explains the job's
    failure: any other marker left then is a task Spark cancelled for it, not a crash. Empty on
    object storage, where there are no markers: such a failure is retried as a transient one."""
    records = folder.records()
    timeouts = [
        MasterFailure(r.key, TIMEOUT, budget_detail(r.budget_seconds), r.message_id, r.position)
        for r in records
        if r.state == TIMEOUT
    ]
    if timeouts:
        return timeouts
    return [
        MasterFailure(r.key, CRASH, f"its Python worker died ({type(error).__name__})")
        for r in records
        if r.state == RUNNING
    ]


@dataclass(frozen=True)
class KnownFailures:
    """What earlier failed attempts decided for this step's plan."""

    quarantined: dict[str, str] = field(default_factory=dict)  # master id -> detail
    timed_out: dict[tuple[str, int], str] = field(default_factory=dict)  # item -> detail


def known_failures(lake: Lake, after: int) -> KnownFailures:
    """Masters with at least `after` unreleased errors or crashes (quarantined, with their last
    error), and the unreleased items that overran the budget."""
    if lake.version(FOLD_FAILURES) == 0:
        return KnownFailures()  # as created: no failure ever recorded (the usual case), no job
    rows = (
        lake.read(FOLD_FAILURES)
        .where(~F.col("released"))
        .select("master_id", "kind", "error", "failed_at", "message_id", "position")
        .orderBy("failed_at")
        .collect()
    )
    timed_out = {
        (str(r["message_id"]), int(r["position"])): str(r["error"])
        for r in rows
        if r["kind"] == TIMEOUT
    }
    failures = [(str(r["master_id"]), str(r["error"])) for r in rows if r["kind"] != TIMEOUT]
    return KnownFailures(PoisonPolicy(after).quarantined(failures), timed_out)


def hold_quarantined(valid: DataFrame, quarantined: dict[str, str]) -> tuple[DataFrame, DataFrame]:
    """The valid items split into those to fold and those held back: a quarantined master's
    items, each with the quarantine's `detail`, to be dead-lettered `quarantined`."""
    if not quarantined:
        return valid, valid.where(F.lit(False))
    reasons = F.create_map(*[F.lit(x) for kv in quarantined.items() for x in kv])
    masters = list(quarantined)
    held = valid.where(F.col("master_id").isin(masters)).withColumn(
        "detail", reasons[F.col("master_id")]
    )
    return valid.where(~F.col("master_id").isin(masters)), held


def record_failures(
    lake: Lake, failures: list[MasterFailure], *, step: int, run_id: str | None
) -> None:
    now = datetime.now(UTC)
    rows = [
        FOLD_FAILURES.row(
            master_id=f.master_id,
            fold_step=step,
            error=f.error[:FAILURE_DETAIL_CHARS],
            failed_at=now,
            run_id=run_id,
            released=False,
            kind=f.kind,
            message_id=f.message_id,
            position=f.position,
        )
        for f in sorted(set(failures), key=lambda f: (f.master_id, f.kind, f.error))
    ]
    lake.append(FOLD_FAILURES, lake.spark.createDataFrame(rows, FOLD_FAILURES.schema()))


def release_quarantine(lake: Lake, masters: set[str]) -> None:
    """Let the masters be folded again (dead-letter replay, after a fix): their failures of
    every kind, items over the budget included, no longer count."""
    if masters:
        lake.update(
            FOLD_FAILURES, f"{sql_in('master_id', masters)} AND NOT released", {"released": "true"}
        )


def fail_step(
    lake: Lake,
    failures: list[MasterFailure],
    *,
    step: int,
    run_id: str | None,
    quarantine_after: int,
    cause: BaseException | None = None,
) -> NoReturn:
    """Record the failures against exactly their masters, then fail the step (retried)."""
    record_failures(lake, failures, step=step, run_id=run_id)
    named = ", ".join(
        f"{f.master_id} ({f.kind}{f' in {f.message_id}/{f.position}' if f.message_id else ''})"
        for f in sorted(set(failures), key=lambda f: f.master_id)
    )
    raise FoldFailure(
        f"fold step {step} failed on {named}; an item over its budget is dead-lettered "
        f"too-complex at the next attempt, a master is quarantined after {quarantine_after} "
        "failures"
    ) from cause
