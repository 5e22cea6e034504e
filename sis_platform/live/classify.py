"""sis-live's classify stage: a landed stretch of the log to the valid items per master.

The third of the live path's stages (docs/live.md, "The stages"): gather and land
(`service.py`), classify (here), fold (`fold.py`), commit (`applier.py`). A stretch (one landed
group, or a run of groups while catching up) goes through the reference pipeline's own first
steps (`classify_stretch` in sis_platform/domain/pipeline.py): deduplicated by message id
against the stretch and the store's copies in the dedup window (`ServingWriter.latest_copies`,
domain/dedup.py), the redelivery limit, classification and splitting into items. With a
budget (sis_platform/live/budget.py) each message is classified under the per-item budget and
the failures of earlier processes are honoured.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sis_platform.domain.dedup import Copies
from sis_platform.domain.pipeline import ClassifiedStretch, Classifier, classify_stretch
from sis_platform.live.config import FoldOptions
from sis_platform.log.landing import LandedMessage, LogPosition

if TYPE_CHECKING:
    from sis_platform.live.budget import LiveBudget


class CopiesStore(Protocol):
    """What the classify stage reads of the serving store (sis_platform.serving.ServingWriter)."""

    def latest_copies(self, message_ids: Iterable[str], since_batch: int) -> dict[str, int]: ...


@dataclass(frozen=True)
class Classified:
    """A stretch of the landed log, classified: `stretch` is what the domain decided (items
    per master in feed order, and per message duplicates and dead letters), `messages` the
    landed messages it was decided for, in log order."""

    stretch: ClassifiedStretch
    messages: Sequence[LandedMessage]

    @property
    def end(self) -> LogPosition:
        """The log position of the stretch's last message."""
        return self.messages[-1].position

    @property
    def master_ids(self) -> list[str]:
        """The masters with items in the stretch, in feed order of their first item."""
        return list(self.stretch.groups)

    @property
    def copies(self) -> dict[str, int]:
        """Its message ids, each with the batch of its last copy here (the `also_seen` of a
        stretch classified before the store holds this one)."""
        return {landed.message.message_id: landed.position.batch_seq for landed in self.messages}

    def part(self, master_ids: Iterable[str], *, whole_messages: bool) -> Classified:
        """Only the items of `master_ids` (`ClassifiedStretch.part`)."""
        return Classified(
            self.stretch.part(master_ids, whole_messages=whole_messages), self.messages
        )


class Classify:
    """The classify stage (see the module docstring): `classify(messages)`."""

    def __init__(
        self, store: CopiesStore, options: FoldOptions, budget: LiveBudget | None = None
    ) -> None:
        self.store = store
        self.options = options
        self._classify: Classifier | None = None
        if budget is not None:
            self._classify = budget.classifier(
                limits=options.limits, redelivery_limit=options.redelivery_limit
            )

    def __call__(
        self,
        messages: Sequence[LandedMessage],
        *,
        ahead: Iterable[str] = (),
        also_seen: Mapping[str, int] | None = None,
    ) -> Classified:
        """`messages` (the log's next stretch after the store's position, in log order, at
        least one) classified. `ahead`: masters whose items in the stretch an interrupted
        earlier try already committed (left out; the stretch's messages as a whole are kept).
        `also_seen`: the copies of a stretch before this one that the store has not committed
        yet, message id to batch."""
        if not messages:
            raise ValueError("nothing to classify: a stretch has at least one message")
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
        stretch = classify_stretch(
            logged,
            copies,
            limits=options.limits,
            redelivery_limit=options.redelivery_limit,
            classify=self._classify,
        )
        classified = Classified(stretch, messages)
        skipped = frozenset(ahead)
        if not skipped:
            return classified
        kept = [master_id for master_id in stretch.groups if master_id not in skipped]
        return classified.part(kept, whole_messages=True)
