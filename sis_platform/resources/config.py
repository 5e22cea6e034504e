"""Settings to Dagster resources: what the platform's code location is configured with.

`resources()` takes the platform's `Settings` (sis_platform/settings/, which reads and checks
the environment) or a plain mapping of `SIS_*` variables, and builds the typed resources of
sis_platform/resources/. `SIS_PROFILE` picks the source and Spark: `local` (default: embedded
queue, local Spark, local Delta), `activemq` (STOMP broker), `ibmmq` (IBM MQ through pymqi),
`cluster` (embedded or any source, Spark at SIS_SPARK_MASTER, Delta at SIS_LAKE_PATH). The
serving store's resource holds its URL (SIS_SERVING_URL), never its password.
Secrets are bound as `dg.EnvVar`, so they are read at run time and never stored in the code
location's configuration snapshot. docs/configuration.md lists every variable.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import dagster as dg

from sis_platform.lake.driver.conf import delta_spark_config
from sis_platform.lake.driver.jars import resolved_jars_dir
from sis_platform.lake.driver.jvm_archive import configured_archive
from sis_platform.resources.platform import (
    DeltaLakeResource,
    FeedChecksResource,
    FeedProcessingResource,
    LandingZoneResource,
)
from sis_platform.resources.serving import ServingStoreResource
from sis_platform.resources.sources import (
    EmbeddedQueueResource,
    IbmMqQueueResource,
    QueueSourceResource,
    StompQueueResource,
)
from sis_platform.resources.spark import DeltaSparkResource
from sis_platform.settings import (
    LOG_KEY_VARIABLE,
    ConfigurationError,
    EmbeddedSourceSettings,
    Settings,
    SourceSettings,
    SparkSettings,
    StompSourceSettings,
    load_settings,
)

# Re-exported: callers of resources() catch config.ConfigurationError.
__all__ = [
    "ConfigurationError",
    "queue_resource",
    "resources",
    "shared_spark_session",
    "spark_config",
]


def settings_of(settings_or_env: Settings | Mapping[str, str] | None) -> Settings:
    """`settings_or_env` as settings: loaded from a mapping of SIS_* variables, or from the
    process environment when None."""
    if isinstance(settings_or_env, Settings):
        return settings_or_env
    return load_settings(settings_or_env)


def resources(settings_or_env: Settings | Mapping[str, str] | None = None) -> dict[str, Any]:
    """The resources the settings (or the variables) configure."""
    settings = settings_of(settings_or_env)
    spark = settings.spark
    master = spark.master
    if master.startswith("sc://"):
        master = shared_spark_session(master, settings.lake_path)
    batch = settings.batch
    processing = settings.processing
    return {
        "queue": queue_resource(settings.source),
        "landing": LandingZoneResource(
            root=settings.landing_dir,
            max_messages=batch.max_messages,
            max_bytes=batch.max_bytes,
            max_seconds=batch.max_seconds,
            get_wait_seconds=batch.get_wait_seconds,
            max_runs_in_flight=batch.max_runs_in_flight,
            deployment=batch.deployment,
            lease_seconds=batch.lease_seconds,
            **_log_fields(settings),
        ),
        "lake": DeltaLakeResource(
            base_path=settings.lake_path,
            optimize_every=settings.upkeep.optimize_every,
            vacuum_every=settings.upkeep.vacuum_every,
            retain_hours=settings.upkeep.retain_hours,
            max_files=settings.upkeep.max_files,
        ),
        "processing": FeedProcessingResource(
            **asdict(settings.limits),
            redelivery_limit=processing.redelivery_limit,
            quarantine_after=processing.quarantine_after,
            dedup_window_batches=processing.dedup_window_batches,
            selector=processing.selector,
            priority=processing.priority,
        ),
        "spark": DeltaSparkResource(
            spark_config=spark_config(spark, master),
            scratch_dir=spark.scratch_dir,
        ),
        "feed_checks": FeedChecksResource(
            lake_lag_warn_seconds=settings.checks.lake_lag_warn_seconds,
            lake_lag_fail_seconds=settings.checks.lake_lag_fail_seconds,
            dead_letter_rate_warn=settings.checks.dead_letter_rate_warn,
        ),
        # Read by the serving store's reporter and checks (live intake); the URL only. The fold
        # records the lake's progress in it only where a sis-live keeps it.
        "serving": ServingStoreResource(
            url=settings.serving.url,
            max_lag_seconds=settings.live.max_lag_seconds,
            records_lake_progress=settings.intake == "live",
        ),
    }


def _log_fields(settings: Settings) -> dict[str, Any]:
    """The landing zone resource's log key and witness: the key bound as `dg.EnvVar` when
    SIS_LOG_KEY is set (never a value in configuration), else the key file's path."""
    log = settings.log
    if log is None:
        return {}
    return {
        "log_key": dg.EnvVar(LOG_KEY_VARIABLE) if log.has_key else None,
        "log_key_file": str(log.key_file),
        "create_log_key": log.create_key,
        "log_witness": str(log.witness),
    }


