"""The lake's progress and lag as sis-live exports them (`sis_lake_*` on its /metrics), read
without Spark or Delta: the lake's last committed fold step from the serving store (the row the
fold records there, ServingReader.lake_progress) and what waits for it from the landing zone
sis-live writes.

- lag in batches: the newest sealed batch landed minus the lake's last folded batch (0 when the
  lake has folded every sealed batch; the open batch is not counted, it cannot be folded yet);
- lag in seconds: how long the oldest landed message the lake has not folded has waited (the
  first message of the first batch after the lake's last folded batch, or the open batch's
  opening when that is the batch waiting); 0 when nothing waits. The same measure as the
  lake_lag_within_bounds check (sis_platform/log/landing/backlog.py, `Backlog.lag_seconds`), so
  one threshold means the same on both.

`LakeWatch.turn` runs on sis-live's loop once per `seconds` at most: one single-row read of the
store, and a listing of the landing zone plus one column of one file only when the lake's
position moved or messages start to wait (the oldest waiting message does not change while the
lake stands still). A scrape reads the snapshot and the clock only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sis_platform.log.landing import LogPosition
from sis_platform.log.landing.backlog import oldest_waiting
from sis_platform.log.landing.catalog import Catalog
from sis_platform.log.landing.rows import OpenBatch
from sis_platform.serving.records import LakeProgress


@dataclass(frozen=True)
class LakeLag:
    """The lake's progress as last read, and what waits for it."""

    progress: LakeProgress
    newest_sealed: int  # the newest sealed batch landed (0: none)
    oldest_waiting_at: datetime | None  # UTC: when the oldest unfolded message landed

    @property
    def batches(self) -> int:
        """Sealed batches landed after the lake's last folded batch."""
        return max(0, self.newest_sealed - self.progress.last_batch_seq)

    def seconds(self, now: datetime) -> float:
        """How long the oldest unfolded message has waited at `now` (0: none waits)."""
        if self.oldest_waiting_at is None:
            return 0.0
        return max(0.0, (now - self.oldest_waiting_at).total_seconds())


def newest_sealed(landed: LogPosition, open_batch: OpenBatch | None) -> int:
    """The newest sealed batch, from the last message landed and the batch open now."""
    if open_batch is not None and open_batch.seq == landed.batch_seq:
        return landed.batch_seq - 1
    return landed.batch_seq if landed.msg_seq >= 0 else 0


class LakeWatch:
    """The lake's lag, refreshed by `turn` at most every `seconds` (module docstring)."""

    def __init__(self, zone: Catalog, seconds: float, clock: Callable[[], float]) -> None:
        self._zone = zone
        self._seconds = seconds
        self._clock = clock
        self._due = 0.0
        # The last snapshot (None: the lake has not recorded its progress, as far as read).
        self.current: LakeLag | None = None

    def turn(
        self,
        read: Callable[[], LakeProgress | None],
        landed: LogPosition,
        open_batch: OpenBatch | None,
    ) -> None:
        """Refresh the snapshot when due. `read`: the store's lake progress (None: never
        recorded, or the store unavailable now; the last snapshot is kept)."""
        now = self._clock()
        if now < self._due:
            return
        self._due = now + self._seconds
        progress = read()
        if progress is None:
            return
        folded = progress.last_batch_seq
        sealed = newest_sealed(landed, open_batch)
        previous = self.current
        waits = sealed > folded or (open_batch is not None and open_batch.seq > folded)
        if not waits:
            oldest = None
        elif (
            previous is not None
            and previous.progress.last_batch_seq == folded
            and previous.oldest_waiting_at is not None
        ):
            oldest = previous.oldest_waiting_at  # the lake stood still: the same message waits
        else:
            oldest = oldest_waiting(self._zone, folded, open_batch)
        self.current = LakeLag(progress, sealed, oldest)
