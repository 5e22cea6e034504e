"""Dagster sensors, thin adapters chosen by the intake mode (sis_platform/definitions.py).

SIS_INTAKE=sensor: `queue_sensor` consumes the queue through sis_platform.intake.tick.
SIS_INTAKE=live: `landed_sensor` registers the batches sis-live landed, `serving_reporter`
reports the serving store's progress and freshness without a run, and `live_check_sensor`
requests the live == lake check when the lake's fold advances. `batch_runs` is what both intake
sensors hand Dagster: a partition and a run request per batch. In both modes Dagster's own
records are bounded: `partition_retirement` retires the `batches` partitions of batches long
folded and checked, `run_retention` deletes old finished runs.
"""
