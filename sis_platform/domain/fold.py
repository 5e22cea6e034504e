"""The reference fold: one master's items, in feed order, applied to its state.

This is the oracle. The Spark fold groups items by master id, sorts each group by (landing
order, position) and calls `fold_master` on it; the serial `ReferencePipeline` does the same,
so both produce the same states, versions and results (docs/design.md, invariant 3).

Rules (docs/feed.md, "Master messages", "Update messages", "Invalid items and poison
messages"), and the decisions taken where the contract is silent:

- A master `new` creates the document. A `new` for a master that already exists replaces it as
  a refresh would and is applied with the warning "new-for-existing".
- A master `refresh` replaces the document whole. A `refresh` for a master that does not exist
  (decision) creates it, applied with the warning "refresh-for-missing": dropping the only
  full copy of a master the provider sent would turn every later update into an orphan.
- Either clears the stale mark (and the filtered mark, see below). Master items were
  validated when their message was classified and are not validated again.
- An update for a master that does not exist is dead-lettered `orphan-update`.
- An update for a stale master is dead-lettered `master-stale` and not applied.
- An update applies its operations to the current document atomically (the parsed working
  tree is patched in place and dropped on failure; the stored bytes stay). A failed operation
  dead-letters the item with the RFC 5261 error name as its reason; a result that is not a
  valid standalone `event` (event schema), or whose `event/@id` is no longer the master id
  (decision: the id is the key, a patch may not move a document to another key), is
  dead-lettered `invalid-result`. Either way the master is unchanged and marked stale: it has
  missed an update, so later updates would apply to the wrong base.
- A result over a structural bound of `limits` (more than `max_elements` nodes, deeper than
  `max_depth`, an element with more than `max_attributes` attributes, `max_namespaces`
  namespace declarations or `max_children` children, more than `max_document_namespaces`
  declarations in all) is dead-lettered `too-complex` the same way, before it is validated:
  each update is bounded by its message's bounds, but many updates could grow a master
  without end.
- Each applied item advances the version by one (the first version is 1) and produces one
  `MasterVersion` with the full document.

Selector (optional; a JMS message selector over `items.selectable_properties`):
- A master item is tested on its own event's attributes. Not selected: outcome `filtered`,
  not applied, and the master is marked filtered (its version and document stay as they were).
- An update item for a filtered master is `filtered` (not an orphan, not stale): the
  consumer chose not to carry that master. This lasts until a selected master item arrives.
- Otherwise an update for an existing master is tested on the master's current event
  attributes; not selected: `filtered`, not applied, and (decision) the master is not marked
  stale, since skipping it was asked for. The selector is tested before the stale check, as a
  broker-side selector would never have delivered the item at all.
- An update for a master that does not exist (and is not filtered) is `orphan-update` without
  testing the selector: there are no event attributes to test, and an orphan must be visible.
- JMSMessageID is the item's message id. JMSXDeliveryCount and JMSRedelivered are not given
  to the selector here (decision): the fold is a pure function of the logged message ids and
  bytes, and which copy of a redelivered message landed first must not change what is
  selected.

Performance: within one call the current document is kept parsed across the group's items and
serialized once per produced version; master payloads are only parsed when something needs
the tree. A patched result is validated only where the update can have changed it
(sis_platform.domain.patchscope proves which parts; the outcome is the same as validating the
whole event). The structural bounds are checked the same way: the fold keeps an upper bound
of the master's node count (a document of n bytes has at most n/4 nodes, `<a/>` being the
smallest), adds the nodes of each changed region, and walks only the changed regions; it
walks the whole master only when the scope is not proved or the running bound passes
`max_elements` (the walk then gives the exact count). Compiled updates are cached per message
payload in a `PatchCache`, which the caller should keep across calls (one update message
applies to several masters, in several groups).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from lxml import etree

from sis_platform.domain.items import Item, selectable_properties, serialize
from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.domain.messages import (
    InvalidMessage,
    count_nodes,
    limit_detail,
    parse_xml,
    subtree_events,
)
from sis_platform.domain.patchscope import (
    PatchScope,
    patch_scope,
    region_elements,
    validate_patched,
)
from sis_platform.domain.reasons import Outcome, Reason
from sis_platform.standards.xmlpatch import Patch, PatchError

WARNING_NEW_FOR_EXISTING = "new-for-existing"
WARNING_REFRESH_FOR_MISSING = "refresh-for-missing"

# The fewest bytes a node takes in a serialized document (`<a/>`), so a document of n bytes has
# at most n // 4 nodes: the fold's first bound on a master's size, before any walk.
_MIN_NODE_BYTES = 4


class ItemSelector(Protocol):
    """What the fold needs of a compiled selector (sis_platform.standards.selector.Selector)."""

    def matches(self, props: Mapping[str, object]) -> bool: ...


@dataclass(frozen=True)
class MasterState:
    """A master's current state. Version 0 with no document: the master does not exist."""

    master_id: str
    version: int
    document: bytes | None
    stale: bool = False
    filtered: bool = False

    @property
    def exists(self) -> bool:
        return self.document is not None


