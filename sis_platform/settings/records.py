"""The typed records `load_settings` returns: one frozen dataclass per section."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sis_platform.domain.limits import Limits
from sis_platform.settings.transport import listen_address
from sis_platform.settings.variables import (
    DEFAULT_BACKOUT_THRESHOLD,
    DEFAULT_BATCH_MAX_BYTES,
    DEFAULT_BATCH_MAX_MESSAGES,
    DEFAULT_BATCH_MAX_SECONDS,
    DEFAULT_DEAD_LETTER_RATE_WARN,
    DEFAULT_DEDUP_WINDOW_BATCHES,
    DEFAULT_DRIVER_MEMORY,
    DEFAULT_FRESHNESS_FAIL_SECONDS,
    DEFAULT_FRESHNESS_WARN_SECONDS,
    DEFAULT_GET_WAIT_SECONDS,
    DEFAULT_IBMMQ_RECONNECT,
    DEFAULT_LAKE_LAG_FAIL_SECONDS,
    DEFAULT_LAKE_LAG_WARN_SECONDS,
    DEFAULT_LAKE_MAX_FILES,
    DEFAULT_LAKE_OPTIMIZE_EVERY,
    DEFAULT_LAKE_RETAIN_HOURS,
    DEFAULT_LAKE_VACUUM_EVERY,
    DEFAULT_LANDING_MERGE_GRACE_SECONDS,
    DEFAULT_LANDING_RETAIN_DAYS,
    DEFAULT_LEASE_SECONDS,
    DEFAULT_LIVE_BATCH_SECONDS,
    DEFAULT_LIVE_FOLD_WORKERS,
    DEFAULT_LIVE_GROUP_MAX_MESSAGES,
    DEFAULT_LIVE_GROUP_WAIT_MS,
    DEFAULT_LIVE_MAX_LAG_SECONDS,
    DEFAULT_LIVE_MAX_MASTERS,
    DEFAULT_LIVE_PRIORITY_WINDOW,
    DEFAULT_LIVE_REPORT_SECONDS,
    DEFAULT_LIVE_STALL_SECONDS,
    DEFAULT_MAX_RUNS_IN_FLIGHT,
    DEFAULT_METRICS_ADDRESS,
    DEFAULT_PARTITION_RETAIN_DAYS,
    DEFAULT_QUARANTINE_AFTER,
    DEFAULT_QUEUE_NAME,
    DEFAULT_REDELIVERY_LIMIT,
    DEFAULT_RUN_RETAIN_DAYS,
    DEFAULT_SENSOR_INTERVAL_SECONDS,
    DEFAULT_SERVING_HISTORY_DAYS,
    DEFAULT_SHUFFLE_PARTITIONS,
    DEFAULT_SPARK_MASTER,
    DEFAULT_STOMP_DESTINATION,
    DEFAULT_STOMP_HEARTBEATS,
    DEFAULT_STOMP_HOST,
    DEFAULT_STOMP_PORT,
    DEFAULT_STOMP_PREFETCH,
    IbmMqReconnect,
    IntakeMode,
    LogFormat,
)

# The default of SIS_METRICS_ADDRESS, parsed (sis_platform/settings/transport.py).
METRICS_ADDRESS = listen_address(DEFAULT_METRICS_ADDRESS)


class ConfigurationError(ValueError):
    """A setting that cannot be used; the message names the variable and what it accepts."""


# -- the records ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Backout:
    """MQ's BOTHRESH and BOQNAME, on every source: a message backed out `threshold` times (0:
    off) is moved to `queue` (None: the source's default) instead of being delivered again."""

    threshold: int = DEFAULT_BACKOUT_THRESHOLD
    queue: str | None = None


@dataclass(frozen=True)
class EmbeddedSourceSettings:
    path: str
    queue: str = DEFAULT_QUEUE_NAME
    backout: Backout = field(default_factory=Backout)


@dataclass(frozen=True)
class StompSourceSettings:
    # The SQLite file the source counts redeliveries in (None: in memory, lost with the process).
    redelivery_counts: str | None = None
    host: str = DEFAULT_STOMP_HOST
    port: int = DEFAULT_STOMP_PORT
    destination: str = DEFAULT_STOMP_DESTINATION
    user: str | None = None
    has_password: bool = False  # SIS_STOMP_PASSWORD is set in the environment (value not held)
    selector: str | None = None
    prefetch: int = DEFAULT_STOMP_PREFETCH
    heartbeats: tuple[int, int] = DEFAULT_STOMP_HEARTBEATS
    vhost: str | None = None  # the CONNECT frame's host header (None: the broker's host name)
    backout: Backout = field(default_factory=Backout)
    # TLS (SIS_STOMP_TLS, default: on unless the host is loopback or a TLS file is given); the
    # broker's certificate and host name are always verified. ca_file None: the system's trust.
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    has_key_password: bool = False  # SIS_STOMP_KEY_PASSWORD is set (value not held)
    allow_plaintext_credentials: bool = False


@dataclass(frozen=True)
class IbmMqSourceSettings:
    queue_manager: str
    channel: str
    conn_name: str
    queue: str
    max_get_bytes: int
    user: str | None = None
    has_password: bool = False  # SIS_IBMMQ_PASSWORD is set in the environment (value not held)
    cipher_spec: str | None = None
    key_repository: str | None = None
    certificate_label: str | None = None
    ssl_peer_name: str | None = None
    client_reconnect: IbmMqReconnect = DEFAULT_IBMMQ_RECONNECT
    backout: Backout = field(default_factory=Backout)


SourceSettings = EmbeddedSourceSettings | StompSourceSettings | IbmMqSourceSettings


@dataclass(frozen=True)
class BatchSettings:
    """How the queue sensor lands batches, and the consumer lease it holds meanwhile."""

    deployment: str
    max_messages: int = DEFAULT_BATCH_MAX_MESSAGES
    max_bytes: int = DEFAULT_BATCH_MAX_BYTES
    max_seconds: float = DEFAULT_BATCH_MAX_SECONDS
    get_wait_seconds: float = DEFAULT_GET_WAIT_SECONDS
    max_runs_in_flight: int = DEFAULT_MAX_RUNS_IN_FLIGHT
    lease_seconds: float = DEFAULT_LEASE_SECONDS


@dataclass(frozen=True)
class ProcessingSettings:
    redelivery_limit: int = DEFAULT_REDELIVERY_LIMIT
    quarantine_after: int = DEFAULT_QUARANTINE_AFTER
    dedup_window_batches: int = DEFAULT_DEDUP_WINDOW_BATCHES  # 0: the whole log
    selector: str | None = None
    priority: str | None = None  # SIS_PRIORITY, checked (sis_platform/domain/priority.py)


@dataclass(frozen=True)
class SparkSettings:
    """The Spark driver (or Spark Connect client). `class_archive` is SIS_SPARK_CLASS_ARCHIVE
    as given: a path (checked to be a file), `off`, or None for the built one if any."""

    master: str = DEFAULT_SPARK_MASTER
    driver_memory: str = DEFAULT_DRIVER_MEMORY
    shuffle_partitions: int = DEFAULT_SHUFFLE_PARTITIONS
    ui_enabled: bool = False
    jars_dir: str | None = None
    class_archive: str | None = None
    scratch_dir: str | None = None  # local drivers' scratch files; None: Spark's own (/tmp)
    extra_conf: tuple[tuple[str, str], ...] = ()  # SIS_SPARK_CONF, in order


def is_local_master(master: str) -> bool:
    """`master` (a Spark master URL) is a local driver's: `local`, `local[N]`, `local[*]`."""
    return master.startswith("local")


@dataclass(frozen=True)
class ServingSettings:
    """Where sis-live keeps the serving store: `sqlite:///<path>` or
    `postgresql://user@host:port/db` (its password only in SIS_SERVING_PASSWORD)."""

    url: str
    has_password: bool = False  # SIS_SERVING_PASSWORD is set in the environment (value not held)
    # How long the change log and dead letters are kept (SIS_SERVING_HISTORY_DAYS).
    history_days: float = DEFAULT_SERVING_HISTORY_DAYS


def longest_stretch(group_max_messages: int, priority_window: int, prioritized: bool) -> int:
    """The most messages sis-live folds as one stretch: a group, or with a priority
    (SIS_PRIORITY) a backlog's window (sis_platform/live/applier.py)."""
    return max(group_max_messages, priority_window) if prioritized else group_max_messages


@dataclass(frozen=True)
class LiveSettings:
    """sis-live's group bounds, its in-memory bound, its liveness, and how Dagster watches it."""

    heartbeat_file: Path  # sis_platform/runtime/heartbeat.py
    group_wait_seconds: float = DEFAULT_LIVE_GROUP_WAIT_MS / 1000
    group_max_messages: int = DEFAULT_LIVE_GROUP_MAX_MESSAGES
    max_masters_in_memory: int = DEFAULT_LIVE_MAX_MASTERS
    report_seconds: float = DEFAULT_LIVE_REPORT_SECONDS
    max_lag_seconds: float = DEFAULT_LIVE_MAX_LAG_SECONDS
    batch_seconds: float = DEFAULT_LIVE_BATCH_SECONDS  # the age at which a batch is sealed
    priority_window: int = DEFAULT_LIVE_PRIORITY_WINDOW
    fold_workers: int = DEFAULT_LIVE_FOLD_WORKERS
    stall_seconds: float = DEFAULT_LIVE_STALL_SECONDS  # no beat for longer: restarted
    # how long a merged batch's parts are kept (sis_platform/log/landing/merge.py)
    merge_grace_seconds: float = DEFAULT_LANDING_MERGE_GRACE_SECONDS
    # how long landed batches are kept once the lake has folded and checked them
    # (sis_platform/log/landing/expiry.py)
    landing_retain_days: float = DEFAULT_LANDING_RETAIN_DAYS
    # (host, port) of /metrics, /healthz and /readyz (sis_platform/live/endpoint.py); None: off
    metrics_address: tuple[str, int] | None = METRICS_ADDRESS
    # the OTLP/HTTP URL sis-live's traces are exported to (sis_platform/live/traces.py); None: off
    traces_endpoint: str | None = None


@dataclass(frozen=True)
class NotifySettings:
    """Where Dagster run failures and failed checks are posted (None: nowhere); its bearer
    token only in SIS_NOTIFY_WEBHOOK_TOKEN, read at use (sis_platform/runtime/webhook.py)."""

    webhook_url: str | None = None


@dataclass(frozen=True)
class FeedChecksSettings:
    """The thresholds of the checks that watch the feed (lake lag, dead-letter rate) and the
    freshness windows of master_documents and the model."""

    lake_lag_warn_seconds: float = DEFAULT_LAKE_LAG_WARN_SECONDS
    lake_lag_fail_seconds: float = DEFAULT_LAKE_LAG_FAIL_SECONDS
    dead_letter_rate_warn: float = DEFAULT_DEAD_LETTER_RATE_WARN
    freshness_warn_seconds: float = DEFAULT_FRESHNESS_WARN_SECONDS
    freshness_fail_seconds: float = DEFAULT_FRESHNESS_FAIL_SECONDS


@dataclass(frozen=True)
class RetentionSettings:
    """How long Dagster keeps its own records of the feed: `batches` partitions (of batches
    folded and checked) and finished runs with their event logs, in days."""

    partition_retain_days: float = DEFAULT_PARTITION_RETAIN_DAYS
    run_retain_days: float = DEFAULT_RUN_RETAIN_DAYS


@dataclass(frozen=True)
class LakeUpkeepSettings:
    """Delta upkeep of the fold's and the model's tables (sis_platform/lake/upkeep.py): how
    often a step compacts and vacuums them, how long removed files are kept, and the file count
    the `files_within_bound` check allows a table."""

    optimize_every: int = DEFAULT_LAKE_OPTIMIZE_EVERY  # fold steps; 0: never
    vacuum_every: int = DEFAULT_LAKE_VACUUM_EVERY  # fold steps; 0: never
    retain_hours: float = DEFAULT_LAKE_RETAIN_HOURS
    max_files: int = DEFAULT_LAKE_MAX_FILES


@dataclass(frozen=True)
class LogSettings:
    """Where the message log's anchors are signed and witnessed from (sis_platform/log/seal.py):
    the key file (unless SIS_LOG_KEY holds the key) and the witness file, both outside the data
    folder. `create_key`: the key file is the default one, created for a new log."""

    key_file: Path
    witness: Path
    has_key: bool = False  # SIS_LOG_KEY is set in the environment (value not held)
    create_key: bool = False


@dataclass(frozen=True)
class Settings:
    profile: str
    data_dir: Path
    source: SourceSettings
    batch: BatchSettings
    limits: Limits
    processing: ProcessingSettings
    spark: SparkSettings
    lake_path: str
    landing_dir: str
    serving: ServingSettings
    live: LiveSettings
    intake: IntakeMode = "live"
    sensor_interval_seconds: int = DEFAULT_SENSOR_INTERVAL_SECONDS
    checks: FeedChecksSettings = field(default_factory=FeedChecksSettings)
    upkeep: LakeUpkeepSettings = field(default_factory=LakeUpkeepSettings)
    log: LogSettings | None = None  # None only in hand-built settings: anchors unsigned
    notify: NotifySettings = field(default_factory=NotifySettings)
    log_format: LogFormat = "text"  # SIS_LOG_FORMAT (sis_platform/runtime/logs.py)
    retention: RetentionSettings = field(default_factory=RetentionSettings)
