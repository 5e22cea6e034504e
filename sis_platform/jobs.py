"""Jobs."""

from __future__ import annotations

import dagster as dg

from sis_platform.assets.masters import fold_masters, interpreted_model
from sis_platform.assets.message_log import message_items, raw_messages

# One process and one Spark session per run: the in-process executor runs every step of the
# batch in the run's own process, instead of starting a JVM per step.
process_batch_job = dg.define_asset_job(
    "process_batch",
    selection=dg.AssetSelection.assets(raw_messages, message_items, fold_masters,
                                       interpreted_model),
    executor_def=dg.in_process_executor,
    description="Log, parse and split one landing batch, fold it into the master documents "
    "and refresh the interpreted model.",
)