def queue_resource(source: SourceSettings) -> QueueSourceResource:
    """The configured queue source. The backout settings apply to every source (on IBM MQ the
    queue's own BOTHRESH and BOQNAME come first)."""
    if isinstance(source, EmbeddedSourceSettings):
        return EmbeddedQueueResource(
            path=source.path,
            queue=source.queue,
            backout_threshold=source.backout.threshold,
            backout_queue=source.backout.queue,
        )
    if isinstance(source, StompSourceSettings):
        return StompQueueResource(
            host=source.host,
            port=source.port,
            destination=source.destination,
            user=source.user,
            password=dg.EnvVar("SIS_STOMP_PASSWORD") if source.has_password else None,
            selector=source.selector,
            prefetch=source.prefetch,
            heartbeats=list(source.heartbeats),
            vhost=source.vhost,
            backout_threshold=source.backout.threshold,
            backout_queue=source.backout.queue,
            redelivery_counts=source.redelivery_counts,
            tls=source.tls,
            ca_file=source.ca_file,
            cert_file=source.cert_file,
            key_file=source.key_file,
            key_password=dg.EnvVar("SIS_STOMP_KEY_PASSWORD") if source.has_key_password else None,
            allow_plaintext_credentials=source.allow_plaintext_credentials,
        )
    return IbmMqQueueResource(
        queue_manager=source.queue_manager,
        channel=source.channel,
        conn_name=source.conn_name,
        queue=source.queue,
        user=source.user,
        password=dg.EnvVar("SIS_IBMMQ_PASSWORD") if source.has_password else None,
        cipher_spec=source.cipher_spec,
        key_repository=source.key_repository,
        certificate_label=source.certificate_label,
        ssl_peer_name=source.ssl_peer_name,
        client_reconnect=source.client_reconnect,
        backout_threshold=source.backout.threshold,
        backout_queue=source.backout.queue,
        max_get_bytes=source.max_get_bytes,
    )


def spark_config(spark: SparkSettings, master: str, *, long_lived: bool = False) -> dict[str, str]:
    """The Spark settings for a driver (or Spark Connect client) at `master`: the platform's
    runs, and (`long_lived`) the local Spark Connect server (cli/spark_connect.py) or a
    process that runs batch after batch on one driver."""
    try:
        class_archive = configured_archive(spark.class_archive)
    except ValueError as error:
        raise ConfigurationError(str(error)) from None
    return delta_spark_config(
        master=master,
        driver_memory=spark.driver_memory,
        shuffle_partitions=spark.shuffle_partitions,
        ui_enabled=spark.ui_enabled,
        # An operator's folder, else the one sis-spark-jars resolved (else Spark's resolver).
        jars_dir=spark.jars_dir or resolved_jars_dir(),
        class_archive=class_archive,
        long_lived=long_lived,
        extra=dict(spark.extra_conf),
    )


def shared_spark_session(remote: str, lake_path: str) -> str:
    """The Spark Connect URL with the deployment's one server session (unless it names one).

    Every run of a deployment joins the same session, named after its lake: an operation on a
    Spark Connect server outlives a client that dies, and only within one session can the next
    fold writer interrupt what a killed run left running (Lake.claim_writer). So the session
    must outlive the runs: the platform never stops it, and the server keeps an idle session
    for as long as sis-spark-connect tells it to (a closed session's id cannot be used again).
    """
    url = remote.rstrip("/")
    if ";session_id=" in url:
        return remote
    session = uuid.uuid5(uuid.NAMESPACE_URL, f"sis-platform:{lake_path}")
    return f"{url};session_id={session}" if "/;" in url else f"{url}/;session_id={session}"
