"""The poison policy: how a message or a master that fails for a reason the feed's rules do not
name ends (docs/design.md invariants 4 and 6), in one place for both paths. The lake applies it
to the facts it keeps in fold_failures and classify_failures (lake/spark/fold/quarantine.py,
lake/spark/items.py), sis-live to those in its failures.json (live/budget.py); the guard that
produces the facts is runtime/guard.py.

- A classification over the per-item budget: the message dead-lettered `too-complex`.
- A classification that raised: the message dead-lettered `quarantined` at once.
- A classification whose process died `quarantine_after` times: the message `quarantined`.
- A fold item over the budget: dead-lettered `too-complex`, never folded again; an existing
  master is left stale (domain/fold.py `fold_skipping`).
- A master whose fold raised or died `quarantine_after` times: quarantined, its items held back
  as `quarantined` dead letters and the master left as it was, until a replay releases it.

The texts below are each outcome's `detail`, the same whichever path recorded it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sis_platform.domain.fold import ItemResult, MasterFoldResult, MasterState
from sis_platform.domain.items import Item
from sis_platform.domain.reasons import Outcome, Reason

# The most characters of an exception's text a fold failure keeps (the type is kept whole).
FAILURE_DETAIL_CHARS = 2000
# The most characters of an exception's text a classification's dead letter keeps.
ERROR_DETAIL_CHARS = 1000


def budget_detail(seconds: float | None) -> str:
    """The detail of a dead letter for an item that overran its budget."""
    return f"took longer than the per-item budget of {seconds:g} s (SIS_ITEM_BUDGET_SECONDS)"


def failure_detail(error: BaseException) -> str:
    """A fold that raised, as its failure is recorded: the exception's type and text, cut short.
    The text may quote content: the master is named by a structured field, never by it."""
    return f"{type(error).__name__}: {error}"[:FAILURE_DETAIL_CHARS]


def quarantine_detail(failures: int, last_error: str) -> str:
    """The detail of a dead letter held back from a master whose fold failed `failures`
    times."""
    return f"fold failed {failures} times: {last_error}"


def classify_error_detail(error: BaseException) -> str:
    """The detail of a message dead-lettered `quarantined` because classifying it raised."""
    return f"classification raised {type(error).__name__}: {error}"[:ERROR_DETAIL_CHARS]


def classify_deaths_detail(deaths: int) -> str:
    """The detail of a message held back after the process classifying it died `deaths`
    times."""
    return f"its Python worker died classifying it {deaths} times"


@dataclass(frozen=True)
class Held:
    """A message not to classify (again): dead-lettered with this reason and detail instead."""

    reason: Reason
    detail: str


@dataclass(frozen=True)
class PoisonPolicy:
    """The policy's one setting (SIS_QUARANTINE_AFTER) and its rules over recorded failures."""

    quarantine_after: int

    def held_message(self, *, timed_out: str | None, deaths: int) -> Held | None:
        """What a message whose classification earlier overran its budget (`timed_out`: that
        failure's detail) or whose classifying process died `deaths` times becomes, or None
        to classify it (again)."""
        if timed_out is not None:
            return Held(Reason.TOO_COMPLEX, timed_out)
        if deaths >= self.quarantine_after:
            return Held(Reason.QUARANTINED, classify_deaths_detail(deaths))
        return None

    def quarantines(self, failures: int) -> bool:
        """Whether a master whose fold raised or died `failures` times is quarantined."""
        return failures >= self.quarantine_after

    def quarantined(self, failures: Iterable[tuple[str, str]]) -> dict[str, str]:
        """The quarantined masters among fold `failures` (master id, error), oldest first: each
        with the detail its held-back items carry (its count and last error)."""
        counts: dict[str, int] = {}
        last: dict[str, str] = {}
        for master_id, error in failures:
            counts[master_id] = counts.get(master_id, 0) + 1
            last[master_id] = error
        return {
            master_id: quarantine_detail(n, last[master_id])
            for master_id, n in counts.items()
            if self.quarantines(n)
        }


def held_back(
    master_id: str, state: MasterState | None, items: list[Item], detail: str
) -> MasterFoldResult:
    """A quarantined master's items, not folded: each dead-lettered `quarantined` with `detail`,
    the master as it was."""
    current = state or MasterState(master_id=master_id, version=0, document=None)
    results = [
        ItemResult(
            message_id=item.message_id,
            position=item.position,
            master_id=master_id,
            outcome=Outcome.DEAD_LETTERED,
            version=None,
            reason=Reason.QUARANTINED,
            detail=detail,
            warning=None,
        )
        for item in items
    ]
    return MasterFoldResult(state=current, results=results)
