"""The reference pipeline: the message log in landing order to masters, versions and dead
letters, serially, in plain Python (docs/feed.md; docs/design.md, invariants 2-4).

Per message, in this order:

1. A message id with an earlier copy in the dedup window before it (`dedup.py`: its batch or
   the SIS_DEDUP_WINDOW_BATCHES batches before) is a `duplicate`: recorded, nothing else
   (whatever became of the earlier copy, even a dead letter; an update is never applied twice).
2. Delivered more than `redelivery_limit` times: dead-lettered `redelivery-limit`.
3. Invalid as a whole (messages.parse_message), or too costly to split (items.split_message,
   `too-complex`): dead-lettered with its reason; the dead letter has no master id or position.
4. Otherwise split into items, and each item folded into its master (fold.fold_master); the
   items of a message are applied in id order, each master independently.

Every message ends accounted for in `results`: one `MessageResult` (duplicate or
dead-lettered as a whole) or one `ItemResult` per listed id (applied, filtered or
dead-lettered). Every dead letter, message or item, keeps the original body.

The Spark implementation reproduces this exactly by: a dedupe by message id over the window,
the nearest earlier copy in landing order deciding, `classify_message` per remaining message,
and `fold_master` per master id over its items sorted by (landing order, position), starting
from the stored state.
`process` itself works that way on each batch it is given (classify all, then fold per master),
so a batch keeps each master parsed across its items; results are then put back in feed
order. Its two halves, `classify_stretch` and `fold_stretch`, are the loop sis-live's
in-memory fold runs too (sis_platform/live/fold.py), with the earlier copies and the
masters' states taken from its serving store instead of held here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Generic, NamedTuple, TypeVar

from sis_platform.domain.dedup import DEFAULT_DEDUP_WINDOW, Copies, DedupWindow
from sis_platform.domain.fold import (
    ItemResult,
    ItemSelector,
    MasterFoldResult,
    MasterState,
    MasterVersion,
    PatchCache,
    fold_master,
)
from sis_platform.domain.items import Item, split_message
from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.domain.messages import InvalidMessage, parse_message
from sis_platform.domain.reasons import Outcome, Reason

DEFAULT_REDELIVERY_LIMIT = 5

T = TypeVar("T", covariant=True)


@dataclass(frozen=True)
class LoggedMessage:
    """One message as landed: MQ message id, body bytes, and JMSXDeliveryCount.

    A body over the size bound never enters a landing batch: intake moves it aside and logs the
    message with an empty body, its real size in `body_size` and where its bytes are in
    `body_location`; such a message is dead-lettered `too-large`.
    """

    message_id: str
    body: bytes
    delivery_count: int = 1
    body_size: int | None = None
    body_location: str | None = None
    # The landing batch it is in (its place in the log, which the dedup window counts in);
    # 0: a message not landed (a test's), in the window of every other.
    batch_seq: int = 0


@dataclass(frozen=True)
class DeadLetter:
    """A dead-lettered message (master_id and position None) or item."""

    message_id: str
    master_id: str | None
    position: int | None
    reason: Reason
    detail: str
    body: bytes


@dataclass(frozen=True)
class MessageResult:
    """The outcome of a message as a whole: `duplicate`, or `dead-lettered` before splitting."""

    message_id: str
    outcome: Outcome
    reason: Reason | None
    detail: str | None


def classify_message(
    message: LoggedMessage,
    *,
    limits: Limits = DEFAULT_LIMITS,
    redelivery_limit: int = DEFAULT_REDELIVERY_LIMIT,
) -> list[Item] | DeadLetter:
    """The items of a (deduplicated) message, or its dead letter (steps 2-4 above)."""
    if message.delivery_count > redelivery_limit:
        return whole_message_dead_letter(
            message,
            Reason.REDELIVERY_LIMIT,
            f"delivered {message.delivery_count} times, "
            f"over the redelivery limit of {redelivery_limit}",
        )
    if message.body_location is not None:
        return whole_message_dead_letter(
            message,
            Reason.TOO_LARGE,
            f"body is {message.body_size} bytes, over the limit of "
            f"{limits.max_message_bytes} (SIS_MAX_MESSAGE_BYTES); moved aside at intake to "
            f"{message.body_location}",
        )
    try:
        parsed = parse_message(message.body, limits=limits)
        return split_message(message.message_id, parsed, limits=limits)
    except InvalidMessage as error:
        return whole_message_dead_letter(message, error.reason, error.detail)


def whole_message_dead_letter(message: LoggedMessage, reason: Reason, detail: str) -> DeadLetter:
    """A message dead-lettered before splitting: no master id, no position, its own bytes."""
    return DeadLetter(
        message_id=message.message_id,
        master_id=None,
        position=None,
        reason=reason,
        detail=detail,
        body=message.body,
    )


def valid_items_by_master(messages: Iterable[LoggedMessage]) -> dict[str, list[Item]]:
    """The valid items of the first copy of each message, per master id in feed order: what
    the fold folds once classification and dedupe are done (the benchmarks time the fold on
    it)."""
    seen: set[str] = set()
    groups: dict[str, list[Item]] = {}
    for message in messages:
        if message.message_id in seen:
            continue
        seen.add(message.message_id)
        classified = classify_message(message)
        if not isinstance(classified, DeadLetter):
            for item in classified:
                groups.setdefault(item.master_id, []).append(item)
    return groups


def message_result(dead_letter: DeadLetter) -> MessageResult:
    """The accounting record of a message dead-lettered as a whole."""
    return MessageResult(
        message_id=dead_letter.message_id,
        outcome=Outcome.DEAD_LETTERED,
        reason=dead_letter.reason,
        detail=dead_letter.detail,
    )


def duplicate_result(message_id: str) -> MessageResult:
    return MessageResult(
        message_id=message_id,
        outcome=Outcome.DUPLICATE,
        reason=None,
        detail="message id already in the log",
    )


def item_dead_letter(result: ItemResult, body: bytes) -> DeadLetter:
    """The dead letter of an item the fold dead-lettered; `body` is its message's body."""
    if result.outcome is not Outcome.DEAD_LETTERED or result.reason is None:
        raise ValueError(f"{result.message_id}/{result.position} was not dead-lettered")
    return DeadLetter(
        message_id=result.message_id,
        master_id=result.master_id,
        position=result.position,
        reason=result.reason,
        detail=result.detail or "",
        body=body,
    )


