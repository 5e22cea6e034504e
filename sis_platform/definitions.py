"""The code location: every asset, check, job, sensor and resource of the platform."""

from __future__ import annotations

from collections.abc import Mapping

import dagster as dg

from sis_platform import config
from sis_platform.assets.masters import fold_masters
from sis_platform.assets.message_log import hash_chain_intact, message_items, raw_messages
from sis_platform.assets.model import interpreted_model
from sis_platform.jobs import process_batch_job, replay_dead_letters_job
from sis_platform.sensors.queue_sensor import build_queue_sensor
from sis_platform.settings import Settings


def build_definitions(
    settings_or_env: Settings | Mapping[str, str] | None = None,
) -> dg.Definitions:
    """The platform's definitions, configured by the settings (or a mapping of SIS_* variables;
    by default the process environment), read once."""
    settings = config.settings_of(settings_or_env)
    return dg.Definitions(
        assets=[raw_messages, message_items, fold_masters, interpreted_model],
        asset_checks=[hash_chain_intact],
        jobs=[process_batch_job, replay_dead_letters_job],
        sensors=[build_queue_sensor(settings.sensor_interval_seconds)],
        resources=config.resources(settings),
    )


@dg.definitions
def defs() -> dg.Definitions:
    return build_definitions()
