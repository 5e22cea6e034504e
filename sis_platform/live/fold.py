"""sis-live's fold stage: a classified stretch folded in memory into what the store commits.

The fourth of the live path's stages (docs/live.md, "The stages"): gather and land
(`service.py`), classify (`classify.py`), fold (here), commit (`applier.py`). Each master's
items are folded with the reference pipeline's own loop (`fold_stretch` in
sis_platform/domain/pipeline.py: `fold_master` per master in feed order with one `PatchCache`),
onto the master's state before the stretch, and turned into a `GroupCommit` (`commits.py`). So
the store ends with exactly the masters, versions, dead letters and outcomes of
`ReferencePipeline` over the same log (docs/design.md, invariants 2-4 and 7).

Two variations of the one stage, not round trips through others:
- **workers** (`workers.py`): a long stretch's masters are shared with fold worker processes;
  `launch` sends their shares and folds sis-live's own, `complete` takes their replies. Between
  the two, sis-live may land and classify the next stretch (the applier's pipelined groups).
- **priority parts** (`parts`, with `SIS_PRIORITY`): one commit per priority class that has
  masters in the stretch, earliest first, then the rest, which moves the store's position.

Masters are cached in memory, at most `max_masters` (least recently used out). A miss is loaded
from the store, one `masters_state` call per stretch for all of them; a master the store does
not hold is cached as absent. The cache takes a commit's master rows when the commit is made
(`complete`), so that the next stretch (or part) folds onto them before the store has committed
them, as a pipelined group's must. The applier drops the whole stage, cache and all, whenever a
commit fails (it may or may not have happened), so the cache never holds what the store does
not, and an eviction loses nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sis_platform.domain.fold import MasterState, PatchCache
from sis_platform.domain.items import Item
from sis_platform.domain.pipeline import MasterFolder, fold_stretch
from sis_platform.live.classify import Classified
from sis_platform.live.commits import group_commit
from sis_platform.live.config import FoldOptions
from sis_platform.live.workers import PARALLEL_MIN_ITEMS, FoldWorkers, SharedFold
from sis_platform.log.landing import LogPosition
from sis_platform.serving.records import GroupCommit, MasterRow

if TYPE_CHECKING:
    from sis_platform.live.budget import LiveBudget


class FoldStore(Protocol):
    """What the fold stage reads of the serving store (sis_platform.serving.ServingWriter)."""

    def masters_state(self, ids: Iterable[str]) -> dict[str, MasterRow]: ...


class Fold:
    """The fold stage (see the module docstring): `fold(classified)` for one commit, or
    `launch` and `complete` around other work, or `parts` with a priority. With `budget`, each
    master's fold runs under the per-item budget and the failures of earlier processes are
    honoured (sis_platform/live/budget.py)."""

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
        self._fold: MasterFolder | None = None
        if budget is not None:
            self._fold = budget.folder(
                selector=options.selector, patches=self._patches, limits=options.limits
            )
        # master id -> its row as last committed, or None: the store has no row for it.
        self._cache: OrderedDict[str, MasterRow | None] = OrderedDict()

    @property
    def cached(self) -> int:
        """How many masters (present or known absent) are held in memory."""
        return len(self._cache)

    def __call__(self, classified: Classified) -> GroupCommit:
        """The commit of `classified` (the stretch right after the last one folded here, or
        after the store's position), in one part, folded here and now."""
        return self.complete(self.launch(classified))

    def launch(self, classified: Classified, *, own_share: float | None = None) -> LaunchedFold:
        """Start folding `classified`: the workers' shares sent and sis-live's own share
        (`own_share` of the items; None: an equal share) folded. `complete` gives the commit."""
        before = self._states(classified.master_ids)
        shared = self._shared(classified.stretch.groups, before, own_share)
        launched = LaunchedFold(classified, before, shared)
        if shared is not None:
            try:
                shared.fold_own()
            except BaseException:
                launched.abandon()
                raise
        return launched

    def complete(self, launched: LaunchedFold, *, last: bool = True) -> GroupCommit:
        """The commit of a launched fold (waiting for the workers' shares), whose master rows
        the cache takes now (module docstring). The `last` part of a stretch also takes its
        messages as a whole and completes every message of it (some may have had all their
        items committed in earlier parts, even by an interrupted earlier try)."""
        options = self.options
        classified, before = launched.classified, launched.before
        try:
            folded = fold_stretch(
                classified.stretch,
                before.get,
                selector=options.selector,
                patches=self._patches,
                limits=options.limits,
                fold=launched.shared or self._fold,
            )
        finally:
            launched.abandon()
        rows = {i: row for i in classified.master_ids if (row := self._cache.get(i)) is not None}
        ahead = None if last else classified.master_ids
        commit = group_commit(folded, classified.messages, before, rows, ahead=ahead)
        self._took(commit)
        return commit

    def parts(self, classified: Classified, *, prioritize: bool = True) -> Iterator[GroupCommit]:
        """The commits of `classified`: with a priority set and `prioritize`, one part per
        priority class that has masters in the stretch, earliest first, then the rest with the
        messages as a whole, which moves the position; else one. Each part is folded when
        asked for: commit it before taking the next."""
        priority = self.options.priority
        if priority is None or not prioritize:
            yield self(classified)
            return
        before = self._states(classified.master_ids)
        *first, rest = priority.order(classified.stretch.groups, lambda i: _document(before.get(i)))
        for master_ids in first:
            if master_ids:
                part = classified.part(master_ids, whole_messages=False)
                yield self.complete(self.launch(part), last=False)
        yield self(classified.part(rest, whole_messages=True))

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

    def _took(self, commit: GroupCommit) -> None:
        """The cache takes `commit`'s master rows, all of them kept until the next stretch's
        are read."""
        for row in commit.masters:
            self._cache[row.master_id] = row
            self._cache.move_to_end(row.master_id)
        self._evict(keep=len(commit.masters))

    def forget(self) -> None:
        """Drop the cache (e.g. when the store may have changed behind this process)."""
        self._cache.clear()

    def _states(self, ids: Iterable[str]) -> dict[str, MasterState]:
        """The state of each of `ids` the store holds, loading the cache's misses."""
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
        # The stretch's own masters (at the end now) stay until its commit replaces them.
        self._evict(keep=len(wanted))
        return states

    def _evict(self, keep: int = 0) -> None:
        while len(self._cache) > max(self.options.max_masters, keep):
            self._cache.popitem(last=False)


@dataclass
class LaunchedFold:
    """A stretch whose fold is under way (`Fold.launch`): classified, its masters' states
    read, the workers' shares sent and sis-live's own folded."""

    classified: Classified
    before: dict[str, MasterState]
    shared: SharedFold | None

    @property
    def end(self) -> LogPosition:
        return self.classified.end

    @property
    def with_workers(self) -> bool:
        """Whether workers fold part of it (else `complete` folds it all)."""
        return self.shared is not None

    def abandon(self) -> None:
        """Take the workers' replies not taken (none is left in a pipe for the next stretch);
        safe to call twice."""
        shared, self.shared = self.shared, None
        if shared is not None:
            shared.close()


def _document(state: MasterState | None) -> bytes | None:
    return state.document if state is not None else None
