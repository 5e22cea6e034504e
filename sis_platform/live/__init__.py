"""sis-live: the resident consumer of the queue (docs/live.md). It lands small groups of
messages durably, commits the queue, folds them in memory with the domain's code (`fold.py`)
and commits the result with its log position to the serving store (`service.py`).

No Dagster or Spark import anywhere in this package."""
