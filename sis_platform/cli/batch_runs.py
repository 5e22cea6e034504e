"""What Dagster's own storage holds of the message log: the batches registered as partitions
and the anchored chain head and message count each feed batch run was tagged with
(sis_platform/sensors/batch_runs.py). Dagster's storage lies outside the data folder, so
`sis-verify-log` compares these copies with the folder's anchors and visits every batch Dagster
knows of, which a truncated or rolled-back folder no longer has."""

from __future__ import annotations

import dagster as dg

from sis_platform.assets.message_log import CHAIN_HEAD_TAG, MESSAGES_TAG
from sis_platform.assets.partitions import BATCHES
from sis_platform.lake.spark.chain import RunAnchor
from sis_platform.sensors.batch_runs import BATCH_TAG


class BatchRuns:
    """The batch runs and partitions of one Dagster instance."""

    def __init__(self, instance: dg.DagsterInstance) -> None:
        self.instance = instance

    def batches(self) -> list[str]:
        """The batch partitions Dagster has registered (one per batch: bounded, well under
        100k)."""
        return list(self.instance.get_dynamic_partitions(BATCHES))

    def anchor(self, key: str) -> RunAnchor | None:
        """The chain head and message count batch `key`'s feed run was requested with (the
        latest such run); None when no run of it carries them (a batch landed by hand)."""
        records = self.instance.get_run_records(
            dg.RunsFilter(tags={BATCH_TAG: key}), limit=20, order_by="create_timestamp"
        )
        for record in records:
            tags = record.dagster_run.tags
            if CHAIN_HEAD_TAG in tags and MESSAGES_TAG in tags:
                return RunAnchor(tags[CHAIN_HEAD_TAG], int(tags[MESSAGES_TAG]))
        return None
