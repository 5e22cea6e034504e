"""sis-live's per-item budget and its memory of poison: the lake's guard
(sis_platform/runtime/guard.py) around sis-live's own classification and fold, and what earlier
sis-live processes died on (docs/design.md invariants 4 and 6; docs/live.md, "Bounds").

Each message's classification and each master's fold run under a `Guard`: an in-flight marker
(the message id, the master id) and a watchdog armed per item with `SIS_ITEM_BUDGET_SECONDS`.
An item that overruns it gets a `timeout` record in the marker and the watchdog SIGKILLs
sis-live; its supervisor (sis-run) starts it again. A process that dies otherwise mid-item (a
segfault, the OOM killer) leaves its marker `running`. The markers live in sis-live's private
in-flight folder (`<SIS_DATA_DIR>/live/inflight`, 0700): `fold/` and `classify/`, one file per
process.

When sis-live opens its fold (`LiveBudget.open`, before anything is folded), it turns the
markers left behind into durable facts (`failures.json` in the same folder, written whole and
fsync'd before the markers are removed), and the fold then ends each as the poison policy
says (domain/poison.py), which the lake applies to its own facts:

- a fold item that timed out: dead-lettered `too-complex` with `budget_detail`, without being
  folded again; an existing master is left stale (`fold_skipping`, shared with the lake);
- a classification that timed out: the message dead-lettered `too-complex` as a whole;
- a classification that raised: the message dead-lettered `quarantined` at once;
- a death while classifying a message, `SIS_QUARANTINE_AFTER` times: the message `quarantined`;
- a master whose fold raised or died `SIS_QUARANTINE_AFTER` times: its items, from then on,
  dead-lettered `quarantined` and not folded, the master as it was. A death's failure text is
  `DIED_FOLDING`, where the lake records Spark's error.

The stretch in which a fold raises is not committed (the applier retries it with backoff, as
the lake retries its step), so the master's failures are counted until it is quarantined and
the rest of the stretch goes on. Facts are kept for good, as the lake keeps them until a replay
releases them (sis-live has no replay: an operator removes `failures.json` after a fix); each
fact costs a process death or a failed attempt, so the file stays small.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sis_platform.domain.fold import (
    ItemKey,
    ItemSelector,
    MasterFoldResult,
    MasterState,
    PatchCache,
)
from sis_platform.domain.items import Item
from sis_platform.domain.limits import Limits
from sis_platform.domain.pipeline import (
    Classifier,
    DeadLetter,
    LoggedMessage,
    MasterFolder,
    whole_message_dead_letter,
)
from sis_platform.domain.poison import (
    Held,
    PoisonPolicy,
    budget_detail,
    failure_detail,
    held_back,
    quarantine_detail,
)
from sis_platform.live.workers import WorkerSetup
from sis_platform.runtime.faults import (
    InjectedFailure,
    injected_classify_failure,
    injected_fold_failure,
)
from sis_platform.runtime.guard import (
    RUNNING,
    TIMEOUT,
    Guard,
    InFlightFolder,
    InFlightRecord,
    classify_watched,
    fold_watched,
    read_marker,
)
from sis_platform.runtime.logs import concerning
from sis_platform.settings import DEFAULT_QUARANTINE_AFTER

if TYPE_CHECKING:
    from sis_platform.settings import Settings

log = logging.getLogger(__name__)

FOLD, CLASSIFY = "fold", "classify"  # the in-flight folder's two marker folders
FACTS_FILE = "failures.json"
# A master's failure when sis-live died folding it (the lake names Spark's error instead).
DIED_FOLDING = "sis-live died folding it"


@dataclass(frozen=True)
class BudgetConfig:
    """Where sis-live keeps its markers, the per-item budget and the quarantine's threshold."""

    folder: Path
    seconds: float
    quarantine_after: int = DEFAULT_QUARANTINE_AFTER

    @classmethod
    def from_settings(cls, settings: Settings) -> BudgetConfig:
        return cls(
            folder=Path(settings.data_dir) / "live" / "inflight",
            seconds=settings.limits.item_budget_seconds,
            quarantine_after=settings.processing.quarantine_after,
        )


@dataclass(frozen=True)
class MasterFailures:
    """A master's fold failures (errors and deaths) and the last one's text."""

    count: int
    last_error: str


