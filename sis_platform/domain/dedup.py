"""Exactly once (docs/design.md invariant 2), as both paths decide it: which copies of a message
id are duplicates.

A copy is a duplicate when an earlier copy of its id in the log (any copy: applied, filtered,
dead-lettered or itself a duplicate) lies in its batch or in one of the `batches` batches before
it: the dedup window (SIS_DEDUP_WINDOW_BATCHES). A copy with no earlier copy in its window is
processed as a first copy.

Why a window is enough. A queue delivers a message again only if it was not committed: the
consumer died, lost its connection or backed out after landing it and before its commit. The
copies then land at the next gets, a batch or two after the first (a message redelivered after
an outage of days still lands next: the log does not move while nothing is got). Copies further
apart than that come from outside the queue's contract: a backout queue replayed into the queue,
or a provider putting a message again under the same id. The default window, 21,600 batches
(30 days of two-minute batches, the feed's real shape; fewer days with shorter batches), covers
every redelivery and such a replay within the month.

Why a window at all. Without one, each path must keep and consult every message id it ever
logged: the serving store's outcomes grow by a row per message for good, and the lake's lookup
of a step's ids reads all of message_outcomes, a cost that grows with the lake's age. With it,
the serving store prunes outcomes older than the window (serving/writer.py) and the lake reads
only the window's batches of message_outcomes (lake/spark/fold/dedupe.py), whatever the age.
`batches=0` keeps the whole log (the window unbounded), at those costs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# 30 days of batches sealed every two minutes (SIS_LIVE_BATCH_SECONDS, sis-live's default).
DEFAULT_DEDUP_WINDOW_BATCHES = 21_600


@dataclass(frozen=True)
class DedupWindow:
    """How many batches before its own a copy's earlier copies count (0: the whole log)."""

    batches: int = DEFAULT_DEDUP_WINDOW_BATCHES

    def __post_init__(self) -> None:
        if self.batches < 0:
            raise ValueError(f"a dedup window is 0 (unbounded) or more batches, not {self.batches}")

    @property
    def bounded(self) -> bool:
        return self.batches > 0

    def holds_stretch(self, messages: int) -> bool:
        """Whether a stretch of `messages` messages (so of at most that many batches) can hold
        no id's first copy twice, as a stretch folded in one piece must
        (pipeline.StretchBeyondWindow): the window is unbounded or at least that long."""
        return not self.bounded or self.batches >= messages

    def oldest(self, batch_seq: int) -> int:
        """The oldest batch whose copies make a copy in batch `batch_seq` a duplicate (0: every
        batch)."""
        return max(0, batch_seq - self.batches) if self.bounded else 0

    def counts(self, earlier: int, batch_seq: int) -> bool:
        """Whether a copy in batch `earlier` makes a later copy in batch `batch_seq` a
        duplicate."""
        return earlier >= self.oldest(batch_seq)


DEFAULT_DEDUP_WINDOW = DedupWindow()


class Copies:
    """The message ids met so far, each with the batch of its latest copy: what the duplicate
    rule needs of the log before a stretch, and of the stretch as it goes."""

    def __init__(self, window: DedupWindow, latest: Mapping[str, int] | None = None) -> None:
        self.window = window
        self._latest: dict[str, int] = dict(latest or {})

    def duplicate(self, message_id: str, batch_seq: int) -> bool:
        """Whether a copy of `message_id` in batch `batch_seq` is a duplicate of one met."""
        earlier = self._latest.get(message_id)
        return earlier is not None and self.window.counts(earlier, batch_seq)

    def add(self, message_id: str, batch_seq: int) -> None:
        """Meet a copy of `message_id` in batch `batch_seq`."""
        earlier = self._latest.get(message_id)
        if earlier is None or batch_seq > earlier:
            self._latest[message_id] = batch_seq

    def snapshot(self) -> Copies:
        """A copy of these copies, to go back to."""
        return Copies(self.window, self._latest)

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._latest
