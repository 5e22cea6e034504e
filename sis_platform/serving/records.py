"""The serving store's records: what sis-live commits for one group, what readers get back, and
the store's errors.

A group's commit is one `GroupCommit`: the state of every master the group changed, their model
rows, the change log's new rows, dead letters and message outcomes, and the log position the
group ends at. Readers get `StoredMaster`, `Change`, `DeadLetter` and `StoreStatus` rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from sis_platform.domain.interpret import Interpretation
from sis_platform.log.position import LogPosition


class ServingUnavailable(Exception):
    """The store cannot be reached or written right now (connection refused or lost, database
    locked past its busy timeout, disk full): retry later; nothing of the call was committed."""


class StoreNotReady(ServingUnavailable):
    """A reader met no store it can read: no database, no tables, or tables of an older schema
    version. A reader cannot create or upgrade them (its connection is read-only): the writer
    does, when sis-live opens the store; until then the store is unavailable to readers."""


class PositionConflict(RuntimeError):
    """A commit whose position is not after the stored one: a bug in the caller or a second
    writer. Nothing of the group was committed."""


class HistoryPruned(LookupError):
    """A reader asked for history the store has pruned (older than SIS_SERVING_HISTORY_DAYS and
    checked live == lake): `held_after` is the seq after which the table is complete again."""

    def __init__(self, message: str, held_after: int) -> None:
        super().__init__(message)
        self.held_after = held_after


class ChangesPruned(HistoryPruned):
    """The change log asked for at or before a pruned seq, batch or instant: below
    `held_after` only each master's last change is kept. Read the current masters and resume
    after `held_after` (docs/serving.md)."""


class DeadLettersPruned(HistoryPruned):
    """Dead letters asked for at or before a pruned seq (the lake's `dead_letters` keeps them)."""


# -- what readers get ---------------------------------------------------------------------------


class StoredMaster(NamedTuple):
    """A master's current version and document (UTF-8 XML bytes)."""

    version: int
    document: bytes


class Change(NamedTuple):
    """One row of the change log. `seq` increases in commit order (one writer); PostgreSQL may
    skip numbers a failed commit took, so a reader resumes after the last seq it saw."""

    seq: int
    master_id: str
    version: int
    message_id: str
    put_time: datetime | None
    committed_at: datetime
    batch_seq: int
    msg_seq: int
    document_sha256: str


class DeadLetter(NamedTuple):
    """A dead-lettered message (master_id and position None) or one master's item of it."""

    seq: int
    message_id: str
    master_id: str | None
    position: int | None
    reason: str
    detail: str
    batch_seq: int
    msg_seq: int
    recorded_at: datetime


class Retention(NamedTuple):
    """The `retention` row: the live == lake gate and how far each history table is pruned
    (sis_platform/serving/schema.py, RETENTION)."""

    checked_batch: int
    changes_pruned_seq: int
    changes_pruned_batch: int
    changes_pruned_at: datetime | None
    dead_letters_pruned_seq: int


class LakeProgress(NamedTuple):
    """The `lake_progress` row: the lake's last committed fold step (fold_steps), recorded in
    the store by the fold asset (sis_platform/serving/schema.py, LAKE_PROGRESS)."""

    fold_step: int
    last_batch_seq: int  # the last batch that step folded
    committed_at: datetime  # when that step committed (UTC)
    dead_letters: int  # dead letters written by every committed step, summed
    recorded_at: datetime | None = None  # when the store got the record (set by the store)


class Pruned(NamedTuple):
    """One prune step: rows removed from each table, and whether more is prunable now."""

    changes: int
    dead_letters: int
    more: bool
    outcomes: int = 0


class StoreHalt(NamedTuple):
    """Why the writer stopped applying and getting from the queue (`reason`, a short code such
    as `store-beyond-landing`; `detail`, for an operator), and since when."""

    reason: str
    detail: str
    raised_at: datetime


# The store is at a log position the landing zone does not reach (a landing rolled back under
# it): nothing is applied or got until the landing or the store is put right (docs/live.md).
STORE_BEYOND_LANDING = "store-beyond-landing"


class StoreStatus(NamedTuple):
    """Where the store is: the last log position applied, the change log's last seq, how many
    masters and messages it holds, when the last group was committed and the writer's last
    heartbeat (None before the first), and why the writer is halted (None: it is not)."""

    position: LogPosition
    last_seq: int
    masters: int
    messages: int
    committed_at: datetime | None
    heartbeat_at: datetime | None
    halt: StoreHalt | None = None


# -- what sis-live commits ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MasterRow:
    """A master's state after the group: its version, document (None before its first applied
    version), the message that made that version, and its stale / filtered flags."""

    master_id: str
    version: int
    document: bytes | None
    message_id: str | None
    stale: bool
    filtered: bool


@dataclass(frozen=True, slots=True)
class ChangeRow:
    """One new version of a master: the change log row a reader tails."""

    master_id: str
    version: int
    message_id: str
    position: int
    batch_seq: int
    msg_seq: int
    put_time: datetime | None
    operation: str
    document_sha256: str


@dataclass(frozen=True, slots=True)
class DeadLetterRow:
    """A dead-lettered message (master_id and position None) or item, with the body kept."""

    message_id: str
    master_id: str | None
    position: int | None
    reason: str
    detail: str
    batch_seq: int
    msg_seq: int
    body: bytes


@dataclass(frozen=True, slots=True)
class OutcomeRow:
    """How one message (position -1) or one of its items ended: applied, duplicate, filtered,
    dead-lettered (docs/feed.md)."""

    message_id: str
    batch_seq: int
    msg_seq: int
    position: int
    master_id: str | None
    outcome: str
    reason: str | None


@dataclass(frozen=True)
class GroupCommit:
    """Everything one group changes, committed in one transaction with `position`, the last
    message of the group. `model` maps each changed master to its interpreted rows, or None to
    remove them; every master in `model` has its row in `masters`."""

    position: LogPosition
    masters: list[MasterRow]
    model: dict[str, Interpretation | None]
    changes: list[ChangeRow]
    dead_letters: list[DeadLetterRow]
    outcomes: list[OutcomeRow]
    # Masters folded ahead of the rest of the stretch (SIS_PRIORITY): their rows and item
    # outcomes through `position` are committed, the store's position is not moved. Empty: the
    # stretch's last commit, which moves the position and completes every message up to it.
    ahead: tuple[str, ...] = ()
    # Messages this commit completes; None: counted from its outcome rows.
    completes: int | None = None

    @property
    def messages(self) -> int:
        """Messages the group applied: every message of the log ends with at least one outcome
        row (invariant 4), so the distinct log positions among the outcomes, unless the
        stretch was committed in parts (`completes`)."""
        if self.ahead:
            return 0
        if self.completes is not None:
            return self.completes
        return len({(o.batch_seq, o.msg_seq) for o in self.outcomes})
