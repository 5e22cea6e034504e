"""Exponential backoff, the one rule every retry of the platform waits by: a restarted program
(supervisor.py), a reconnect to a broker (queues/stomp, queues/ibmmq), a Delta commit that
lost a conflict (lake/delta.py) and sis-live's next try of an unavailable dependency
(live/config.py `Retry`).

The delay before attempt n (1, 2, ...) is `first * factor**(n-1)`, at most `most`, then
spread by jitter: a factor drawn uniformly from `jitter` (low, high), so that many processes
failing together do not retry in step. (1.0, 1.0) is no jitter."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

NO_JITTER = (1.0, 1.0)
# Half to one and a half times the step: centred on it.
AROUND = (0.5, 1.5)
# Half the step fixed, half random ("equal jitter"): never later than the step.
EQUAL = (0.5, 1.0)


@dataclass(frozen=True)
class Backoff:
    """Exponential delays from `first`, multiplied by `factor` per attempt, at most `most`
    seconds (before jitter), spread by a factor drawn from `jitter`."""

    first: float = 1.0
    factor: float = 2.0
    most: float = 60.0
    jitter: tuple[float, float] = NO_JITTER

    def step(self, attempt: int) -> float:
        """The delay before attempt `attempt` (1, 2, ...) without jitter."""
        return min(self.most, self.first * self.factor ** max(0, attempt - 1))

    def delay(self, attempt: int, draw: Callable[[], float] = random.random) -> float:
        """The delay before attempt `attempt` (1, 2, ...), jittered; `draw` returns a number in
        [0, 1) (tests pass a fixed one)."""
        low, high = self.jitter
        return self.step(attempt) * (low + (high - low) * draw())
