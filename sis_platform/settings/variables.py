"""Every `SIS_*` variable the platform reads, and each setting's default (the one place each is
set, with the reason beside it)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from sis_platform.domain.dedup import DEFAULT_DEDUP_WINDOW_BATCHES as DOMAIN_DEDUP_WINDOW_BATCHES
from sis_platform.domain.limits import DEFAULT_LIMITS as DEFAULT_LIMITS

PROFILES = ("local", "activemq", "ibmmq", "cluster")
SOURCES = ("embedded", "stomp", "ibmmq")
IBMMQ_RECONNECT = ("disabled", "as_def", "any", "qmgr")
IbmMqReconnect = Literal["disabled", "as_def", "any", "qmgr"]
SETTINGS_FILE_VARIABLE = "SIS_SETTINGS_FILE"

# -- defaults: the one place each is set --------------------------------------------------

DEFAULT_PROFILE = "local"
DEFAULT_DATA_DIR = "data"
DEFAULT_QUEUE_NAME = "SPORTSDATA"
DEFAULT_STOMP_HOST = "127.0.0.1"
DEFAULT_STOMP_PORT = 61613
DEFAULT_STOMP_DESTINATION = "/queue/SPORTSDATA"
# Half of it is the batch the STOMP session ACKs at once (queues/stomp/session.py): fewer, larger
# ACKs drain a backlog faster (the measurement: `git show ebfb99e`). What a larger one costs:
# after a consumer crashes or backs out, messages it only had prefetched come back flagged
# redelivered and are counted as one more delivery (docs/configuration.md); and the pushed
# messages wait in memory, bounded by the broker's message size limit (4 MiB on
# scripts/activemq.sh's broker: 400 MiB at worst; docs/operations.md).
DEFAULT_STOMP_PREFETCH = 100
# STOMP heart-beats (send, receive) in milliseconds: a broker gone silent for about twice this
# is noticed and the connection reopened; 0 turns a direction off.
DEFAULT_STOMP_HEARTBEATS = (10_000, 10_000)
DEFAULT_IBMMQ_RECONNECT: IbmMqReconnect = "disabled"
# The default bounds of one landing batch. Every batch run pays a fixed cost (Delta commits and
# snapshot reads), so a backlog should land in few large batches; but the Spark driver's heap
# and Python workers grow with the step, and these bounds keep a 1.2 M-message backlog under
# the 4 GiB budget on two cores (larger batches are a little faster but pass it: BENCHMARKS.md).
# A live feed closes its batches long before any bound (SIS_GET_WAIT_SECONDS
# without a message). The byte bound is checked before each get and a body over
# SIS_MAX_MESSAGE_BYTES is moved aside, so a batch's body bytes exceed SIS_BATCH_MAX_BYTES by
# less than one message's bound.
DEFAULT_BATCH_MAX_MESSAGES = 50_000
DEFAULT_BATCH_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_BATCH_MAX_SECONDS = 10.0
DEFAULT_GET_WAIT_SECONDS = 0.5
DEFAULT_MAX_RUNS_IN_FLIGHT = 2
DEFAULT_REDELIVERY_LIMIT = 5
DEFAULT_QUARANTINE_AFTER = 3
# How many batches before its own a copy's earlier copies make it a duplicate (0: the whole log):
# sis_platform/domain/dedup.py says why a window suffices and what it bounds.
DEFAULT_DEDUP_WINDOW_BATCHES = DOMAIN_DEDUP_WINDOW_BATCHES
DEFAULT_SENSOR_INTERVAL_SECONDS = 5
DEFAULT_SPARK_MASTER = "local[*]"
# The local driver's heap. A step of a full default batch (50,000 messages, 64 MiB) fits in it;
# every MiB more is resident for the whole run, and the platform's memory budget on a 2-core
# machine (4 GiB for the process tree: BENCHMARKS.md) has the JVM's off-heap part, Spark's
# Python workers and Dagster's own process to hold too. Raise it along with SIS_BATCH_MAX_*.
DEFAULT_DRIVER_MEMORY = "1536m"
DEFAULT_SHUFFLE_PARTITIONS = 4
# Who takes messages off the queue: `live` (sis-live, the default: sub-second latency into the
# serving store, the lake registering what it landed) or `sensor` (the queue sensor lands batches
# for the lake alone; no serving store).
INTAKE_MODES = ("live", "sensor")
# How the commands log (SIS_LOG_FORMAT, sis_platform/runtime/logs.py): a human-readable line, or
# one JSON object per line for a log collector.
LOG_FORMATS = ("text", "json")
LogFormat = Literal["text", "json"]
IntakeMode = Literal["live", "sensor"]
SERVING_SCHEMES = ("sqlite", "postgresql")
DEFAULT_SERVING_FILE = "serving/serving.db"  # under SIS_DATA_DIR
# The serving store's change log and dead letters are kept this many days (by the change log's
# own commit times), and always until live == lake has been checked past them; the lake keeps
# every version and dead letter for good (docs/operations.md, "Serving store history").
DEFAULT_SERVING_HISTORY_DAYS = 30.0
# Dagster's own records of the feed (docs/operations.md, "Dagster's partitions and runs"). A batch
# is sealed every two minutes, 720 a day: 30 days of `batches` partitions is 21,600 keys, a
# fifth of Dagster's 100,000-per-asset guidance, and as long as the serving store's history, so
# an operator looking back a month finds both. Older keys (folded and checked live == lake)
# leave the partition set; their data stays in the landing zone and the lake.
DEFAULT_PARTITION_RETAIN_DAYS = 30.0
# Finished runs (with their event logs) are kept this long, counted back from the newest run:
# about 720 batch runs a day, each some dozens of event rows.
DEFAULT_RUN_RETAIN_DAYS = 30.0
# The log key file and the witness of the log's head (sis_platform/log/seal.py) by default: under
# the user's config folder ($XDG_CONFIG_HOME, else ~/.config), outside any data folder; the
# witness named after its landing zone's folder, so two logs on one host keep two witnesses.
DEFAULT_LOG_KEY_FILE = "sis-platform/log.key"
DEFAULT_LOG_WITNESS_DIR = "sis-platform/witness"
LOG_KEY_VARIABLE = "SIS_LOG_KEY"
# sis-live closes a group once a get has waited this long without a message: every message of a
# group waits up to this for the ones behind it, and each group costs a landing file and a store
# commit (a few ms each), so it trades a little latency for far fewer commits in a burst.
DEFAULT_LIVE_GROUP_WAIT_MS = 2.0
# Bounds a group's fold and commit while catching up. A backlog folds faster in larger groups
# (fewer commits, each changed master parsed and interpreted once a group, a fold worker's
# round trip shared by more items: 12,000 messages took 8.2-9.3 s in groups of 2,000 and
# 10.0-10.5 s in groups of 500 on a 2-core machine); a live feed's groups are a few messages.
DEFAULT_LIVE_GROUP_MAX_MESSAGES = 2000
# Masters sis-live keeps parsed in memory (least recently used out; the store holds them all).
# A racing day has a few hundred masters; a large bound costs only memory (~50 KB a master).
DEFAULT_LIVE_MAX_MASTERS = 20_000
# With SIS_PRIORITY, how many landed messages of a backlog sis-live folds as one stretch, its
# priority masters committed ahead of the rest: priority goes as far ahead as this reaches. The
# stretch is held in memory while it is folded (about 3 KB a message in the simulator's mix).
DEFAULT_LIVE_PRIORITY_WINDOW = 20_000
# Processes that fold a share of a long stretch's masters beside sis-live (a backlog's catch-up
# on several cores; a live feed's small groups stay in sis-live). 0: sis-live folds alone.
DEFAULT_LIVE_FOLD_WORKERS = 1
MAX_LIVE_FOLD_WORKERS = 64
# sis-live seals the batch it is filling (the lake's partition) at this age, or at the batch
# bounds of SIS_BATCH_MAX_MESSAGES/BYTES: the serving store carries the latency, so the lake can
# take larger batches than the sensor's, and a day stays a few hundred partitions (720 at most in
# 24 hours of feed; a racing day's 10 hours, about 300) instead of thousands.
DEFAULT_LIVE_BATCH_SECONDS = 120.0
DEFAULT_LIVE_REPORT_SECONDS = 5.0  # how often the serving store's progress is shown in Dagster
DEFAULT_LIVE_MAX_LAG_SECONDS = 30.0  # landed but not yet in the store for longer: not fresh
# sis-live's liveness (sis_platform/runtime/heartbeat.py): its loop beats at least every second or
# so when idle, every quarter lease while standing by; a beat older than this is a process that
# has stopped making progress, which the supervisor (sis-run) and the Kubernetes liveness probe
# restart. It must exceed half the lease (SIS_LEASE_SECONDS): a standby beats once per quarter;
# unset, it is the lease when that is longer.
DEFAULT_LIVE_STALL_SECONDS = 60.0
# Where sis-live serves /metrics, /healthz and /readyz (sis_platform/live/endpoint.py) unless
# SIS_METRICS_ADDRESS says (`off`: nowhere): loopback, as every listener of the platform; 9464 is
# the port OpenTelemetry's Prometheus exporter uses by convention.
DEFAULT_METRICS_ADDRESS = "127.0.0.1:9464"
# sis-live's traces (sis_platform/live/traces.py) are off unless one of these names an OTLP/HTTP
# collector: OpenTelemetry's own variables, read here as the switch and the endpoint (the
# traces one as it is, the general one with `/v1/traces` appended, as the SDK does). https, or
# plain http to a loopback address only. The rest is the SDK's, read by it from the environment
# only: OTEL_SERVICE_NAME (default here: OTEL_DEFAULT_SERVICE_NAME), OTEL_EXPORTER_OTLP_HEADERS
# (a collector's credentials), OTEL_EXPORTER_OTLP_TIMEOUT, OTEL_EXPORTER_OTLP_CERTIFICATE,
# OTEL_BSP_MAX_QUEUE_SIZE and the other OTEL_BSP_* of the batch span processor, OTEL_TRACES_SAMPLER.
OTEL_ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTEL_TRACES_ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTEL_DEFAULT_SERVICE_NAME = "sis-live"
# How long the parts of a batch sis-live merged into one file are kept after the merge
# (sis_platform/log/landing/merge.py): every reader that listed them before the merge (a Spark job,
# a catch-up, sis-trace) has opened them by then. An hour at the defaults keeps ~30 batches'
# parts.
DEFAULT_LANDING_MERGE_GRACE_SECONDS = 3600.0
# How long sealed batches stay in the landing zone once the lake has folded them and
# live_matches_lake has passed past them (sis_platform/log/landing/expiry.py); the lake's
# raw_messages keeps their messages. A month at a batch per two minutes: ~21,600 batches, two
# files each (the merged file and its anchor).
DEFAULT_LANDING_RETAIN_DAYS = 30.0
# Where sis-live's heartbeat is written unless SIS_LIVE_HEARTBEAT_FILE says: under the data
# folder, private to this host (a pod puts it on an emptyDir of its own).
LIVE_HEARTBEAT_FILE = Path("run") / "sis-live.heartbeat"
# The checks that watch the lake (docs/operations.md, "Checks that watch the feed"). The lake
# lag: how long the oldest landed message has waited for the fold. With live intake a batch is
# sealed at SIS_LIVE_BATCH_SECONDS (120 s) and its run takes tens of seconds, so a healthy lake
# is two to three minutes behind; warn at five (a run or two late), fail at fifteen.
# Delta upkeep of the fold's and the model's tables (sis_platform/lake/upkeep.py), inside their
# steps: bin-packing OPTIMIZE every this many fold steps (an hour at two-minute batches: a table
# holds at most some 30 small files and deletion vectors between two compactions), VACUUM once a
# day's worth of steps, files kept this long after they leave a table.
DEFAULT_LAKE_OPTIMIZE_EVERY = 30
DEFAULT_LAKE_VACUUM_EVERY = 720
DEFAULT_LAKE_RETAIN_HOURS = 168.0
# The least retention VACUUM may be given: a removed file must outlive every reader of a table
# version that still lists it. Those are an interrupted step's recovery (it restores the last
# committed version, whose files the step's own writes, compaction and vacuum removed), a fold
# or model step reading a pinned version while the next compacts, a reader of the lake (sis-trace,
# Opportunity Management's jobs) holding a snapshot, and a failed run re-executed the next working
# day: a day covers them with room to spare. Delta's own guard
# (spark.databricks.delta.retentionDurationCheck.enabled) stays on besides.
LAKE_REPLAY_WINDOW_HOURS = 24.0
# The asset check `files_within_bound` fails when a lake table holds more active data files.
DEFAULT_LAKE_MAX_FILES = 1000
DEFAULT_LAKE_LAG_WARN_SECONDS = 300.0
DEFAULT_LAKE_LAG_FAIL_SECONDS = 900.0
# A batch whose dead-lettered messages are more than this share of its messages is worth a look
# (a healthy feed dead-letters a few orphan updates at most).
DEFAULT_DEAD_LETTER_RATE_WARN = 0.05
# Freshness of master_documents and the model: each batch folded materializes them and a batch
# lands every minute or two, so ten minutes without one is a warning and thirty a failure.
DEFAULT_FRESHNESS_WARN_SECONDS = 600.0
DEFAULT_FRESHNESS_FAIL_SECONDS = 1800.0
# DEFAULT_LIMITS is defined beside the code it bounds (domain/limits.py) and imported here.
# The consumer lease's length (intake/lease.py, SIS_LEASE_SECONDS).
DEFAULT_LEASE_SECONDS = 60.0
# Backouts after which a source moves a message to its backout queue instead of returning it (MQ
# BOTHRESH), unless configured otherwise (unset, twice a higher SIS_REDELIVERY_LIMIT); 0 turns the
# threshold off. It must stay above the feed contract's redelivery limit (SIS_REDELIVERY_LIMIT,
# 5): a message that keeps coming back is then normally landed with its delivery count and dead-
# lettered by the fold first, so the message log accounts for it; the threshold catches only what
# never reaches the log (a message that kills intake before it is landed, e.g. by exhausting the
# consumer's memory).
DEFAULT_BACKOUT_THRESHOLD = 10

# Each resource bound (sis_platform.domain.limits) and the variable that sets it.
LIMIT_VARIABLES = {
    "max_message_bytes": "SIS_MAX_MESSAGE_BYTES",
    "max_elements": "SIS_MAX_ELEMENTS",
    "max_depth": "SIS_MAX_DEPTH",
    "max_attributes": "SIS_MAX_ATTRIBUTES",
    "max_namespaces": "SIS_MAX_NAMESPACES",
    "max_document_namespaces": "SIS_MAX_DOCUMENT_NAMESPACES",
    "max_children": "SIS_MAX_CHILDREN",
    "max_ids": "SIS_MAX_IDS",
    "max_split_bytes": "SIS_MAX_SPLIT_BYTES",
    "max_patch_operations": "SIS_MAX_PATCH_OPERATIONS",
    "max_selector_length": "SIS_MAX_SELECTOR_LENGTH",
    "max_selector_steps": "SIS_MAX_SELECTOR_STEPS",
    "item_budget_seconds": "SIS_ITEM_BUDGET_SECONDS",
}
IBMMQ_REQUIRED = ("SIS_IBMMQ_QMGR", "SIS_IBMMQ_CHANNEL", "SIS_IBMMQ_CONN", "SIS_IBMMQ_QUEUE")
SECRET_VARIABLES = (
    "SIS_STOMP_PASSWORD",
    "SIS_STOMP_KEY_PASSWORD",
    "SIS_IBMMQ_PASSWORD",
    "SIS_SERVING_PASSWORD",
    "SIS_NOTIFY_WEBHOOK_TOKEN",
    "SIS_SPARK_SECRET_CONF",
    LOG_KEY_VARIABLE,
)
# A Spark or Hadoop setting whose name matches holds a secret (an object store's key, a
# password, a token): SIS_SPARK_CONF refuses it, since what SIS_SPARK_CONF holds reaches the
# code location's configuration (the webserver shows it, every run's snapshot stores it) and
# the driver JVM's command line; SIS_SPARK_SECRET_CONF takes it instead. Spark's own
# `spark.redaction.regex` default is the model, widened to credentials and account keys.
# Besides those words: Azure's shared access signatures (fs.azure.sas.<container>.<account>)
# and the encryption keys of S3A, GCS and ABFS (fs.s3a.encryption.key, fs.gs.encryption.key,
# fs.azure.encryption.encoded.client-provided-key).
SPARK_SECRET_KEY_PATTERN = (
    r"(?i)secret|password|passwd|token|credential|access[._-]?key|account[._-]key"
    r"|private[._-]?key|signature|(^|\.)sas\.|encryption[._-]key|provided[._-]key"
)
# Names the pattern matches that hold no secret: where credentials are looked up (a provider's
# class, a credential store's path) or whether they are used, never the credentials themselves
# (e.g. fs.s3a.aws.credentials.provider, hadoop.security.credential.provider.path).
SPARK_SECRET_KEY_EXCEPTIONS = r"(?i)\.(providers?|provider\.(path|type)|enabled)$"
# Spark's own variable for Spark Connect's shared-secret token: the server (Spark 4's
# Connect.getAuthenticateToken, when spark.connect.authenticate.token is unset) and PySpark's
# client (ChannelBuilder.token) both read it, so it never appears in a URL or a command line.
SPARK_CONNECT_TOKEN_VARIABLE = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
# Test hooks, read at call time (sis_platform/runtime/faults.py); production never sets them.
FAULT_INJECTION_VARIABLES = (
    "SIS_CRASH_AT",
    "SIS_INJECT_FOLD_FAILURE",
    "SIS_INJECT_CLASSIFY_FAILURE",
)
# Every variable the platform reads (the profile file may set any but the secrets).
VARIABLES = (
    *"""
    SIS_PROFILE SIS_DATA_DIR SIS_SOURCE SIS_LANDING_DIR SIS_LAKE_PATH
    SIS_QUEUE_DIR SIS_QUEUE_NAME SIS_BACKOUT_THRESHOLD SIS_BACKOUT_QUEUE
    SIS_STOMP_HOST SIS_STOMP_PORT SIS_STOMP_DESTINATION SIS_STOMP_USER SIS_STOMP_PASSWORD
    SIS_STOMP_SELECTOR SIS_STOMP_PREFETCH SIS_STOMP_REDELIVERY_COUNTS
    SIS_STOMP_TLS SIS_STOMP_CA_FILE SIS_STOMP_CERT_FILE SIS_STOMP_KEY_FILE
    SIS_STOMP_KEY_PASSWORD SIS_STOMP_ALLOW_PLAINTEXT_CREDENTIALS
    SIS_IBMMQ_USER SIS_IBMMQ_PASSWORD SIS_IBMMQ_CIPHER_SPEC SIS_IBMMQ_KEY_REPOSITORY
    SIS_IBMMQ_CERT_LABEL SIS_IBMMQ_SSL_PEER SIS_IBMMQ_RECONNECT SIS_IBMMQ_MAX_GET_BYTES
    SIS_SENSOR_INTERVAL_SECONDS SIS_BATCH_MAX_MESSAGES SIS_BATCH_MAX_BYTES
    SIS_BATCH_MAX_SECONDS SIS_GET_WAIT_SECONDS SIS_MAX_RUNS_IN_FLIGHT SIS_DEPLOYMENT
    SIS_LEASE_SECONDS
    SIS_SPARK_MASTER SIS_SPARK_DRIVER_MEMORY SIS_SPARK_SHUFFLE_PARTITIONS SIS_SPARK_UI
    SIS_SPARK_CONF SIS_SPARK_SECRET_CONF SIS_SPARK_JARS_DIR SIS_SPARK_CLASS_ARCHIVE
    SIS_SPARK_SCRATCH_DIR
    SIS_REDELIVERY_LIMIT SIS_SELECTOR SIS_PRIORITY SIS_QUARANTINE_AFTER SIS_DEDUP_WINDOW_BATCHES
    SIS_INTAKE SIS_SERVING_URL SIS_SERVING_PASSWORD SIS_LIVE_GROUP_WAIT_MS
    SIS_LIVE_GROUP_MAX_MESSAGES SIS_LIVE_MAX_MASTERS SIS_LIVE_REPORT_SECONDS
    SIS_LIVE_MAX_LAG_SECONDS SIS_LIVE_BATCH_SECONDS SIS_LIVE_PRIORITY_WINDOW
    SIS_LIVE_FOLD_WORKERS SIS_LIVE_HEARTBEAT_FILE SIS_LIVE_STALL_SECONDS SIS_METRICS_ADDRESS
    SIS_LANDING_MERGE_GRACE_SECONDS SIS_LANDING_RETAIN_DAYS
    SIS_LAKE_LAG_WARN_SECONDS SIS_LAKE_LAG_FAIL_SECONDS SIS_DEAD_LETTER_RATE_WARN
    SIS_LAKE_OPTIMIZE_EVERY SIS_LAKE_VACUUM_EVERY SIS_LAKE_RETAIN_HOURS SIS_LAKE_MAX_FILES
    SIS_FRESHNESS_WARN_SECONDS SIS_FRESHNESS_FAIL_SECONDS
    SIS_LOG_KEY SIS_LOG_KEY_FILE SIS_LOG_WITNESS SIS_LOG_FORMAT
    SIS_NOTIFY_WEBHOOK_URL SIS_NOTIFY_WEBHOOK_TOKEN
    SIS_PARTITION_RETAIN_DAYS SIS_RUN_RETAIN_DAYS
    """.split(),
    *IBMMQ_REQUIRED,
    *LIMIT_VARIABLES.values(),
    *FAULT_INJECTION_VARIABLES,
    SETTINGS_FILE_VARIABLE,
    OTEL_ENDPOINT_VARIABLE,
    OTEL_TRACES_ENDPOINT_VARIABLE,
)
