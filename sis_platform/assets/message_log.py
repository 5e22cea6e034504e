"""The message log (raw_messages), its integrity check, and its parsed, split form
(message_items, with the per-batch summary batch_log and the record of classify attempts that
died, classify_failures): assets partitioned by landing batch."""

import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import dagster as dg
from dagster_pyspark import LazyPySparkResource

from sis_platform.assets.partitions import batches_partitions
from sis_platform.assets.policies import TRANSIENT_RETRY
from sis_platform.assets.run_tags import CHAIN_HEAD_TAG, MESSAGES_TAG, run_batches
from sis_platform.assets.table_specs import KINDS, OWNERS, column_schema, location, table_spec
from sis_platform.lake.delta import Lake
from sis_platform.lake.spark.chain import RunAnchor, verify_batches
from sis_platform.lake.spark.items import ItemsSummary, log_items, logged_condition
from sis_platform.lake.tables import BATCH_LOG, CLASSIFY_FAILURES, MESSAGE_ITEMS, RAW_MESSAGES
from sis_platform.lake.upkeep import compact_blocks
from sis_platform.log.landing import batch_seq_of
from sis_platform.log.landing.catalog import BatchFigures
from sis_platform.log.landing.signed import tail_problems
from sis_platform.resources.platform import (
    DeltaLakeResource,
    FeedProcessingResource,
    LandingZoneResource,
)
from sis_platform.runtime.logs import concerning

CHAIN_CHECK = "hash_chain_intact"
# The check's problems listed in its metadata (all are counted; a run over many batches of a
# broken log could find thousands).
PROBLEMS_SHOWN = 50


@dg.asset(
    partitions_def=batches_partitions,
    group_name="message_log",
    kinds=KINDS,
    owners=OWNERS,
    metadata={"dagster/column_schema": column_schema(RAW_MESSAGES)},
    retry_policy=TRANSIENT_RETRY,
)
def raw_messages(
    context: dg.AssetExecutionContext,
    spark: LazyPySparkResource,
    lake: DeltaLakeResource,
    landing: LandingZoneResource,
) -> dg.MaterializeResult:
    """The message log: one row per message as landed from the queue: message id, put time,
    delivery count, the original bytes (or, for a body over SIS_MAX_MESSAGE_BYTES, its size and
    where intake moved it), and its hash chain link. Written once per batch from the immutable
    landing file (or the parts of a batch landed in groups); re-materializing rewrites the same
    rows. A run over a range of batches (a backlog) writes them all in one commit. Its check
    `hash_chain_intact` verifies the rows and the landing file against the batch's anchors."""
    keys = context.partition_keys
    session = spark.spark_session
    lk = lake.lake(session)
    lk.ensure(RAW_MESSAGES)
    zone = landing.zone()
    # Each batch's file, or its parts (a batch landed in groups), read with the table's schema
    # (the landing files' own, log/landing/rows.py): no file's footer is read to infer it.
    files = [str(p) for key in keys for p in zone.catalog.landed_files(key)]
    rows = session.read.schema(RAW_MESSAGES.schema()).parquet(*files)
    lk.replace_where(RAW_MESSAGES, rows, logged_condition(keys))
    compact_blocks(lk, RAW_MESSAGES, map(batch_seq_of, keys), lk.upkeep)

    # The rows just written are the landing files' rows: counted there, without a Spark job.
    figures = BatchFigures.total([zone.catalog.figures(key) for key in keys])
    what = f"batch {keys[0]}" if len(keys) == 1 else f"batches {keys[0]}..{keys[-1]}"
    context.log.info(f"{what}: {figures.messages} message(s) logged", extra=concerning(batch=what))
    return dg.MaterializeResult(
        metadata={
            # One materialization per partition of the run, each with the run's figures: the
            # row count only when they are one batch's.
            **({"dagster/row_count": figures.messages} if len(keys) == 1 else {}),
            "batches_in_run": len(keys),
            "messages_in_run": figures.messages,
            "bytes": figures.body_bytes,
            "moved_aside": figures.moved_aside,
            "redelivered": figures.redelivered,
            "first_put_time": str(figures.first_put),
            "last_put_time": str(figures.last_put),
            **location(lk, RAW_MESSAGES),
            "landing_file": dg.MetadataValue.path(str(zone.catalog.batch_location(keys[-1]))),
        },
    )


def _hash_chain_intact(
    context: dg.AssetCheckExecutionContext,
    spark: LazyPySparkResource,
    lake: DeltaLakeResource,
    landing: LandingZoneResource,
) -> dg.AssetCheckResult:
    keys = context.partition_keys
    zone = landing.zone()
    verdicts = verify_batches(
        lake.lake(spark.spark_session), zone, keys, run_anchor=run_anchor(context.run.tags, keys)
    )
    # The log's tail against the witness outside the data folder: every batch's check fails
    # while the log is truncated or rolled back, so nothing downstream reads it meanwhile.
    tail = tail_problems(zone.catalog)
    problems = [p for v in verdicts for p in v.problems] + list(tail)
    # The first problem that names a message, else the first.
    first = next(
        (p for p in problems if p.message_id is not None), problems[0] if problems else None
    )
    if first is not None:
        failed = [v.batch_key for v in verdicts if not v.intact] or [keys[-1]]
        context.log.error(
            f"message log batch(es) {', '.join(failed[:10])}: {len(problems)} problem(s), "
            f"first: {first}",
            extra=concerning(batch=failed[0]),
        )
    return dg.AssetCheckResult(
        passed=not problems,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "batches_checked": len(keys),
            "messages_checked": sum(v.messages for v in verdicts),
            "problems": dg.MetadataValue.md(
                "\n".join(f"- {p}" for p in problems[:PROBLEMS_SHOWN]) or "none"
            ),
            "first_problem_message_id": (first.message_id or "") if first else "",
            "run_anchor_compared": run_anchor(context.run.tags, keys) is not None,
        },
    )


