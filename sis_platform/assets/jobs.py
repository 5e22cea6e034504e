"""Jobs: the per-batch job the sensor requests, dead-letter replay, the live == lake check and
the lake's integrity checks. The first two are asset jobs: every table they write is
materialized by its own asset.

No `from __future__ import annotations`: Dagster reads the config mapping's annotations at
definition time.
"""

from typing import Any

import dagster as dg

from sis_platform.assets.lake_checks import lake_integrity
from sis_platform.assets.lake_files import lake_files
from sis_platform.assets.masters import fold_masters
from sis_platform.assets.message_log import message_items, raw_messages
from sis_platform.assets.model import interpreted_model
from sis_platform.assets.serving import live_matches_lake

REPLAY_KIND_TAG = {"sis/kind": "replay"}

# One process and one Spark session per run: the in-process executor runs every step of the
# batch in the run's own process, instead of starting a JVM per step. A run for batch P
# materializes raw_messages[P] and message_items[P] (partitioned), then the fold and the model
# (unpartitioned: they fold every classified batch not yet folded, P among them).
# The lake's integrity checks target these assets too, but run in a job of their own (below).
WITHOUT_LAKE_CHECKS = dg.AssetSelection.checks(lake_integrity, lake_files)

process_batch_job = dg.define_asset_job(
    "process_batch",
    selection=dg.AssetSelection.assets(raw_messages, message_items, fold_masters, interpreted_model)
    - WITHOUT_LAKE_CHECKS,
    executor_def=dg.in_process_executor,
    description="Log, parse and split one landing batch, fold it into the master documents "
    "and refresh the interpreted model.",
)

# The replay's run config keeps the shape operators have always launched it with,
# `ops: {replay: {config: {reasons, batches}}}`, and maps it onto the fold's `replay` config.
REPLAY_RUN_CONFIG = {
    "ops": dg.Field(
        {
            "replay": dg.Field(
                {
                    "config": dg.Field(
                        {
                            "reasons": dg.Field(
                                [str],
                                default_value=[],
                                is_required=False,
                                description="Replay only dead letters with these reason codes "
                                "(all when empty).",
                            ),
                            "batches": dg.Field(
                                [str],
                                default_value=[],
                                is_required=False,
                                description="Replay only dead letters of these batches "
                                "(partition keys; all when empty).",
                            ),
                        },
                        is_required=False,
                    )
                },
                is_required=False,
            )
        },
        is_required=False,
    )
}


@dg.config_mapping(config_schema=REPLAY_RUN_CONFIG)
def replay_config(outer: dict[str, Any]) -> dict[str, Any]:
    """The fold's config for a replay of the dead letters `outer` selects."""
    selection = outer.get("ops", {}).get("replay", {}).get("config", {})
    return {
        "ops": {
            fold_masters.op.name: {
                "config": {
                    "replay": {
                        "reasons": list(selection.get("reasons", [])),
                        "batches": list(selection.get("batches", [])),
                    }
                }
            }
        }
    }


replay_dead_letters_job = dg.define_asset_job(
    "replay_dead_letters",
    selection=dg.AssetSelection.assets(fold_masters, interpreted_model) - WITHOUT_LAKE_CHECKS,
    config=replay_config,
    executor_def=dg.in_process_executor,
    tags=REPLAY_KIND_TAG,
    description="Replay dead letters after a fix: classify their batches again, rewind the "
    "masters they touch and refold them in feed order, then refresh the model (config: "
    "reasons, batches).",
)

# The live == lake check reads the whole of master_documents with Spark: a job of its own,
# requested by live_matches_lake_sensor when the lake's fold has advanced, instead of a step of
# every batch run (live intake only).
live_matches_lake_job = dg.define_asset_job(
    "check_live_matches_lake",
    selection=dg.AssetSelection.checks(live_matches_lake),
    executor_def=dg.in_process_executor,
    description="Compare the serving store with the lake at the lake's fold position, master by "
    "master (version and document hash).",
)

# The lake's integrity checks (assets/lake_checks.py): a second or more of Spark each, so a job
# launched from the UI or by its schedule rather than a part of every feed run.
check_lake_job = dg.define_asset_job(
    "check_lake",
    selection=dg.AssetSelection.checks(lake_integrity, lake_files),
    executor_def=dg.in_process_executor,
    description="Check the lake's integrity: one row per master, gap-free versions and "
    "nothing applied twice, one end state per message (the last fold step), the model's "
    "references; and each upkept table's data files against SIS_LAKE_MAX_FILES.",
)
check_lake_schedule = dg.ScheduleDefinition(
    job=check_lake_job,
    cron_schedule="*/30 * * * *",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Run check_lake every 30 minutes (off by default: turn it on under Automation).",
)
