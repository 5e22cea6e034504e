"""The Dagster assets, checks and jobs of the platform, thin over the lake's and the log's code:
the message log and its chain check (`message_log.py`), the fold (`masters.py`), the model
(`model.py`), the serving store and its checks (`serving.py`), the feed's and the lake's checks
(`feed_checks.py`, `lake_checks.py`, `freshness.py`), the dead-letter view, the `batches`
partitions and a batch run's tags (`run_tags.py`: which batches a run is for), the retry policy,
the tables' asset specs and the jobs (`jobs.py`); one asset per Delta table
(docs/operations.md, "The lake's tables")."""
