"""sis-live's bounds, timings and fold options (`FoldOptions`, what the classify and fold stages
apply) as one record, taken from the settings (sis_platform.settings) by
`LiveConfig.from_settings`; the service never reads the environment itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from sis_platform.domain.dedup import DEFAULT_DEDUP_WINDOW, DedupWindow
from sis_platform.domain.fold import ItemSelector
from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.domain.pipeline import DEFAULT_REDELIVERY_LIMIT
from sis_platform.domain.priority import Priority
from sis_platform.runtime.backoff import Backoff
from sis_platform.settings import (
    DEFAULT_BATCH_MAX_BYTES,
    DEFAULT_BATCH_MAX_MESSAGES,
    DEFAULT_BATCH_MAX_SECONDS,
    DEFAULT_LANDING_MERGE_GRACE_SECONDS,
    DEFAULT_LANDING_RETAIN_DAYS,
    DEFAULT_LIVE_GROUP_MAX_MESSAGES,
    DEFAULT_LIVE_GROUP_WAIT_MS,
    DEFAULT_LIVE_MAX_MASTERS,
    DEFAULT_LIVE_PRIORITY_WINDOW,
    DEFAULT_SERVING_HISTORY_DAYS,
    Settings,
    longest_stretch,
)
from sis_platform.standards.selector import Selector

# The longest a get waits when nothing else is due: how soon a stop request is seen while the
# queue is idle (a stop is otherwise seen between groups).
IDLE_WAIT_SECONDS = 1.0
# How often an idle service tells the store it is alive (StoreStatus.heartbeat_at).
HEARTBEAT_SECONDS = 5.0
# How often an idle service looks for serving store history to prune once none was left (while
# some is left, it prunes a chunk every idle turn).
PRUNE_SECONDS = 60.0
# How often a progress line is logged while messages flow (never one per message or group).
PROGRESS_SECONDS = 30.0
# Retrying an unavailable store or source: from the first delay, doubling up to the last.
RETRY_FIRST_SECONDS = 0.5
RETRY_LAST_SECONDS = 30.0


@dataclass(frozen=True)
class FoldOptions:
    """How the feed is classified and folded (settings.processing and settings.limits), and
    the bound of the fold stage's master cache."""

    selector: ItemSelector | None = None
    limits: Limits = DEFAULT_LIMITS
    redelivery_limit: int = DEFAULT_REDELIVERY_LIMIT
    max_masters: int = DEFAULT_LIVE_MAX_MASTERS
    priority: Priority | None = None
    window: DedupWindow = DEFAULT_DEDUP_WINDOW

    def __post_init__(self) -> None:
        if self.max_masters < 1:
            raise ValueError(f"max_masters must be at least 1, got {self.max_masters}")