@dataclass
class Failures:
    """What earlier attempts died on or failed at, kept in `failures.json`."""

    timed_out_items: dict[ItemKey, str] = field(default_factory=dict)  # item -> detail
    timed_out_messages: dict[str, str] = field(default_factory=dict)  # message id -> detail
    fold: dict[str, MasterFailures] = field(default_factory=dict)  # master id -> failures
    classify_deaths: dict[str, int] = field(default_factory=dict)  # message id -> deaths

    def to_json(self) -> str:
        return json.dumps(
            {
                "timed_out_items": [[m, p, d] for (m, p), d in self.timed_out_items.items()],
                "timed_out_messages": self.timed_out_messages,
                "fold": {m: [f.count, f.last_error] for m, f in self.fold.items()},
                "classify_deaths": self.classify_deaths,
            },
            indent=1,
            sort_keys=True,
        )

    @staticmethod
    def from_json(text: str) -> Failures:
        data = json.loads(text)
        return Failures(
            timed_out_items={(str(m), int(p)): str(d) for m, p, d in data["timed_out_items"]},
            timed_out_messages={str(k): str(v) for k, v in data["timed_out_messages"].items()},
            fold={str(k): MasterFailures(int(n), str(e)) for k, (n, e) in data["fold"].items()},
            classify_deaths={str(k): int(v) for k, v in data["classify_deaths"].items()},
        )

    def add_fold_failure(self, master_id: str, error: str) -> None:
        before = self.fold.get(master_id)
        self.fold[master_id] = MasterFailures((before.count if before else 0) + 1, error)

    def absorb(self, fold: list[InFlightRecord], classify: list[InFlightRecord]) -> bool:
        """Take in the markers a dead process left (its fold's and its classification's);
        whether anything was new. A timeout explains the death: a `running` marker beside it is
        not a crash of its own (the lake's rule, lake/spark/fold/quarantine.py `died_in_flight`)."""
        fold_timeouts = [r for r in fold if r.state == TIMEOUT]
        classify_timeouts = [r for r in classify if r.state == TIMEOUT]
        for r in fold_timeouts:
            if r.message_id is not None and r.position is not None:
                self.timed_out_items[(r.message_id, r.position)] = budget_detail(r.budget_seconds)
        for r in classify_timeouts:
            self.timed_out_messages[r.key] = budget_detail(r.budget_seconds)
        if fold_timeouts or classify_timeouts:
            return True
        crashed = False
        for r in fold:
            if r.state == RUNNING:
                self.add_fold_failure(r.key, DIED_FOLDING)
                crashed = True
        for r in classify:
            if r.state == RUNNING:
                self.classify_deaths[r.key] = self.classify_deaths.get(r.key, 0) + 1
                crashed = True
        return crashed


