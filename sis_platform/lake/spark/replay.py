"""Dead-letter replay: after a fix (schema, code or configuration), the batches holding dead
letters are classified again and the masters they touch are rewound and refolded from the
first dead letter on, in feed order, through the fold's rewind (lake/spark/fold/rewind.py). A dead
letter
that the fix does not cure is dead-lettered again, in the same place; nothing is applied twice.
Replaying a master's `quarantined` or `too-complex` dead letters releases its recorded fold
failures (the fix is deployed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from sis_platform.domain.dedup import DEFAULT_DEDUP_WINDOW, DedupWindow
from sis_platform.domain.limits import Limits
from sis_platform.domain.reasons import Reason
from sis_platform.lake.spark.fold import (
    FOLD_WRITER,
    FoldStepResult,
    fold_step,
    recover,
    release_quarantine,
)
from sis_platform.lake.spark.items import ItemsSummary, log_items
from sis_platform.lake.tables import DEAD_LETTERS
from sis_platform.settings import DEFAULT_QUARANTINE_AFTER

if TYPE_CHECKING:
    from sis_platform.lake.delta import Lake


@dataclass(frozen=True)
class ReplayResult:
    dead_letters: int  # dead letters selected for replay
    batches: tuple[str, ...]  # batches classified again
    masters: int  # masters asked to rewind for their item dead letters
    step: FoldStepResult


def replay_dead_letters(
    lake: Lake,
    *,
    reasons: Sequence[str] = (),
    batch_keys: Sequence[str] = (),
    limits: Limits,
    redelivery_limit: int,
    selector: str | None,
    quarantine_after: int = DEFAULT_QUARANTINE_AFTER,
    window: DedupWindow = DEFAULT_DEDUP_WINDOW,
    run_id: str | None,
    on_relogged: Callable[[str, ItemsSummary], None] | None = None,
    landing_root: str | None = None,
) -> ReplayResult:
    """Replay the committed dead letters (those with a reason in `reasons` and in a batch of
    `batch_keys`, each filter unless empty). `on_relogged` is called with each batch classified
    again and its summary, as soon as it is written."""
    lake.claim_writer(FOLD_WRITER)
    committed, versions = recover(lake)
    letters = lake.read(DEAD_LETTERS, version=versions[DEAD_LETTERS.name])
    if reasons:
        letters = letters.where(F.col("reason").isin(list(reasons)))
    if batch_keys:
        letters = letters.where(F.col("batch_key").isin(list(batch_keys)))
    rows = letters.select("batch_key", "batch_seq", "master_id", "reason").collect()
    keys = sorted({str(r["batch_key"]) for r in rows})
    rewind: dict[str, int] = {}
    for r in rows:
        if r["master_id"] is not None:
            seq = int(r["batch_seq"])
            rewind[str(r["master_id"])] = min(seq, rewind.get(str(r["master_id"]), seq))
    relogged = (
        log_items(
            lake,
            keys,
            limits=limits,
            redelivery_limit=redelivery_limit,
            run_id=run_id,
            quarantine_after=quarantine_after,
            landing_root=landing_root,
        )
        if keys
        else {}
    )
    if on_relogged is not None:
        for key, summary in relogged.items():
            on_relogged(key, summary)
    # Replaying a quarantined master's items, or its items over the fold's time budget, is the
    # statement that its failure is fixed (else an item over the budget stays held back).
    release_quarantine(
        lake,
        {
            str(r["master_id"])
            for r in rows
            if r["reason"] in (str(Reason.QUARANTINED), str(Reason.TOO_COMPLEX))
            and r["master_id"] is not None
        },
    )
    step = fold_step(
        lake,
        selector=selector,
        run_id=run_id,
        rewind=rewind or None,
        quarantine_after=quarantine_after,
        limits=limits,
        window=window,
    )
    return ReplayResult(len(rows), tuple(keys), len(rewind), step)
