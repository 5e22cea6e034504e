"""Operator commands, the console scripts declared in pyproject.toml: `sis-live` (`live.py`),
`sis-run` (`run.py`), `sis-trace` (`trace.py`, with `--as-of` in `asof.py`), `sis-verify-log`
(`verify_log.py`, which reads Dagster's copies of the anchors through `batch_runs.py`),
`sis-batch-runs` (`batch_runs.py`: a retired range of `batches` partitions restored or retired),
`sis-footprint` (`footprint.py`),
`sis-spark-connect`, `sis-spark-archive` and `sis-spark-jars`, and the platform's processes they
start (`platform.py`)."""