@dataclass(frozen=True)
class LiveConfig:
    """What one sis-live process does: group and batch bounds, the fold, and its timings."""

    group_wait_seconds: float = DEFAULT_LIVE_GROUP_WAIT_MS / 1000
    group_max_messages: int = DEFAULT_LIVE_GROUP_MAX_MESSAGES
    batch_max_messages: int = DEFAULT_BATCH_MAX_MESSAGES
    batch_max_bytes: int = DEFAULT_BATCH_MAX_BYTES
    batch_max_seconds: float = DEFAULT_BATCH_MAX_SECONDS
    message_limits: Limits = DEFAULT_LIMITS
    fold: FoldOptions = field(default_factory=FoldOptions)
    # With a priority (fold.priority), the most messages of a backlog folded as one stretch.
    priority_window: int = DEFAULT_LIVE_PRIORITY_WINDOW
    # Fold worker processes beside sis-live (sis_platform/live/workers.py); settings give
    # SIS_LIVE_FOLD_WORKERS, a config built in a test none unless it asks.
    fold_workers: int = 0
    # How long a batch merged in an idle turn keeps its parts (sis_platform/log/landing/merge.py).
    merge_grace_seconds: float = DEFAULT_LANDING_MERGE_GRACE_SECONDS
    # How long landed batches are kept (SIS_LANDING_RETAIN_DAYS; log/landing/expiry.py).
    landing_retain: timedelta = timedelta(days=DEFAULT_LANDING_RETAIN_DAYS)
    idle_wait_seconds: float = IDLE_WAIT_SECONDS
    heartbeat_seconds: float = HEARTBEAT_SECONDS
    progress_seconds: float = PROGRESS_SECONDS
    # The serving store's change log and dead letters kept (SIS_SERVING_HISTORY_DAYS).
    serving_history: timedelta = timedelta(days=DEFAULT_SERVING_HISTORY_DAYS)
    prune_seconds: float = PRUNE_SECONDS
    retry_first_seconds: float = RETRY_FIRST_SECONDS
    retry_last_seconds: float = RETRY_LAST_SECONDS

    def __post_init__(self) -> None:
        bounds = (self.group_max_messages, self.batch_max_messages, self.batch_max_bytes)
        if min(*bounds, self.priority_window) < 1 or self.fold_workers < 0:
            raise ValueError(f"group and batch bounds must be positive: {self}")
        if self.batch_max_seconds <= 0 or self.group_wait_seconds < 0:
            raise ValueError(f"batch seconds must be positive, the group wait not negative: {self}")
        if not self.fold.window.holds_stretch(self.longest_stretch):
            raise ValueError(
                f"a dedup window of {self.fold.window.batches} batches is shorter than the "
                f"longest stretch sis-live folds at once ({self.longest_stretch} messages)"
            )

    @property
    def longest_stretch(self) -> int:
        """The most messages sis-live folds as one stretch (settings.longest_stretch)."""
        return longest_stretch(
            self.group_max_messages, self.priority_window, self.fold.priority is not None
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> LiveConfig:
        processing = settings.processing
        selector = Selector.compile(processing.selector) if processing.selector else None
        return cls(
            group_wait_seconds=settings.live.group_wait_seconds,
            group_max_messages=settings.live.group_max_messages,
            batch_max_messages=settings.batch.max_messages,
            batch_max_bytes=settings.batch.max_bytes,
            batch_max_seconds=settings.live.batch_seconds,
            message_limits=settings.limits,
            fold=FoldOptions(
                selector=selector,
                limits=settings.limits,
                redelivery_limit=processing.redelivery_limit,
                max_masters=settings.live.max_masters_in_memory,
                priority=Priority.compile(processing.priority) if processing.priority else None,
                window=DedupWindow(processing.dedup_window_batches),
            ),
            priority_window=settings.live.priority_window,
            fold_workers=settings.live.fold_workers,
            serving_history=timedelta(days=settings.serving.history_days),
            merge_grace_seconds=settings.live.merge_grace_seconds,
            landing_retain=timedelta(days=settings.live.landing_retain_days),
        )


@dataclass
class Retry:
    """When to try an unavailable dependency again: delays from `first` doubling up to `last`
    seconds (runtime/backoff.py, without jitter: one process, one dependency), reset by
    `succeeded`. `due` is the monotonic time of the next try (0: now)."""

    first: float
    last: float
    due: float = 0.0
    delay: float = 0.0
    failures: int = 0

    @property
    def failing(self) -> bool:
        return self.failures > 0

    def failed(self, now: float) -> bool:
        """Schedule the next try; True for the first failure of an outage (log it loudly)."""
        self.failures += 1
        self.delay = Backoff(first=self.first, most=self.last).step(self.failures)
        self.due = now + self.delay
        return self.failures == 1

    def succeeded(self) -> bool:
        """Back to normal; True when this ends an outage."""
        ended = self.failing
        self.failures, self.delay, self.due = 0, 0.0, 0.0
        return ended

    def ready(self, now: float) -> bool:
        return now >= self.due