@dataclass(frozen=True)
class MasterVersion:
    master_id: str
    version: int
    message_id: str
    position: int
    operation: str  # "new" | "refresh" | "update"
    document: bytes


@dataclass(frozen=True)
class ItemResult:
    message_id: str
    position: int
    master_id: str
    outcome: Outcome
    version: int | None  # the version the item produced, when applied
    reason: Reason | None  # why it was dead-lettered
    detail: str | None
    warning: str | None  # applied with a warning, e.g. "new-for-existing"


@dataclass(frozen=True)
class MasterFoldResult:
    state: MasterState
    versions: list[MasterVersion] = field(default_factory=list)
    results: list[ItemResult] = field(default_factory=list)


@dataclass(frozen=True)
class CompiledUpdate:
    """An update payload made ready to apply: the compiled patch and the parts of a master it
    can change (None: validate the whole result)."""

    patch: Patch
    scope: PatchScope | None


# The payload bytes a PatchCache keeps compiled: the feed's update payloads are a few KB at most
# (27.6 KB the largest), so this holds thousands of them; what it keeps compiled (the parsed
# operations and their content) is a small multiple of it.
PATCH_CACHE_BYTES = 16 * 1024 * 1024


class PatchCache:
    """Compiled updates by payload (bounded, least recently used out).

    Keyed by the payload bytes: every item of one update message shares the same bytes, and
    bytes cache their hash, so a hit costs one dict lookup. A payload whose operations do not
    compile caches its PatchError, so each of its items fails the same way. Selectors are held
    to `limits` (a selector over them is the PatchError `too-complex`).

    Bounded in entries (`maxsize`) and in payload bytes (`max_bytes`): a payload may be as large
    as a message (4 MiB), so entries alone would let 4,096 of them keep 16 GiB. The newest entry
    is always kept, even alone over the byte budget: the items of one message follow each other
    and each must find its update compiled.
    """

    def __init__(
        self,
        limits: Limits = DEFAULT_LIMITS,
        maxsize: int = 4096,
        max_bytes: int = PATCH_CACHE_BYTES,
    ) -> None:
        self.limits = limits
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self.bytes = 0  # the payload bytes of the entries kept
        self._entries: OrderedDict[bytes, CompiledUpdate | PatchError] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, payload: bytes) -> CompiledUpdate:
        """The compiled form of an update item's payload; raises PatchError."""
        entry = self._entries.get(payload)
        if entry is None:
            entry = self._compile(payload)
            self._keep(payload, entry)
        else:
            self._entries.move_to_end(payload)
        if isinstance(entry, PatchError):
            raise entry
        return entry

    def _keep(self, payload: bytes, entry: CompiledUpdate | PatchError) -> None:
        self._entries[payload] = entry
        self.bytes += len(payload)
        while len(self._entries) > 1 and (
            len(self._entries) > self.maxsize or self.bytes > self.max_bytes
        ):
            oldest, _ = self._entries.popitem(last=False)
            self.bytes -= len(oldest)

    def _compile(self, payload: bytes) -> CompiledUpdate | PatchError:
        operations = parse_xml(payload)
        try:
            patch = Patch.from_element(operations, self.limits)
        except PatchError as error:
            return error
        return CompiledUpdate(patch, patch_scope(operations, self.limits))


def _result(
    item: Item,
    outcome: Outcome,
    *,
    version: int | None = None,
    reason: Reason | None = None,
    detail: str | None = None,
    warning: str | None = None,
) -> ItemResult:
    return ItemResult(
        message_id=item.message_id,
        position=item.position,
        master_id=item.master_id,
        outcome=outcome,
        version=version,
        reason=reason,
        detail=detail,
        warning=warning,
    )


