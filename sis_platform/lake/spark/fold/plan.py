"""Which batches a fold step folds: the gap-free run of processed batches after the last committed
step (the fold never advances over a missing batch: docs/design.md invariant 3), and the
already-folded batches whose items changed since (to be rewound, see rewind.py).

The batch log is read at a pinned version. message_items is written before batch_log
(assets/message_log.py), so reading batch_log's version first, then message_items', never pairs
a digest with items older than it. The worst case, newer items under an older digest, is seen as
changed by the next step.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from sis_platform.lake.spark.fold.ledger import (
    CommittedStep,
    FoldedBatch,
    fold_step_rows,
    folded_batches,
)
from sis_platform.lake.tables import BATCH_LOG, MESSAGE_ITEMS

if TYPE_CHECKING:
    from sis_platform.lake.delta import Lake

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoggedBatch:
    """One row of batch_log as the fold reads it."""

    seq: int
    key: str
    digest: str  # items_digest of its current message_items
    messages: int


@dataclass(frozen=True)
class LoggedBatches:
    """The batch log as one fold step reads it (pinned: see the module docstring)."""

    keys: dict[int, str]  # batch_seq -> batch_key
    digests: dict[int, str]  # batch_seq -> items_digest of its current message_items
    messages: dict[int, int] | None = None  # batch_seq -> messages in it (None: not read)

    @classmethod
    def of(cls, batches: list[LoggedBatch]) -> LoggedBatches:
        return cls(
            {b.seq: b.key for b in batches},
            {b.seq: b.digest for b in batches},
            {b.seq: b.messages for b in batches},
        )

    def gap_free_after(self, after: int) -> tuple[list[tuple[int, str]], int | None]:
        """The gap-free run of processed batches after batch `after`, and the first missing
        batch number beyond which later processed batches wait (None if nothing waits)."""
        run: list[tuple[int, str]] = []
        seq = after + 1
        while seq in self.keys:
            run.append((seq, self.keys[seq]))
            seq += 1
        waiting = seq if any(s > seq for s in self.keys) else None
        return run, waiting

    def changed_since(self, folded: dict[int, FoldedBatch], last_folded: int) -> list[int]:
        """The folded batches (up to `last_folded`) whose items digest differs now."""
        return sorted(
            seq
            for seq, digest in self.digests.items()
            if seq in folded and seq <= last_folded and folded[seq].digest != digest
        )


def read_batch_log(
    lake: Lake, version: int, *, after: int | None = None, also: Collection[int] = ()
) -> LoggedBatches:
    """batch_log at `version`, through Arrow (one row per batch: a Row object each would cost
    the driver ~60 us a row, scripts/bench_step_reads.py): every row, or (`after`) only the
    batches after that one and those in `also`, which Delta's file statistics on batch_seq let
    Spark find without reading the rest."""
    rows = lake.read(BATCH_LOG, version=version)
    if after is not None:
        wanted = F.col("batch_seq") > F.lit(after)
        if also:
            wanted = wanted | F.col("batch_seq").isin(sorted(also))
        rows = rows.where(wanted)
    table = rows.select("batch_seq", "batch_key", "items_digest", "messages").toArrow()
    columns = [table.column(c).to_pylist() for c in table.column_names]
    return LoggedBatches.of(
        [
            LoggedBatch(int(seq), str(key), str(digest), int(messages))
            for seq, key, digest, messages in zip(*columns, strict=True)
        ]
    )


def changed_in_feed(lake: Lake, since: int | None, version: int, up_to: int) -> set[int] | None:
    """The batches up to `up_to` (the last folded) whose items digest differs between batch_log
    version `since` (the one the last step planned from) and `version`: only these can differ
    from what was folded, since at `since` every folded batch had the digest it was folded
    with (that step refolded every batch changed by then). Read from batch_log's change feed:
    the rows of the commits in between, a step's worth. A batch logged again with the same
    items is not among them.

    None where the feed cannot tell (no version recorded, a table created without the feed,
    commits past the log's retention, a log older than the version recorded): the caller reads
    the whole log, which always may."""
    if since is None or since > version:
        return None
    if since == version:
        return set()
    try:
        table = (
            lake.changes(BATCH_LOG, after=since, up_to=version)
            .where(F.col("batch_seq") <= F.lit(up_to))
            .select("batch_seq", "items_digest", "_change_type", "_commit_version")
            .toArrow()
        )
    except Exception as error:  # any failure of the feed: the whole log says the same
        log.warning(
            "batch_log's changes after version %d cannot be read (%s); reading it whole",
            since,
            str(error).splitlines()[0] if str(error) else type(error).__name__,
        )
        return None
    rows = sorted(
        zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True),
        # In commit order; in a commit, the row as it was before the row as it is after.
        key=lambda r: (r[3], r[2] not in _BEFORE),
    )
    before: dict[int, str | None] = {}
    after: dict[int, str | None] = {}
    for seq, digest, change, _ in rows:
        before.setdefault(seq, digest if change in _BEFORE else None)
        after[seq] = None if change == "delete" else digest
    return {seq for seq in before if before[seq] != after[seq]}


# Change-feed rows that show a row as it was before its commit.
_BEFORE = frozenset({"update_preimage", "delete"})


@dataclass(frozen=True)
class StepPlan:
    """What one fold step folds, decided on the driver before any Spark job over items."""

    step: int  # the step's number: its last batch, or one more than the last step
    last: int  # the last batch the step folds (the last committed one if no new batch)
    run: list[tuple[int, str]]  # (batch_seq, batch_key) of the new batches, in order
    waiting_for: int | None  # the missing batch that blocks later ones, if any
    changed: list[int]  # folded batches whose items changed: their masters are rewound
    folded: dict[int, FoldedBatch]  # what each batch was when last folded
    logged: LoggedBatches
    items_version: int  # the message_items version the step reads
    log_version: int  # the batch_log version it planned from

    @property
    def first(self) -> int | None:
        return self.run[0][0] if self.run else None

    @property
    def keys(self) -> list[str]:
        return [k for _, k in self.run]

    @property
    def changed_keys(self) -> list[str]:
        return [self.logged.keys[s] for s in self.changed]

    def run_messages(self) -> int:
        """Messages in the new batches (from batch_log, no job)."""
        counts = self.logged.messages or {}
        return sum(counts.get(seq, 0) for seq, _ in self.run)

    def digests(self) -> dict[int, str]:
        """The items digest of every batch the step folds or refolds, as it commits them."""
        return {s: self.logged.digests[s] for s in [*self.changed, *(s for s, _ in self.run)]}


def plan_step(
    lake: Lake,
    committed: CommittedStep,
    *,
    max_batches: int | None = None,
) -> StepPlan:
    """The step after `committed`. Its `run` and `changed` are both empty when nothing can be
    folded.

    What it reads does not grow with the lake: the batches after the last folded one, and
    batch_log's changes since the version the last step planned from. Only when one of those
    changes gave an already-folded batch other items (a fix re-materialized it) does it read
    what every batch was when folded (fold_steps, whole: the rewind needs the items version
    each was folded from), and only when the changes cannot be read does it read batch_log
    whole."""
    log_version = lake.version(BATCH_LOG)
    items_version = lake.version(MESSAGE_ITEMS)
    last_folded = committed.last_batch_seq
    differ = changed_in_feed(lake, committed.log_version, log_version, last_folded)
    if differ is None:
        logged = read_batch_log(lake, log_version)
    else:
        logged = read_batch_log(lake, log_version, after=last_folded, also=differ)
    run, waiting = logged.gap_free_after(last_folded)
    if max_batches is not None:
        run = run[:max_batches]
    refolding = differ is None or bool(differ)
    folded = folded_batches(fold_step_rows(lake)) if refolding else {}
    changed = logged.changed_since(folded, last_folded)
    last = run[-1][0] if run else last_folded
    return StepPlan(
        step=max(last, committed.fold_step + 1),
        last=last,
        run=run,
        waiting_for=waiting,
        changed=changed,
        folded=folded,
        logged=logged,
        items_version=items_version,
        log_version=log_version,
    )
