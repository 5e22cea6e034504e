"""sis-live: the resident consumer of the queue (docs/live.md). It lands small groups of
messages durably, folds them in memory with the domain's code (`fold.py`), commits the result
with its log position to the serving store and then commits the queue (`service.py`).

No Dagster or Spark import anywhere in this package."""