def fold_master(
    master_id: str,
    state: MasterState | None,
    items: Sequence[Item],
    *,
    selector: ItemSelector | None = None,
    patches: PatchCache | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> MasterFoldResult:
    """Apply `items` (all for `master_id`, in feed order) to `state` (None: no state yet);
    a patched master over a structural bound of `limits` is dead-lettered `too-complex`."""
    if state is None:
        state = MasterState(master_id=master_id, version=0, document=None)
    elif state.master_id != master_id:
        raise ValueError(f"state is for {state.master_id!r}, not {master_id!r}")
    if patches is None:
        patches = PatchCache(limits)
    fold = _MasterFold(state, selector, patches, limits)
    for item in items:
        if item.master_id != master_id:
            raise ValueError(f"item {item.message_id}/{item.position} is not for {master_id!r}")
        if item.category == "master":
            fold.master_item(item)
        elif item.category == "update":
            fold.update_item(item)
        else:
            raise ValueError(f"item {item.message_id}/{item.position}: {item.category!r}")
    return fold.result()


ItemKey = tuple[str, int]  # (message id, position)
PartFold = Callable[[MasterState, list[Item]], MasterFoldResult]


def fold_skipping(
    master_id: str,
    state: MasterState | None,
    items: list[Item],
    timed_out: Mapping[ItemKey, str],
    fold: PartFold,
) -> MasterFoldResult:
    """`fold` (fold_master, as its caller guards it) over the items, except those that overran
    the per-item budget in an earlier attempt (`timed_out`: item -> dead letter detail): each
    is dead-lettered `too-complex` without being folded and, like any item not applied, leaves
    an existing master stale (it missed an update). The items on either side of one are folded
    in order, each run from the state the previous left. Shared by the lake's fold workers and
    sis-live, so both end the same."""
    current = state or MasterState(master_id=master_id, version=0, document=None)
    if not timed_out:
        return fold(current, items)
    versions: list[MasterVersion] = []
    results: list[ItemResult] = []
    pending: list[Item] = []
    for item in [*items, None]:
        detail = None if item is None else timed_out.get((item.message_id, item.position))
        if item is not None and detail is None:
            pending.append(item)
            continue
        if pending:
            part = fold(current, pending)
            versions += part.versions
            results += part.results
            current, pending = part.state, []
        if item is not None:
            results.append(
                _result(item, Outcome.DEAD_LETTERED, reason=Reason.TOO_COMPLEX, detail=detail)
            )
            current = replace(current, stale=current.stale or current.exists)
    return MasterFoldResult(state=current, versions=versions, results=results)


class _MasterFold:
    """One call of `fold_master`: the master's state as its items are applied one by one, and
    the versions and results so far."""

    def __init__(
        self,
        state: MasterState,
        selector: ItemSelector | None,
        patches: PatchCache,
        limits: Limits,
    ) -> None:
        self.state = state
        self.master_id = state.master_id
        self.selector = selector
        self.patches = patches
        self.limits = limits
        self.version = state.version
        self.document = state.document
        self.stale = state.stale
        self.filtered = state.filtered
        # The parsed form of `document`, built on first need and then kept across the group.
        self.tree: etree._ElementTree | None = None
        # An upper bound of the nodes in `document` (exact after a walk of the whole master).
        self.nodes_at_most = 0 if self.document is None else len(self.document) // _MIN_NODE_BYTES
        self.versions: list[MasterVersion] = []
        self.results: list[ItemResult] = []

    def result(self) -> MasterFoldResult:
        final = replace(
            self.state,
            version=self.version,
            document=self.document,
            stale=self.stale,
            filtered=self.filtered,
        )
        return MasterFoldResult(state=final, versions=self.versions, results=self.results)

    def _applied(self, item: Item, operation: str, warning: str | None = None) -> None:
        """`document` is the item's result: a new version."""
        assert self.document is not None
        self.version += 1
        self.versions.append(
            MasterVersion(
                master_id=self.master_id,
                version=self.version,
                message_id=item.message_id,
                position=item.position,
                operation=operation,
                document=self.document,
            )
        )
        self.results.append(_result(item, Outcome.APPLIED, version=self.version, warning=warning))

    def _not_applied(
        self, item: Item, outcome: Outcome, detail: str, reason: Reason | None = None
    ) -> None:
        self.results.append(_result(item, outcome, reason=reason, detail=detail))

    def _failed(self, item: Item, reason: Reason, detail: str | None) -> None:
        """The update failed: the master is unchanged and stale (it missed an update); the
        tree, which the failure may have left half patched, is dropped."""
        self.tree = None
        self.stale = True
        self.results.append(_result(item, Outcome.DEAD_LETTERED, reason=reason, detail=detail))

    def master_item(self, item: Item) -> None:
        if item.type not in ("new", "refresh"):
            raise ValueError(f"master item {item.message_id}/{item.position}: {item.type!r}")
        event_tree: etree._ElementTree | None = None
        if self.selector is not None:
            event_tree = parse_xml(item.payload).getroottree()
            properties = selectable_properties(item, event_tree.getroot().attrib)
            if not self.selector.matches(properties):
                self.filtered = True
                self._not_applied(item, Outcome.FILTERED, "master not selected")
                return
        warning = None
        if item.type == "new" and self.document is not None:
            warning = WARNING_NEW_FOR_EXISTING
        elif item.type == "refresh" and self.document is None:
            warning = WARNING_REFRESH_FOR_MISSING
        self.document = item.payload
        self.nodes_at_most = len(self.document) // _MIN_NODE_BYTES
        self.tree = event_tree
        self.stale = False
        self.filtered = False
        self._applied(item, item.type, warning)

    def update_item(self, item: Item) -> None:
        if self.filtered:
            self._not_applied(item, Outcome.FILTERED, "master filtered")
            return
        if self.document is None:
            detail = f"master {self.master_id!r} does not exist"
            self._not_applied(item, Outcome.DEAD_LETTERED, detail, Reason.ORPHAN_UPDATE)
            return
        if self.selector is not None:
            if self.tree is None:
                self.tree = parse_xml(self.document).getroottree()
            if not self.selector.matches(selectable_properties(item, self.tree.getroot().attrib)):
                self._not_applied(item, Outcome.FILTERED, "update not selected")
                return
        if self.stale:
            detail = f"master {self.master_id!r} is stale since a failed update"
            self._not_applied(item, Outcome.DEAD_LETTERED, detail, Reason.MASTER_STALE)
            return
        self._patch(item)

    def _patch(self, item: Item) -> None:
        """Apply an update to the current document (it exists and is neither stale nor
        filtered)."""
        assert self.document is not None
        if self.tree is None:
            self.tree = parse_xml(self.document).getroottree()
        try:
            update = self.patches.get(item.payload)
            # The fold owns `tree` (parsed here, or an earlier result), so it is patched in
            # place rather than copied; after a failure it is dropped and, if needed again,
            # parsed from `document`, the bytes of the last version, which the failure left
            # as they were.
            located: dict[str, list[etree._Element]] = {}
            patched = update.patch.apply_in_place(self.tree, located)
        except PatchError as error:
            self._failed(item, Reason(error.error), error.detail)
            return
        bounded = _bounded_result(patched, update.scope, located, self.nodes_at_most, self.limits)
        if isinstance(bounded, str):
            self._failed(item, Reason.TOO_COMPLEX, bounded)
            return
        invalid = _invalid_result(self.master_id, patched, update.scope, located)
        if invalid is not None:
            self._failed(item, Reason.INVALID_RESULT, invalid)
            return
        self.tree = patched
        self.document = serialize(patched)
        self.nodes_at_most = bounded
        self._applied(item, "update")


def _bounded_result(
    patched: etree._ElementTree,
    scope: PatchScope | None,
    located: dict[str, list[etree._Element]],
    nodes_at_most: int,
    limits: Limits,
) -> int | str:
    """A new upper bound of the patched master's node count when it is within the structural
    bounds, else the too-complex detail. `nodes_at_most` bounds the master before the patch."""
    try:
        grown = None if scope is None else _scoped_growth(patched, scope, located, limits)
        if grown is not None and nodes_at_most + grown <= limits.max_elements:
            return nodes_at_most + grown
        return count_nodes(subtree_events(patched.getroot()), limits)
    except InvalidMessage as error:
        return f"the patched master has {error.detail}"


def _scoped_growth(
    patched: etree._ElementTree,
    scope: PatchScope,
    located: dict[str, list[etree._Element]],
    limits: Limits,
) -> int | None:
    """The nodes now in the patch's deep regions (each walked against the bounds; raises
    InvalidMessage), after checking the attributes of its shallow regions; None when a region
    does not resolve to one element (the scope's proof does not hold: walk the whole).

    Only these parts can have changed (patchscope), so the master stays within `max_depth`,
    `max_attributes` and `max_children` exactly when they do; its node count grew by at most
    the regions' nodes now (whatever they held before is still counted: an upper bound). A
    scoped patch adds no namespace declaration: a shallow region only gets unprefixed
    attributes, and content that declares or uses a namespace has no scope (the whole master
    is counted, `max_document_namespaces` with it).
    """
    for path in scope.shallow:
        found = region_elements(patched, path, located)
        if len(found) != 1:
            return None
        attributes = len(found[0].attrib)
        if attributes > limits.max_attributes:
            raise InvalidMessage(
                Reason.TOO_COMPLEX,
                limit_detail(
                    f"<{found[0].tag}> with {attributes} attributes", "max_attributes", limits
                ),
            )
    grown = 0
    for path in scope.deep:
        found = region_elements(patched, path, located)
        if len(found) != 1:
            return None
        grown += count_nodes(subtree_events(found[0]), limits, depth=len(path))
    return grown


def _invalid_result(
    master_id: str,
    patched: etree._ElementTree,
    scope: PatchScope | None,
    located: dict[str, list[etree._Element]],
) -> str | None:
    error = validate_patched(patched, scope, located)
    if error is not None:
        return error
    event_id = patched.getroot().get("id")
    if event_id != master_id:
        return f"the patch changed event/@id from {master_id!r} to {event_id!r}"
    return None
