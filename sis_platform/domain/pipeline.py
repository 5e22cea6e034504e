"""The reference pipeline: the message log in landing order to masters, versions and dead
letters, serially, in plain Python (docs/feed.md; docs/design.md, invariants 2-4).

Per message, in this order:

1. A message id already seen earlier in the log is a `duplicate`: recorded, nothing else
   (whatever became of the first copy, even a dead letter; an update is never applied twice).
2. Delivered more than `redelivery_limit` times: dead-lettered `redelivery-limit`.
3. Invalid as a whole (messages.parse_message), or too costly to split (items.split_message,
   `too-complex`): dead-lettered with its reason; the dead letter has no master id or position.
4. Otherwise split into items, and each item folded into its master (fold.fold_master); the
   items of a message are applied in id order, each master independently.

Every message ends accounted for in `results`: one `MessageResult` (duplicate or
dead-lettered as a whole) or one `ItemResult` per listed id (applied, filtered or
dead-lettered). Every dead letter, message or item, keeps the original body.

The Spark implementation reproduces this exactly by: a global dedupe by message id keeping the
first copy in landing order, `classify_message` per remaining message, and `fold_master` per
master id over its items sorted by (landing order, position), starting from the stored state.
`process` itself works that way on each batch it is given (classify all, then fold per master),
so a batch keeps each master parsed across its items; results are then put back in feed
order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from operator import itemgetter

from sis_platform.domain.fold import (
    ItemResult,
    ItemSelector,
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
        return _whole_message_dead_letter(
            message,
            Reason.REDELIVERY_LIMIT,
            f"delivered {message.delivery_count} times, "
            f"over the redelivery limit of {redelivery_limit}",
        )
    if message.body_location is not None:
        return _whole_message_dead_letter(
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
        return _whole_message_dead_letter(message, error.reason, error.detail)


def _whole_message_dead_letter(message: LoggedMessage, reason: Reason, detail: str) -> DeadLetter:
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


class ReferencePipeline:
    """Serial processing of the message log; call `process` with each new stretch of it."""

    def __init__(
        self,
        selector: ItemSelector | None = None,
        limits: Limits = DEFAULT_LIMITS,
        redelivery_limit: int = DEFAULT_REDELIVERY_LIMIT,
    ) -> None:
        self.selector = selector
        self.limits = limits
        self.redelivery_limit = redelivery_limit
        # Masters that exist, are stale or are filtered (an orphan update leaves no entry).
        self.masters: dict[str, MasterState] = {}
        self.versions: list[MasterVersion] = []
        self.dead_letters: list[DeadLetter] = []
        self.results: list[ItemResult | MessageResult] = []
        self._seen: set[str] = set()
        self._landed = 0
        self._patches = PatchCache(self.limits)

    def process(self, messages: Iterable[LoggedMessage]) -> None:
        """Process the next messages of the log, in landing order."""
        # Entries are keyed by (landing index, position) and put in that order at the end; a
        # message-level entry has position -1.
        results: list[tuple[tuple[int, int], ItemResult | MessageResult]] = []
        dead_letters: list[tuple[tuple[int, int], DeadLetter]] = []
        versions: list[tuple[tuple[int, int], MasterVersion]] = []
        groups: dict[str, list[Item]] = {}
        landing: dict[str, int] = {}
        bodies: dict[str, bytes] = {}

        for message in messages:
            index = self._landed
            self._landed += 1
            if message.message_id in self._seen:
                results.append(((index, -1), duplicate_result(message.message_id)))
                continue
            self._seen.add(message.message_id)
            classified = classify_message(
                message, limits=self.limits, redelivery_limit=self.redelivery_limit
            )
            if isinstance(classified, DeadLetter):
                results.append(((index, -1), message_result(classified)))
                dead_letters.append(((index, -1), classified))
                continue
            landing[message.message_id] = index
            bodies[message.message_id] = message.body
            for item in classified:
                groups.setdefault(item.master_id, []).append(item)

        for master_id, items in groups.items():
            folded = fold_master(
                master_id,
                self.masters.get(master_id),
                items,
                selector=self.selector,
                patches=self._patches,
                limits=self.limits,
            )
            state = folded.state
            if state.exists or state.stale or state.filtered:
                self.masters[master_id] = state
            for version in folded.versions:
                versions.append(((landing[version.message_id], version.position), version))
            for result in folded.results:
                key = (landing[result.message_id], result.position)
                results.append((key, result))
                if result.outcome is Outcome.DEAD_LETTERED:
                    dead_letters.append((key, item_dead_letter(result, bodies[result.message_id])))

        by_key = itemgetter(0)
        self.results.extend(entry for _, entry in sorted(results, key=by_key))
        self.dead_letters.extend(entry for _, entry in sorted(dead_letters, key=by_key))
        self.versions.extend(entry for _, entry in sorted(versions, key=by_key))

    def outcome_counts(self) -> Counter[Outcome]:
        """How many messages (as a whole) and items ended with each outcome."""
        return Counter(result.outcome for result in self.results)
