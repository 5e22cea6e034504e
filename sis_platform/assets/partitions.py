"""Partitions: one dynamic partition per landing batch (never one per message)."""

from __future__ import annotations

import dagster as dg

BATCHES = "batches"

batches_partitions = dg.DynamicPartitionsDefinition(name=BATCHES)
