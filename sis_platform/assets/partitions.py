"""Partitions: one dynamic partition per landing batch (never one per message).

Batches folded and checked long ago are retired from the set (the data stays:
sis_platform/sensors/partition_retirement.py), so it holds about SIS_PARTITION_RETAIN_DAYS of
batches; `sis-batch-runs restore FROM TO` registers a retired range again for a backfill.
"""

from __future__ import annotations

import dagster as dg

BATCHES = "batches"

batches_partitions = dg.DynamicPartitionsDefinition(name=BATCHES)