def run_anchor(tags: Mapping[str, str], keys: Sequence[str]) -> RunAnchor | None:
    """The anchor the run of `keys` was requested with (its tags name the last batch's), or
    None: a run requested without one (from the UI, a backfill)."""
    batches = run_batches(tags)
    if (
        batches is None
        or batches.last != keys[-1]
        or CHAIN_HEAD_TAG not in tags
        or MESSAGES_TAG not in tags
    ):
        return None
    return RunAnchor(tags[CHAIN_HEAD_TAG], int(tags[MESSAGES_TAG]))


# A check of its own (not computed inside raw_messages) so it can be run again at any time from
# the UI, and partitioned like its asset (Dagster 1.13 runs a partitioned check per partition).
# Blocking: message_items does not read a batch whose log fails it. A partitioned check is a
# preview feature in Dagster 1.13, chosen knowingly: its PreviewWarning, which every process
# loading the definitions (each run worker) would print, is silenced here and only here.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", dg.PreviewWarning)
    hash_chain_intact = dg.asset_check(
        asset=raw_messages,
        name=CHAIN_CHECK,
        blocking=True,
        partitions_def=batches_partitions,
        description="The batch's rows in raw_messages and its landing file both hold exactly "
        "the anchored messages, every logged field unchanged, in order, and the hash chain runs "
        "unbroken from the previous batch's anchored head to this batch's anchored head; its "
        "anchor is signed with the log key, and the log reaches, unchanged, the last sealed "
        "batch its witness (outside the data folder) recorded.",
    )(_hash_chain_intact)


@dg.multi_asset(
    specs=[
        table_spec(
            MESSAGE_ITEMS,
            "Each logged message parsed, validated against the Sportsdata schema and split into "
            "one item per master id it lists (message id, master id, position, payload). A "
            "message that is not valid becomes a single `invalid` row with its reason code, to "
            "be dead-lettered by the fold. Deduplication by message id happens in the fold, "
            "across batches, in feed order.",
            deps=[raw_messages.key.to_user_string()],
        ),
        table_spec(
            BATCH_LOG,
            "One row per classified batch: its message, item and invalid-message counts and "
            "the digest of its items. The fold reads it to find the batches it can fold, and "
            "to notice a batch whose items changed since it was folded (a backfill after a fix).",
            deps=[MESSAGE_ITEMS.name],
        ),
        table_spec(
            CLASSIFY_FAILURES,
            "The messages a classification attempt was working on when its worker died or ran "
            "over SIS_ITEM_BUDGET_SECONDS, one row per message and attempt. Rows appear only "
            "when an attempt fails; the next attempt reads them to dead-letter a message that "
            "keeps killing its worker.",
            deps=[raw_messages.key.to_user_string()],
        ),
    ],
    partitions_def=batches_partitions,
    group_name="message_log",
    retry_policy=TRANSIENT_RETRY,
)
def message_items(
    context: dg.AssetExecutionContext,
    spark: LazyPySparkResource,
    lake: DeltaLakeResource,
    processing: FeedProcessingResource,
    landing: LandingZoneResource,
) -> Iterator[dg.MaterializeResult]:
    """Classify the run's batches (one, or a range in one Spark job): message_items and their
    batch_log rows (classify_failures gains rows only from attempts that died)."""
    lk = lake.lake(spark.spark_session)
    keys = context.partition_keys
    summaries = log_items(
        lk,
        keys,
        limits=processing.limits(),
        redelivery_limit=processing.redelivery_limit,
        run_id=context.run.run_id,
        quarantine_after=processing.quarantine_after,
        landing_root=landing.root,
    )
    for name, metadata in classified(lk, ItemsSummary.total(list(summaries.values()))).items():
        if len(keys) > 1:  # each partition's materialization carries the run's figures
            metadata = {k: v for k, v in metadata.items() if k != "dagster/row_count"}
            metadata["batches_in_run"] = len(keys)
        yield dg.MaterializeResult(asset_key=name, metadata=metadata)
    yield dg.MaterializeResult(
        asset_key=CLASSIFY_FAILURES.name, metadata=location(lk, CLASSIFY_FAILURES)
    )


def classified(lake: Lake, summary: ItemsSummary) -> dict[str, dict[str, Any]]:
    """The metadata of one batch's classification, by the table it wrote: message_items and
    batch_log (a dead-letter replay reports the batches it classifies again with it too)."""
    invalid = summary.invalid_by_reason
    counts = {
        "messages": summary.messages,
        "items": summary.items,
        "invalid_messages": sum(invalid.values()),
        "items_digest": summary.digest,
    }
    return {
        MESSAGE_ITEMS.name: {
            "dagster/row_count": summary.items + sum(invalid.values()),
            **counts,
            "invalid_by_reason": dg.MetadataValue.json(invalid),
            **location(lake, MESSAGE_ITEMS),
        },
        BATCH_LOG.name: {**counts, **location(lake, BATCH_LOG)},
    }
