"""sis-live's in-memory fold: landed messages to what the serving store commits for them.

A stretch of the log (one landed group, or a run of groups while catching up) goes through the
reference pipeline's own loop (`classify_stretch`, `fold_stretch` in
sis_platform/domain/pipeline.py): deduplicated by message id against the stretch and the
store's copies in the dedup window (`ServingWriter.latest_copies`, domain/dedup.py), the
redelivery limit, classification, splitting, `fold_master` per
master in feed order with one `PatchCache`, dead letters with the original body. So the store
ends with exactly the masters, versions, dead letters and outcomes of `ReferencePipeline` over
the same log (docs/design.md, invariants 2-4 and 7).

The result is a `GroupCommit`: each changed master's state, its model rows (`interpret`; None
when it has no document or is filtered, as the lake's model leaves such a master out), one
change row per new version, the dead letters and one outcome row per message or item, and the
log position it brings the store to.

Masters are cached in memory, at most `max_masters` (least recently used out). A miss is loaded
from the store, one `masters_state` call per stretch for all of them; a master the store does
not hold is cached as absent. The cache changes only in `committed`, after the store has
committed the same rows, so it always holds what the store holds and an eviction loses nothing.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sis_platform.domain.dedup import DEFAULT_DEDUP_WINDOW, Copies, DedupWindow
from sis_platform.domain.fold import ItemResult, ItemSelector, MasterState, PatchCache
from sis_platform.domain.interpret import Interpretation, interpret
from sis_platform.domain.items import Item
from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.domain.pipeline import (
    DEFAULT_REDELIVERY_LIMIT,
    ClassifiedStretch,
    Classifier,
    FoldedStretch,
    MasterFolder,
    classify_stretch,
    fold_stretch,
)
from sis_platform.domain.priority import Priority
from sis_platform.live.workers import PARALLEL_MIN_ITEMS, FoldWorkers, SharedFold
from sis_platform.log.landing import LandedMessage, LogPosition
from sis_platform.runtime.logs import concerning
from sis_platform.serving.records import (
    ChangeRow,
    DeadLetterRow,
    GroupCommit,
    MasterRow,
    OutcomeRow,
)
from sis_platform.settings import DEFAULT_LIVE_MAX_MASTERS

if TYPE_CHECKING:
    from sis_platform.live.budget import LiveBudget

log = logging.getLogger(__name__)


class FoldStore(Protocol):
    """What the fold reads of the serving store (sis_platform.serving.ServingWriter)."""

    def masters_state(self, ids: Iterable[str]) -> dict[str, MasterRow]: ...

    def latest_copies(self, message_ids: Iterable[str], since_batch: int) -> dict[str, int]: ...


@dataclass(frozen=True)
class FoldOptions:
    """How the feed is folded (settings.processing and settings.limits) and the cache bound."""

    selector: ItemSelector | None = None
    limits: Limits = DEFAULT_LIMITS
    redelivery_limit: int = DEFAULT_REDELIVERY_LIMIT
    max_masters: int = DEFAULT_LIVE_MAX_MASTERS
    priority: Priority | None = None
    window: DedupWindow = DEFAULT_DEDUP_WINDOW

    def __post_init__(self) -> None:
        if self.max_masters < 1:
            raise ValueError(f"max_masters must be at least 1, got {self.max_masters}")


class LiveFold:
    """Folds stretches of the landed log against the store (see the module docstring). With
    `budget`, each message's classification and each master's fold run under the per-item
    budget and the failures of earlier processes are honoured (sis_platform/live/budget.py)."""

    def __init__(
        self,
        store: FoldStore,
        options: FoldOptions,
        budget: LiveBudget | None = None,
        workers: FoldWorkers | None = None,
    ) -> None:
        self.store = store
        self.options = options
        self._patches = PatchCache(options.limits)
        self._budget = budget
        # Processes that fold a share of a long stretch's masters (only under a budget: they
        # honour and report failures through it).
        self._workers = workers if budget is not None else None
        self._classify: Classifier | None = None
        self._fold: MasterFolder | None = None
        if budget is not None:
            self._classify = budget.classifier(
                limits=options.limits, redelivery_limit=options.redelivery_limit
            )
            self._fold = budget.folder(
                selector=options.selector, patches=self._patches, limits=options.limits
            )
        # master id -> its row as the store holds it, or None: the store has no row for it.
        self._cache: OrderedDict[str, MasterRow | None] = OrderedDict()

    @property
    def cached(self) -> int:
        """How many masters (present or known absent) are held in memory."""
        return len(self._cache)

    def fold(self, messages: Sequence[LandedMessage]) -> GroupCommit:
        """The commit for `messages`, the log's next stretch after the store's position (in log
        order, at least one), in one part. The cache is not changed: call `committed` once the
        store has committed the result, or nothing if it has not."""
        return self._part(self._classified(messages, frozenset()), messages, last=True)

    def classify(
        self, messages: Sequence[LandedMessage], also_seen: Mapping[str, int] | None = None
    ) -> ClassifiedStretch:
        """The first step of `fold` alone, for a stretch that follows one still being folded:
        `also_seen` holds that one's copies, message id to batch (the store has not got them
        yet)."""
        return self._classified(messages, frozenset(), also_seen)

    def launch(
        self,
        classified: ClassifiedStretch,
        messages: Sequence[LandedMessage],
        *,
        own_share: float | None = None,
    ) -> LaunchedFold:
        """Start folding `classified` (of `messages`, the stretch right after the store's
        position) in one part: the workers' shares sent and sis-live's own share (`own_share`
        of the items; None: an equal share) folded. `complete` gives the commit; until then
        the cache is not touched, so the next stretch may be classified meanwhile."""
        before = self._states(classified.groups.keys())
        shared = self._shared(classified.groups, before, own_share)
        launched = LaunchedFold(classified, messages, before, shared)
        if shared is not None:
            try:
                shared.fold_own()
            except BaseException:
                launched.abandon()
                raise
        return launched

    def complete(self, launched: LaunchedFold, *, last: bool = True) -> GroupCommit:
        """The commit of a launched fold (waiting for the workers' shares); the `last` part of
        a stretch also takes the messages as a whole and completes every message of it (some
        may have had all their items committed in earlier parts, even by an interrupted
        earlier try)."""
        options = self.options
        classified, messages, before = launched.classified, launched.messages, launched.before
        try:
            folded = fold_stretch(
                classified,
                before.get,
                selector=options.selector,
                patches=self._patches,
                limits=options.limits,
                fold=launched.shared or self._fold,
            )
        finally:
            launched.abandon()
        masters = _changed_masters(folded, before, self._rows(classified.groups.keys()))
        return GroupCommit(
            position=messages[-1].position,
            masters=masters,
            model={row.master_id: _model(row) for row in masters},
            changes=_changes(folded, messages),
            dead_letters=_dead_letters(folded, messages),
            outcomes=_outcomes(folded, messages),
            ahead=() if last else tuple(classified.groups),
            completes=len(messages) if last else None,
        )

    def parts(
        self,
        messages: Sequence[LandedMessage],
        ahead: Iterable[str] = (),
        *,
        prioritize: bool = True,
    ) -> Iterator[GroupCommit]:
        """The commits for `messages` (as `fold`), in parts when a priority is set and
        `prioritize`: one `ahead` part per priority class that has masters in the stretch,
        earliest first, then the rest with the messages as a whole, which moves the position.
        `ahead`: masters whose items in the stretch an interrupted earlier try already committed
        (skipped). Commit each part and call `committed` before taking the next, which folds
        onto the cache."""
        classified = self._classified(messages, frozenset(ahead))
        priority = self.options.priority
        if priority is None or not prioritize:
            yield self._part(classified, messages, last=True)
            return
        before = self._states(classified.groups.keys())
        *first, rest = priority.order(classified.groups, lambda i: _document(before.get(i)))
        for master_ids in first:
            if master_ids:
                yield self._part(classified.part(master_ids, whole_messages=False), messages)
        yield self._part(classified.part(rest, whole_messages=True), messages, last=True)

    def _classified(
        self,
        messages: Sequence[LandedMessage],
        ahead: frozenset[str],
        also_seen: Mapping[str, int] | None = None,
    ) -> ClassifiedStretch:
        if not messages:
            raise ValueError("nothing to fold: a stretch has at least one message")
        options = self.options
        logged = [landed.message for landed in messages]
        ids = {message.message_id for message in logged}
        # The earlier copies in the window of the stretch's first message (a superset of each
        # later message's window; the rule decides per message).
        since = options.window.oldest(messages[0].position.batch_seq)
        copies = Copies(options.window, self.store.latest_copies(ids, since))
        for message_id, batch_seq in (also_seen or {}).items():
            if message_id in ids:
                copies.add(message_id, batch_seq)
        classified = classify_stretch(
            logged,
            copies,
            limits=options.limits,
            redelivery_limit=options.redelivery_limit,
            classify=self._classify,
        )
        if not ahead:
            return classified
        return classified.part(
            [i for i in classified.groups if i not in ahead], whole_messages=True
        )

    def _part(
        self,
        classified: ClassifiedStretch,
        messages: Sequence[LandedMessage],
        *,
        last: bool = False,
    ) -> GroupCommit:
        """The commit of `classified`'s masters, folded here and now (see `complete`)."""
        return self.complete(self.launch(classified, messages), last=last)

    def _shared(
        self,
        groups: dict[str, list[Item]],
        before: dict[str, MasterState],
        own_share: float | None = None,
    ) -> SharedFold | None:
        """The workers' share of a long stretch's fold (sis_platform/live/workers.py); None:
        this process folds it all."""
        if self._workers is None or self._budget is None or self._fold is None:
            return None
        if len(groups) < 2 or sum(map(len, groups.values())) < PARALLEL_MIN_ITEMS:
            return None
        if not self._workers.ready():
            return None  # starting: this stretch is folded here
        return SharedFold(self._fold, self._budget, self._workers, groups, before.get, own_share)

    def committed(self, group: GroupCommit) -> None:
        """The store has committed `group` (or commits it before it is read again, and this
        fold is dropped if it fails): the cache takes its masters' rows, all of them kept
        until the next stretch's are read."""
        for row in group.masters:
            self._cache[row.master_id] = row
            self._cache.move_to_end(row.master_id)
        self._evict(keep=len(group.masters))

    def forget(self) -> None:
        """Drop the cache (e.g. when the store may have changed behind this process)."""
        self._cache.clear()

    def _rows(self, ids: Iterable[str]) -> dict[str, MasterRow]:
        return {i: row for i in ids if (row := self._cache.get(i)) is not None}

    def _states(self, ids: Iterable[str]) -> dict[str, MasterState]:
        """The stored state of each of `ids` the store holds, loading the cache's misses."""
        wanted = list(ids)
        misses = [i for i in wanted if i not in self._cache]
        if misses:
            loaded = self.store.masters_state(misses)
            for master_id in misses:
                self._cache[master_id] = loaded.get(master_id)
        for master_id in wanted:
            self._cache.move_to_end(master_id)
        states = {}
        for master_id in wanted:
            row = self._cache[master_id]
            if row is not None:
                states[master_id] = MasterState(
                    master_id, row.version, row.document, row.stale, row.filtered
                )
        # The stretch's own masters (at the end now) stay until `committed` replaces them.
        self._evict(keep=len(wanted))
        return states

    def _evict(self, keep: int = 0) -> None:
        while len(self._cache) > max(self.options.max_masters, keep):
            self._cache.popitem(last=False)


@dataclass
class LaunchedFold:
    """A stretch whose fold is under way (`LiveFold.launch`): classified, its masters' states
    read, the workers' shares sent and sis-live's own folded."""

    classified: ClassifiedStretch
    messages: Sequence[LandedMessage]
    before: dict[str, MasterState]
    shared: SharedFold | None

    @property
    def end(self) -> LogPosition:
        return self.messages[-1].position

    @property
    def with_workers(self) -> bool:
        """Whether workers fold part of it (else `complete` folds it all)."""
        return self.shared is not None

    @property
    def copies(self) -> dict[str, int]:
        """Its message ids, each with the batch of its last copy here."""
        return {landed.message.message_id: landed.position.batch_seq for landed in self.messages}

    def abandon(self) -> None:
        """Take the workers' replies not taken (none is left in a pipe for the next stretch);
        safe to call twice."""
        shared, self.shared = self.shared, None
        if shared is not None:
            shared.close()


def _document(state: MasterState | None) -> bytes | None:
    return state.document if state is not None else None


def _changed_masters(
    folded: FoldedStretch, before: dict[str, MasterState], rows: dict[str, MasterRow]
) -> list[MasterRow]:
    """A row per folded master whose state changed and that the reference keeps (it exists,
    is stale or is filtered; an orphan update leaves no master), with the message id of its
    last version."""
    last_message: dict[str, str] = {}
    for entry in folded.versions:
        last_message[entry.value.master_id] = entry.value.message_id
    changed = []
    for master_id, state in folded.states.items():
        if not (state.exists or state.stale or state.filtered):
            continue
        if before.get(master_id) == state:
            continue
        previous = rows.get(master_id)
        message_id = last_message.get(master_id, previous.message_id if previous else None)
        changed.append(
            MasterRow(
                master_id=master_id,
                version=state.version,
                document=state.document,
                message_id=message_id,
                stale=state.stale,
                filtered=state.filtered,
            )
        )
    return changed


def _model(row: MasterRow) -> Interpretation | None:
    """The master's model rows; None removes them (no document, or filtered: the lake's model
    reads only `document IS NOT NULL AND NOT filtered`)."""
    if row.document is None or row.filtered:
        return None
    try:
        return interpret(row.master_id, row.document)
    except Exception:
        # The fold only keeps valid events, so this is a bug in reading one master: it must
        # not stop the live path for every other master. The lake records it in
        # model_failures; here the master is left out of the model and logged.
        log.exception(
            "cannot interpret master %s version %d",
            row.master_id,
            row.version,
            extra=concerning(master_id=row.master_id),
        )
        return None


def _changes(folded: FoldedStretch, messages: Sequence[LandedMessage]) -> list[ChangeRow]:
    rows = []
    for entry in folded.versions:
        version, landed = entry.value, messages[entry.offset]
        rows.append(
            ChangeRow(
                master_id=version.master_id,
                version=version.version,
                message_id=version.message_id,
                position=version.position,
                batch_seq=landed.position.batch_seq,
                msg_seq=landed.position.msg_seq,
                put_time=landed.put_time,
                operation=version.operation,
                document_sha256=hashlib.sha256(version.document).hexdigest(),
            )
        )
    return rows


def _dead_letters(folded: FoldedStretch, messages: Sequence[LandedMessage]) -> list[DeadLetterRow]:
    rows = []
    for entry in folded.dead_letters:
        dead, landed = entry.value, messages[entry.offset]
        rows.append(
            DeadLetterRow(
                message_id=dead.message_id,
                master_id=dead.master_id,
                position=dead.position,
                reason=str(dead.reason),
                detail=dead.detail,
                batch_seq=landed.position.batch_seq,
                msg_seq=landed.position.msg_seq,
                body=dead.body,
            )
        )
    return rows


def _outcomes(folded: FoldedStretch, messages: Sequence[LandedMessage]) -> list[OutcomeRow]:
    rows = []
    for entry in folded.results:
        result, landed = entry.value, messages[entry.offset]
        rows.append(
            OutcomeRow(
                message_id=result.message_id,
                batch_seq=landed.position.batch_seq,
                msg_seq=landed.position.msg_seq,
                position=entry.position,
                master_id=result.master_id if isinstance(result, ItemResult) else None,
                outcome=str(result.outcome),
                reason=None if result.reason is None else str(result.reason),
            )
        )
    return rows