class InLog(NamedTuple, Generic[T]):
    """An entry of a stretch's output with its place in feed order: the offset of its message
    in the stretch and its position in the message (-1: the message as a whole)."""

    offset: int
    position: int
    value: T


@dataclass(frozen=True)
class ClassifiedStretch:
    """A stretch of the log deduplicated and classified: the valid items per master id in
    feed order, and what was decided per message as a whole (duplicates, dead letters)."""

    groups: dict[str, list[Item]]
    results: list[InLog[MessageResult]]
    dead_letters: list[InLog[DeadLetter]]
    index_of: dict[str, int]  # message id -> index in the stretch (first copies only)
    bodies: dict[str, bytes]  # message id -> body (first copies only)

    def part(self, master_ids: Iterable[str], *, whole_messages: bool) -> ClassifiedStretch:
        """The stretch with only the items of `master_ids`, and with what was decided per
        message as a whole only if `whole_messages`: folded part by part, the parts give
        what folding the whole gives (masters fold independently)."""
        return ClassifiedStretch(
            {master_id: self.groups[master_id] for master_id in master_ids},
            self.results if whole_messages else [],
            self.dead_letters if whole_messages else [],
            self.index_of,
            self.bodies,
        )


@dataclass(frozen=True)
class FoldedStretch:
    """A stretch folded: each folded master's state after it, and the versions, results and
    dead letters in feed order."""

    states: dict[str, MasterState]
    versions: list[InLog[MasterVersion]]
    results: list[InLog[ItemResult | MessageResult]]
    dead_letters: list[InLog[DeadLetter]]


class StretchBeyondWindow(ValueError):
    """A stretch holds two first copies of one message id, further apart than the dedup
    window: it must be classified and folded as two stretches, split at `index`."""

    def __init__(self, message_id: str, index: int) -> None:
        super().__init__(
            f"message {message_id} has a second first copy at offset {index} of the stretch: "
            "it spans more batches than the dedup window; fold it in two"
        )
        self.message_id = message_id
        self.index = index


# Classifies one first copy (steps 2-3), as `classify_message` does; sis-live passes one that
# guards it with the per-item budget (sis_platform/live/budget.py).
Classifier = Callable[[LoggedMessage], list[Item] | DeadLetter]
# Folds one master's items onto its state (step 4), as `fold_master` does; sis-live's guards it.
MasterFolder = Callable[[str, MasterState | None, list[Item]], MasterFoldResult]


def classify_stretch(
    messages: Iterable[LoggedMessage],
    copies: Copies,
    *,
    limits: Limits = DEFAULT_LIMITS,
    redelivery_limit: int = DEFAULT_REDELIVERY_LIMIT,
    classify: Classifier | None = None,
) -> ClassifiedStretch:
    """Steps 1-3 of the module docstring over the next messages of the log. `copies` holds the
    latest earlier copy of the message ids in the log (at least of those among `messages`, in
    their window); every copy here is added to it. `classify` replaces `classify_message`
    (same bounds)."""
    if classify is None:
        classify = partial(classify_message, limits=limits, redelivery_limit=redelivery_limit)
    results: list[InLog[MessageResult]] = []
    dead_letters: list[InLog[DeadLetter]] = []
    groups: dict[str, list[Item]] = {}
    index_of: dict[str, int] = {}
    bodies: dict[str, bytes] = {}
    for index, message in enumerate(messages):
        duplicate = copies.duplicate(message.message_id, message.batch_seq)
        copies.add(message.message_id, message.batch_seq)
        if duplicate:
            results.append(InLog(index, -1, duplicate_result(message.message_id)))
            continue
        if message.message_id in index_of:
            # Two first copies of one id: the stretch spans more batches than the window.
            # Results are keyed by message id, so such a stretch must be folded in two
            # (`ReferencePipeline.process` splits; sis-live's stretches are shorter than any
            # window settings allow).
            raise StretchBeyondWindow(message.message_id, index)
        classified = classify(message)
        if isinstance(classified, DeadLetter):
            results.append(InLog(index, -1, message_result(classified)))
            dead_letters.append(InLog(index, -1, classified))
            continue
        index_of[message.message_id] = index
        bodies[message.message_id] = message.body
        for item in classified:
            groups.setdefault(item.master_id, []).append(item)
    return ClassifiedStretch(groups, results, dead_letters, index_of, bodies)


