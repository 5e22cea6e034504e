"""sis-live: the resident consumer of the queue (docs/live.md). Its stages, in order: it gathers
small groups of messages and lands them durably (`service.py`, the loop), classifies them
(`classify.py`), folds them in memory with the domain's code (`fold.py`, with a share in worker
processes: `workers.py`; the rows it commits: `commits.py`), commits the result with its log
position to the serving store (`applier.py`, which runs those three stages and catches the
store up) and then commits the queue (`service.py`); `budget.py` bounds
an item's time, `config.py` its bounds, `process.py` one process built from the settings;
`metrics.py` its Prometheus metrics and `endpoint.py` the HTTP endpoint that serves them with
its health (/metrics, /healthz, /readyz); `lakelag.py` the lake's progress and lag it exports
too, from the row the lake's fold records in the serving store; `traces.py` its OpenTelemetry
spans (one per group, a child per stage, drawn from the metrics' own stage timings; imported
only when OTEL_EXPORTER_OTLP_ENDPOINT is set).

No Dagster or Spark import anywhere in this package."""
