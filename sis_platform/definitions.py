"""The code location: every asset, check, job, sensor and resource of the platform.

The intake mode (SIS_INTAKE, docs/configuration.md) is chosen here and nowhere else
(`intake_definitions`): with `live` (the default) sis-live consumes the queue, the landed-batches
sensor registers what it lands, and the serving store is in the graph with its reporter and its
checks; with `sensor` the queue sensor consumes the queue and there is no serving store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import dagster as dg

from sis_platform.assets.freshness import freshness_policy, with_freshness
from sis_platform.assets.jobs import (
    check_lake_job,
    check_lake_schedule,
    live_matches_lake_job,
    process_batch_job,
    replay_dead_letters_job,
)
from sis_platform.assets.lake_checks import lake_integrity
from sis_platform.assets.lake_files import lake_files
from sis_platform.assets.masters import fold_masters
from sis_platform.assets.message_log import hash_chain_intact, message_items, raw_messages
from sis_platform.assets.model import interpreted_model
from sis_platform.assets.serving import live_matches_lake, live_store_fresh, serving_store_spec
from sis_platform.resources import config
from sis_platform.runtime.private import private_files, private_folder
from sis_platform.sensors.landed_sensor import build_landed_batches_sensor
from sis_platform.sensors.live_check_sensor import build_live_check_sensor
from sis_platform.sensors.notify import build_notify_sensors
from sis_platform.sensors.partition_retirement import build_partition_retirement_sensor
from sis_platform.sensors.queue_sensor import build_queue_sensor
from sis_platform.sensors.run_retention import build_run_retention_sensor
from sis_platform.sensors.serving_reporter import build_serving_reporter
from sis_platform.settings import Settings, load_settings


class IntakeDefinitions(NamedTuple):
    """What one intake mode adds to the code location."""

    assets: Sequence[dg.AssetSpec]
    asset_checks: Sequence[dg.AssetChecksDefinition]
    jobs: Sequence[dg.UnresolvedAssetJobDefinition]
    sensors: Sequence[dg.SensorDefinition]


def intake_definitions(settings: Settings) -> IntakeDefinitions:
    """The sensors, and for live intake the serving store's asset, checks and check job, of
    the configured intake mode."""
    retain = settings.retention.partition_retain_days
    if settings.intake == "sensor":
        return IntakeDefinitions(
            [],
            [],
            [],
            [
                build_queue_sensor(settings.sensor_interval_seconds),
                build_partition_retirement_sensor(retain, live=False),
            ],
        )
    live = settings.live
    return IntakeDefinitions(
        assets=[serving_store_spec(settings.serving.url)],
        asset_checks=[live_matches_lake, live_store_fresh],
        jobs=[live_matches_lake_job],
        sensors=[
            build_landed_batches_sensor(settings.sensor_interval_seconds),
            build_serving_reporter(live.report_seconds, live.max_lag_seconds),
            build_live_check_sensor(),
            build_partition_retirement_sensor(retain, live=True),
        ],
    )


def build_definitions(
    settings_or_env: Settings | Mapping[str, str] | None = None,
) -> dg.Definitions:
    """The platform's definitions, configured by the settings (or a mapping of SIS_* variables;
    by default the process environment), read once."""
    settings = config.settings_of(settings_or_env)
    intake = intake_definitions(settings)
    checks = settings.checks
    fresh = freshness_policy(checks.freshness_warn_seconds, checks.freshness_fail_seconds)
    return dg.Definitions(
        assets=[
            raw_messages,
            message_items,
            *with_freshness([fold_masters, interpreted_model], fresh),
            *intake.assets,
        ],
        asset_checks=[hash_chain_intact, lake_integrity, lake_files, *intake.asset_checks],
        jobs=[process_batch_job, replay_dead_letters_job, check_lake_job, *intake.jobs],
        schedules=[check_lake_schedule],
        sensors=[
            *intake.sensors,
            build_run_retention_sensor(settings.retention.run_retain_days),
            *notify_sensors(settings),
        ],
        resources=config.resources(settings),
    )


def notify_sensors(settings: Settings) -> list[dg.SensorDefinition]:
    """The webhook notifications of failed runs and checks, when a webhook is configured."""
    url = settings.notify.webhook_url
    return build_notify_sensors(url) if url is not None else []


@dg.definitions
def defs() -> dg.Definitions:
    """The code location as Dagster loads it (the webserver's and the daemon's code servers,
    every run worker): what these processes write is private to their user."""
    private_files()
    settings = load_settings()
    private_folder(settings.data_dir, create=False)
    return build_definitions(settings)