def fold_stretch(
    classified: ClassifiedStretch,
    state_of: Callable[[str], MasterState | None],
    *,
    selector: ItemSelector | None = None,
    patches: PatchCache | None = None,
    limits: Limits = DEFAULT_LIMITS,
    fold: MasterFolder | None = None,
) -> FoldedStretch:
    """Step 4: each master's items folded onto its state before the stretch (`state_of`, None:
    no state), masters independently; everything put back in feed order. `fold` replaces
    `fold_master` with these options."""
    patches = patches if patches is not None else PatchCache(limits)
    if fold is None:
        fold = partial(fold_master, selector=selector, patches=patches, limits=limits)
    index_of, bodies = classified.index_of, classified.bodies
    states: dict[str, MasterState] = {}
    versions: list[InLog[MasterVersion]] = []
    results: list[InLog[ItemResult | MessageResult]] = list(classified.results)
    dead_letters = list(classified.dead_letters)
    for master_id, items in classified.groups.items():
        folded = fold(master_id, state_of(master_id), items)
        states[master_id] = folded.state
        for version in folded.versions:
            versions.append(InLog(index_of[version.message_id], version.position, version))
        for result in folded.results:
            index = index_of[result.message_id]
            results.append(InLog(index, result.position, result))
            if result.outcome is Outcome.DEAD_LETTERED:
                body = bodies[result.message_id]
                dead_letters.append(InLog(index, result.position, item_dead_letter(result, body)))
    return FoldedStretch(
        states,
        sorted(versions, key=_feed_order),
        sorted(results, key=_feed_order),
        sorted(dead_letters, key=_feed_order),
    )


def _feed_order(entry: InLog[object]) -> tuple[int, int]:
    return (entry.offset, entry.position)


class ReferencePipeline:
    """Serial processing of the message log; call `process` with each new stretch of it."""

    def __init__(
        self,
        selector: ItemSelector | None = None,
        limits: Limits = DEFAULT_LIMITS,
        redelivery_limit: int = DEFAULT_REDELIVERY_LIMIT,
        window: DedupWindow | None = None,
    ) -> None:
        self.selector = selector
        self.limits = limits
        self.redelivery_limit = redelivery_limit
        # Masters that exist, are stale or are filtered (an orphan update leaves no entry).
        self.masters: dict[str, MasterState] = {}
        self.versions: list[MasterVersion] = []
        self.dead_letters: list[DeadLetter] = []
        self.results: list[ItemResult | MessageResult] = []
        self._copies = Copies(window if window is not None else DEFAULT_DEDUP_WINDOW)
        self._patches = PatchCache(self.limits)

    def process(self, messages: Iterable[LoggedMessage]) -> None:
        """Process the next messages of the log, in landing order (in stretches that hold no
        id's first copy twice: see `StretchBeyondWindow`)."""
        stretch = list(messages)
        while stretch:
            copies = self._copies.snapshot()
            try:
                self._process(stretch)
                return
            except StretchBeyondWindow as split:
                self._copies = copies
                self._process(stretch[: split.index])
                stretch = stretch[split.index :]

    def _process(self, messages: list[LoggedMessage]) -> None:
        classified = classify_stretch(
            messages, self._copies, limits=self.limits, redelivery_limit=self.redelivery_limit
        )
        folded = fold_stretch(
            classified,
            self.masters.get,
            selector=self.selector,
            patches=self._patches,
            limits=self.limits,
        )
        self.record(folded)

    def record(self, folded: FoldedStretch) -> None:
        """Take in a folded stretch: its masters' states, versions, results and dead letters."""
        for master_id, state in folded.states.items():
            if state.exists or state.stale or state.filtered:
                self.masters[master_id] = state
        self.results.extend(entry.value for entry in folded.results)
        self.dead_letters.extend(entry.value for entry in folded.dead_letters)
        self.versions.extend(entry.value for entry in folded.versions)

    def outcome_counts(self) -> Counter[Outcome]:
        """How many messages (as a whole) and items ended with each outcome."""
        return Counter(result.outcome for result in self.results)