class LiveBudget:
    """The guards of one sis-live process and the failures it honours (module docstring)."""

    def __init__(self, config: BudgetConfig, failures: Failures) -> None:
        self.config = config
        self.policy = PoisonPolicy(config.quarantine_after)
        self.failures = failures
        self._fold_guard = Guard(str(config.folder / FOLD), config.seconds)
        self._classify_guard = Guard(str(config.folder / CLASSIFY), config.seconds)
        # Test hooks (sis_platform.runtime.faults), read once: they strike inside the guarded work.
        self._injected_fold: InjectedFailure | None = injected_fold_failure()
        self._injected_classify: InjectedFailure | None = injected_classify_failure()

    @staticmethod
    def open(config: BudgetConfig) -> LiveBudget:
        """Read what earlier processes left in the folder, keep it durably, clear the markers,
        and guard this process's work from now on. Call before folding anything (a marker is
        named by its process id, which a new process may reuse)."""
        for path in (config.folder, config.folder / FOLD, config.folder / CLASSIFY):
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.chmod(0o700)
        facts = config.folder / FACTS_FILE
        failures = Failures.from_json(facts.read_text()) if facts.exists() else Failures()
        fold = InFlightFolder(str(config.folder / FOLD)).records()
        classify = InFlightFolder(str(config.folder / CLASSIFY)).records()
        if failures.absorb(fold, classify):
            kinds = [(r, FOLD) for r in fold] + [(r, CLASSIFY) for r in classify]
            for record, kind in kinds:
                log.warning(
                    "an earlier sis-live process died on %s",
                    _described(record),
                    extra=_concerning(record, kind),
                )
            _write_durably(facts, failures.to_json())
        for marker_folder in (config.folder / FOLD, config.folder / CLASSIFY):
            for marker in marker_folder.iterdir():
                marker.unlink()
        return LiveBudget(config, failures)

    def classifier(self, *, limits: Limits, redelivery_limit: int) -> Classifier:
        """`classify_message` under the guard, messages held back as the lake holds them."""

        def classify(message: LoggedMessage) -> list[Item] | DeadLetter:
            held = self._held_message(message)
            if held is not None:
                return held
            outcome = classify_watched(
                message,
                guard=self._classify_guard,
                injected=self._injected_classify,
                limits=limits,
                redelivery_limit=redelivery_limit,
            )
            if isinstance(outcome, Held):
                return whole_message_dead_letter(message, outcome.reason, outcome.detail)
            return outcome

        return classify

    def folder(
        self, *, selector: ItemSelector | None, patches: PatchCache, limits: Limits
    ) -> MasterFolder:
        """`fold_master` under the guard, each item on the budget; timed-out items and
        quarantined masters end as the lake ends them. A fold that raises is counted against
        its master (durably) and raised again: the stretch is retried, and after
        `quarantine_after` failures the master is held back."""
        guard = self._fold_guard

        def fold(master_id: str, state: MasterState | None, items: list[Item]) -> MasterFoldResult:
            if self.held(master_id):
                failed = self.failures.fold[master_id]
                detail = quarantine_detail(failed.count, failed.last_error)
                return held_back(master_id, state, items, detail)
            guard.start(master_id)
            try:
                return fold_watched(
                    master_id,
                    state,
                    items,
                    guard=guard,
                    injected=self._injected_fold,
                    timed_out=self.failures.timed_out_items,
                    selector=selector,
                    patches=patches,
                    limits=limits,
                )
            except Exception as error:
                self.fold_failed(master_id, failure_detail(error))
                raise
            finally:
                guard.done()

        return fold

    def held(self, master_id: str) -> bool:
        """Whether the master is quarantined: its items are held back, not folded."""
        failed = self.failures.fold.get(master_id)
        return failed is not None and self.policy.quarantines(failed.count)

    def fold_failed(self, master_id: str, detail: str) -> None:
        """The fold of `master_id` raised (`failure_detail`): count it, durably."""
        self.failures.add_fold_failure(master_id, detail)
        _write_durably(self.config.folder / FACTS_FILE, self.failures.to_json())
        log.error(
            "the fold of master %s failed (%d of %d before it is quarantined)",
            master_id,
            self.failures.fold[master_id].count,
            self.config.quarantine_after,
            extra=concerning(master_id=master_id),
        )

    def worker_setup(self, *, selector: ItemSelector | None, limits: Limits) -> WorkerSetup:
        """How fold workers fold beside this process (sis_platform/live/workers.py): their
        markers in this process's fold folder, on the same budget."""
        return WorkerSetup(selector, limits, str(self.config.folder / FOLD), self.config.seconds)

    def worker_died(self, pid: int) -> None:
        """A fold worker died: take in the marker it left, as `open` takes in an earlier
        process's (a timeout dead-letters its item; a death counts against its master)."""
        marker = self.config.folder / FOLD / f"{pid}.inflight"
        try:
            record = read_marker(str(marker))
        except FileNotFoundError:
            record = None
        if record is not None and self.failures.absorb([record], []):
            log.warning(
                "a fold worker (pid %d) died on %s",
                pid,
                _described(record),
                extra=_concerning(record, FOLD),
            )
            _write_durably(self.config.folder / FACTS_FILE, self.failures.to_json())
        else:
            log.warning("a fold worker (pid %d) died between masters", pid)
        marker.unlink(missing_ok=True)

    def close(self) -> None:
        self._fold_guard.close()
        self._classify_guard.close()

    def _held_message(self, message: LoggedMessage) -> DeadLetter | None:
        held = self.policy.held_message(
            timed_out=self.failures.timed_out_messages.get(message.message_id),
            deaths=self.failures.classify_deaths.get(message.message_id, 0),
        )
        if held is None:
            return None
        return whole_message_dead_letter(message, held.reason, held.detail)


def _concerning(record: InFlightRecord, kind: str) -> dict[str, object]:
    """The log fields of what `record` (a `kind` marker) was working on
    (sis_platform/runtime/logs.py): the message a classification was on, or the master a fold
    was on with the item when it timed out."""
    if kind == CLASSIFY:
        return concerning(message_id=record.key)
    return concerning(master_id=record.key, message_id=record.message_id, position=record.position)


def _described(record: InFlightRecord) -> str:
    if record.state == TIMEOUT:
        return f"{record.key} ({record.message_id}/{record.position}: over its budget)"
    return f"{record.key} (died)"


def _write_durably(path: Path, text: str) -> None:
    """Replace `path` with `text`: a private temporary file, fsync'd, renamed over it, and the
    folder fsync'd, so a crash leaves the old facts or the new ones whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
        f.write(text.encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
