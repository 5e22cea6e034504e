"""Jobs: the per-batch job the sensor requests, and dead-letter replay.

No `from __future__ import annotations`: Dagster reads the op's `context` and `config`
annotations at definition time.
"""

from collections.abc import Iterator

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from sis_platform.assets.masters import FOLD_POOL, fold_masters, interpreted_model
from sis_platform.assets.message_log import message_items, raw_messages
from sis_platform.assets.policies import TRANSIENT_RETRY
from sis_platform.landing import batch_key
from sis_platform.resources.platform import (
    DeltaLakeResource,
    FeedProcessingResource,
    LandingZoneResource,
)

# One process and one Spark session per run: the in-process executor runs every step of the
# batch in the run's own process, instead of starting a JVM per step.
process_batch_job = dg.define_asset_job(
    "process_batch",
    selection=dg.AssetSelection.assets(
        raw_messages, message_items, fold_masters, interpreted_model
    ),
    executor_def=dg.in_process_executor,
    description="Log, parse and split one landing batch, fold it into the master documents "
    "and refresh the interpreted model.",
)


class ReplayConfig(dg.Config):
    reasons: list[str] = Field(
        default_factory=list,
        description="Replay only dead letters with these reason codes (all when empty).",
    )
    batches: list[str] = Field(
        default_factory=list,
        description="Replay only dead letters of these batches (partition keys; all when empty).",
    )


@dg.op(name="replay", out={}, pool=FOLD_POOL, retry_policy=TRANSIENT_RETRY)
def replay_op(
    context: dg.OpExecutionContext,
    config: ReplayConfig,
    spark: LazyPySparkResource,
    lake: DeltaLakeResource,
    processing: FeedProcessingResource,
    landing: LandingZoneResource,
) -> Iterator[dg.AssetMaterialization]:
    """Classify the batches holding the selected dead letters again with the code and settings
    deployed now, and rewind and refold the masters they touch, in feed order."""
    from sis_platform.spark.model import refresh_model
    from sis_platform.spark.replay import replay_dead_letters as replay

    processing.compiled_selector()
    lk = lake.lake(spark.spark_session)
    relogged: list[dg.AssetMaterialization] = []
    result = replay(
        lk,
        reasons=config.reasons,
        batch_keys=config.batches,
        limits=processing.limits(),
        redelivery_limit=processing.redelivery_limit,
        selector=processing.selector,
        quarantine_after=processing.quarantine_after,
        run_id=context.run.run_id,
        landing_root=landing.root,
        on_relogged=lambda key, s: relogged.append(
            dg.AssetMaterialization(
                "message_items",
                partition=key,
                description="classified again by a dead-letter replay",
                metadata={
                    "items": s.items,
                    "invalid_by_reason": s.invalid_by_reason,
                    "items_digest": s.digest,
                },
            )
        ),
    )
    yield from relogged
    step = result.step
    context.log.info(
        f"replayed {result.dead_letters} dead letter(s) from {len(result.batches)} batch(es); "
        f"{step.rewound_masters} master(s) rewound and refolded"
        + (
            f" in fold step {step.fold_step}: {step.applied} applied, {step.dead_lettered} "
            f"dead-lettered"
            if step.fold_step is not None
            else "; nothing to refold"
        )
    )
    if step.fold_step is None:
        return
    partition = batch_key(step.last_batch_seq) if step.last_batch_seq else None
    for asset in ("master_documents", "master_versions", "dead_letters", "message_outcomes"):
        yield dg.AssetMaterialization(
            asset,
            partition=partition,
            description="refolded by a dead-letter replay",
            metadata={
                "fold_step": step.fold_step,
                "rewound_masters": step.rewound_masters,
                "applied": step.applied,
                "dead_lettered": step.dead_lettered,
            },
        )
    model = refresh_model(lk)
    for asset, rows in (
        ("events", model.events),
        ("markets", model.markets),
        ("selections", model.selections),
    ):
        yield dg.AssetMaterialization(
            asset, partition=partition, metadata={"fold_step": model.fold_step, "rows": rows}
        )


@dg.job(
    name="replay_dead_letters",
    executor_def=dg.in_process_executor,
    tags={"sis/kind": "replay"},
    description="Replay dead letters after a fix: classify their batches again, rewind the "
    "masters they touch and refold them in feed order (config: reasons, batches).",
)
def replay_dead_letters_job() -> None:
    replay_op()
