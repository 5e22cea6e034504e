"""The fold on Spark: items to master documents, per master id in feed order, parallel across ids.

One fold step takes the gap-free run of batches after the last committed step (plan.py), drops
messages already seen by message id (dedupe.py), dead-letters invalid messages, and folds each
master's items with the domain's `fold_master` in Spark's Python workers (worker.py); masters
whose input changed are rewound and refolded (rewind.py), masters whose fold keeps failing for
an unknown reason are quarantined (quarantine.py). The step writes its rows (outputs.py) and
commits by appending its row to fold_steps (ledger.py, which also recovers from an interrupted
step). homes.py finds the partitions (home blocks) the step's masters live in. step.py runs a
step from start to commit.

This package re-exports what the rest of the platform uses: the model, replay and trace read
the ledger; the Dagster assets run `fold_step`.
"""

from sis_platform.lake.spark.fold.ledger import (
    FOLD_TABLES,
    FOLD_WRITER,
    STEP_TABLES,
    CommittedStep,
    FoldedBatch,
    FoldProgress,
    FoldStepResult,
    committed_step,
    fold_progress,
    fold_step_rows,
    folded_batches,
    recover,
    written_blocks,
)
from sis_platform.lake.spark.fold.plan import LoggedBatches
from sis_platform.lake.spark.fold.quarantine import (
    CRASH,
    ERROR,
    FAILED,
    FAILURE_DETAIL_CHARS,
    FoldFailure,
    KnownFailures,
    MasterFailure,
    known_failures,
    record_failures,
    release_quarantine,
)
from sis_platform.lake.spark.fold.step import fold_all, fold_step
from sis_platform.lake.spark.fold.worker import WorkerPlan

__all__ = [
    "CRASH",
    "ERROR",
    "FAILED",
    "FAILURE_DETAIL_CHARS",
    "FOLD_TABLES",
    "FOLD_WRITER",
    "STEP_TABLES",
    "CommittedStep",
    "FoldFailure",
    "FoldProgress",
    "FoldStepResult",
    "FoldedBatch",
    "KnownFailures",
    "LoggedBatches",
    "MasterFailure",
    "WorkerPlan",
    "committed_step",
    "fold_all",
    "fold_progress",
    "fold_step",
    "fold_step_rows",
    "folded_batches",
    "known_failures",
    "record_failures",
    "recover",
    "release_quarantine",
    "written_blocks",
]
