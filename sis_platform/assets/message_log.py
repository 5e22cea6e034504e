"""The message log (raw_messages) and its parsed, split form (message_items), per batch."""


import dagster as dg
from dagster_pyspark import LazyPySparkResource

from sis_platform.assets.partitions import batches_partitions
from sis_platform.assets.policies import TRANSIENT_RETRY
from sis_platform.lake.tables import MESSAGE_ITEMS, RAW_MESSAGES
from sis_platform.landing import GENESIS_LINK, batch_key, batch_seq_of
from sis_platform.resources.platform import (
    DeltaLakeResource,
    FeedProcessingResource,
    LandingZoneResource,
)
from sis_platform.spark.items import batch_condition, log_items

CHAIN_CHECK = "hash_chain_intact"


@dg.asset(
    partitions_def=batches_partitions,
    group_name="message_log",
    kinds={"spark", "delta"},
    retry_policy=TRANSIENT_RETRY,
    check_specs=[
        dg.AssetCheckSpec(
            CHAIN_CHECK,
            asset="raw_messages",
            description="Every message of the batch is unchanged and the hash chain runs "
            "unbroken from the previous batch's last link.",
        )
    ],
)
def raw_messages(
    context: dg.AssetExecutionContext,
    spark: LazyPySparkResource,
    lake: DeltaLakeResource,
    landing: LandingZoneResource,
) -> dg.MaterializeResult:
    """The message log: one row per message as landed from the queue: message id, put time,
    delivery count, the original bytes, and its hash chain link. Written once per batch from
    the immutable landing file; re-materializing rewrites the same rows."""
    from pyspark.sql import functions as F

    from sis_platform.spark.chain import verify_log

    key = context.partition_key
    session = spark.spark_session
    lk = lake.lake(session)
    lk.ensure(RAW_MESSAGES)
    zone = landing.zone()
    landed = session.read.parquet(str(zone.batch_path(key)))
    rows = landed.select(
        *[F.col(f.name).cast(f.dataType).alias(f.name) for f in RAW_MESSAGES.schema().fields]
    )
    lk.replace_where(RAW_MESSAGES, rows, batch_condition(key))

    written = lk.read(RAW_MESSAGES).where(batch_condition(key))
    seq = batch_seq_of(key)
    previous = batch_key(seq - 1)
    if seq == 1:
        first_prev = GENESIS_LINK.hex()
    else:
        table = zone.read(previous)
        first_prev = table.column("chain_link")[-1].as_py()
    report = verify_log(written, first_prev)
    stats = written.agg(
        F.count("*").alias("n"),
        F.sum(F.length("body")).alias("bytes"),
        F.sum(F.when(F.col("delivery_count") > 1, 1).otherwise(0)).alias("redelivered"),
        F.min("put_time").alias("first_put"),
        F.max("put_time").alias("last_put"),
    ).first()
    assert stats is not None
    context.log.info(f"batch {key}: {stats['n']} message(s) logged")
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": int(stats["n"]),
            "bytes": int(stats["bytes"] or 0),
            "redelivered": int(stats["redelivered"] or 0),
            "first_put_time": str(stats["first_put"]),
            "last_put_time": str(stats["last_put"]),
            "table": dg.MetadataValue.path(lk.path(RAW_MESSAGES)),
            "landing_file": dg.MetadataValue.path(str(zone.batch_path(key))),
        },
        check_results=[
            dg.AssetCheckResult(
                check_name=CHAIN_CHECK,
                passed=report.intact,
                severity=dg.AssetCheckSeverity.ERROR,
                metadata={
                    "messages_checked": report.messages,
                    "problems": dg.MetadataValue.md(
                        "\n".join(f"- {p}" for p in report.problems) or "none"
                    ),
                },
            )
        ],
    )


@dg.asset(
    partitions_def=batches_partitions,
    group_name="message_log",
    kinds={"spark", "delta"},
    deps=[raw_messages],
    retry_policy=TRANSIENT_RETRY,
)
def message_items(
    context: dg.AssetExecutionContext,
    spark: LazyPySparkResource,
    lake: DeltaLakeResource,
    processing: FeedProcessingResource,
) -> dg.MaterializeResult:
    """Each logged message parsed, validated against the Sportsdata schema and split into one
    item per master id it lists (message id, master id, position, payload). A message that is
    not valid becomes a single `invalid` row with its reason code, to be dead-lettered by the
    fold. Deduplication by message id happens in the fold, across batches, in feed order."""
    lk = lake.lake(spark.spark_session)
    summary = log_items(
        lk, context.partition_key,
        limits=processing.limits(),
        redelivery_limit=processing.redelivery_limit,
        run_id=context.run.run_id,
    )
    digest, messages, n_items, invalid = (
        summary.digest, summary.messages, summary.items, summary.invalid_by_reason
    )
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": n_items + sum(invalid.values()),
            "messages": messages,
            "items": n_items,
            "invalid_messages": sum(invalid.values()),
            "invalid_by_reason": dg.MetadataValue.json(invalid),
            "items_digest": digest,
            "table": dg.MetadataValue.path(lk.path(MESSAGE_ITEMS)),
        }
    )
