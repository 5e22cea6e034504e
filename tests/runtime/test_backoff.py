"""The one backoff rule (sis_platform/runtime/backoff.py): exponential, capped, jittered."""

from __future__ import annotations

import pytest

from sis_platform.runtime.backoff import AROUND, EQUAL, NO_JITTER, Backoff


def test_each_attempt_doubles_the_delay_up_to_its_ceiling() -> None:
    backoff = Backoff(first=0.5, most=3.0)
    assert [backoff.step(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_another_factor_multiplies_by_it() -> None:
    assert [Backoff(first=1.0, factor=3.0, most=100.0).step(n) for n in (1, 2, 3)] == [1, 3, 9]


@pytest.mark.parametrize(
    ("jitter", "low", "high"), [(NO_JITTER, 2.0, 2.0), (AROUND, 1.0, 3.0), (EQUAL, 1.0, 2.0)]
)
def test_jitter_spreads_the_step_between_its_bounds(jitter, low, high) -> None:
    backoff = Backoff(first=1.0, most=10.0, jitter=jitter)
    assert backoff.delay(2, lambda: 0.0) == low
    assert backoff.delay(2, lambda: 1.0) == high
    assert low <= backoff.delay(2) <= high
