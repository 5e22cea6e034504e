"""The one place where the environment chooses the platform's configuration.

`SIS_PROFILE` picks the source and Spark: `local` (default: embedded queue, local Spark, local
Delta), `activemq` (STOMP broker), `ibmmq` (IBM MQ through pymqi), `cluster` (embedded or any
source, Spark at SIS_SPARK_MASTER, Delta at SIS_LAKE_PATH). Every other setting is a `SIS_*`
variable with a sane default; secrets are bound as `dg.EnvVar`, so they are read at run time
and never stored in the code location's configuration snapshot. The README lists them all.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg

from sis_platform.consumer import (
    DEFAULT_BATCH_MAX_BYTES,
    DEFAULT_BATCH_MAX_MESSAGES,
    DEFAULT_BATCH_MAX_SECONDS,
    DEFAULT_GET_WAIT_SECONDS,
)
from sis_platform.domain.limits import DEFAULT_LIMITS
from sis_platform.lease import DEFAULT_LEASE_SECONDS
from sis_platform.queues.base import DEFAULT_BACKOUT_THRESHOLD
from sis_platform.resources.platform import (
    DeltaLakeResource,
    FeedProcessingResource,
    LandingZoneResource,
)
from sis_platform.resources.sources import (
    EmbeddedQueueResource,
    IbmMqQueueResource,
    QueueSourceResource,
    StompQueueResource,
)
from sis_platform.resources.spark import (
    DEFAULT_DRIVER_MEMORY,
    DeltaSparkResource,
    delta_spark_config,
)

PROFILES = ("local", "activemq", "ibmmq", "cluster")


class ConfigurationError(ValueError):
    pass


def _get(env: Mapping[str, str], name: str, default: str) -> str:
    value = env.get(name, "").strip()
    return value or default


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = _get(env, name, str(default))
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(f"{name}={raw!r} is not a whole number") from None


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = _get(env, name, str(default))
    try:
        return float(raw)
    except ValueError:
        raise ConfigurationError(f"{name}={raw!r} is not a number") from None


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> Any:
    """One of `choices` (the first is the default)."""
    value = _get(env, name, choices[0])
    if value not in choices:
        raise ConfigurationError(f"{name}={value!r}: expected one of {', '.join(choices)}")
    return value


def _required(env: Mapping[str, str], name: str, profile: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ConfigurationError(f"profile {profile!r} needs {name} to be set")
    return value


def data_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(_get(env, "SIS_DATA_DIR", "data")).resolve()


def sensor_interval_seconds(env: Mapping[str, str] | None = None) -> int:
    """How often the daemon evaluates the queue sensor (SIS_SENSOR_INTERVAL_SECONDS, default 5):
    the floor of a message's latency from the queue to its master."""
    env = os.environ if env is None else env
    value = _int(env, "SIS_SENSOR_INTERVAL_SECONDS", 5)
    if value < 1:
        raise ConfigurationError(f"SIS_SENSOR_INTERVAL_SECONDS={value} must be at least 1")
    return value


def queue_resource(env: Mapping[str, str], profile: str) -> QueueSourceResource:
    """The configured queue source. The backout settings apply to every source: a message
    backed out SIS_BACKOUT_THRESHOLD times (default 10, or twice a higher SIS_REDELIVERY_LIMIT;
    0 turns it off) is moved to
    SIS_BACKOUT_QUEUE instead of being delivered again (on IBM MQ the queue's own BOTHRESH and
    BOQNAME come first)."""
    default_source = {"activemq": "stomp", "ibmmq": "ibmmq"}.get(profile, "embedded")
    source = _get(env, "SIS_SOURCE", default_source)
    backout_threshold = _backout_threshold(env)
    backout_queue = env.get("SIS_BACKOUT_QUEUE", "").strip() or None
    if source == "embedded":
        queue = _get(env, "SIS_QUEUE_NAME", "SPORTSDATA")
        _require_other_queue(backout_queue, queue)
        return EmbeddedQueueResource(
            path=_get(env, "SIS_QUEUE_DIR", str(data_dir(env) / "queue")),
            queue=queue,
            backout_threshold=backout_threshold,
            backout_queue=backout_queue,
        )
    if source == "stomp":
        destination = _get(env, "SIS_STOMP_DESTINATION", "/queue/SPORTSDATA")
        _require_other_queue(backout_queue, destination)
        return StompQueueResource(
            host=_get(env, "SIS_STOMP_HOST", "127.0.0.1"),
            port=_int(env, "SIS_STOMP_PORT", 61613),
            destination=destination,
            user=env.get("SIS_STOMP_USER") or None,
            password=dg.EnvVar("SIS_STOMP_PASSWORD") if env.get("SIS_STOMP_PASSWORD") else None,
            selector=env.get("SIS_STOMP_SELECTOR") or None,
            prefetch=_stomp_prefetch(env),
            backout_threshold=backout_threshold,
            backout_queue=backout_queue,
            redelivery_counts=_get(
                env,
                "SIS_STOMP_REDELIVERY_COUNTS",
                str(data_dir(env) / "stomp" / "redeliveries.db"),
            ),
        )
    if source == "ibmmq":
        max_message_bytes = _int(
            env, LIMIT_VARIABLES["max_message_bytes"], DEFAULT_LIMITS.max_message_bytes
        )
        max_get_bytes = _int(env, "SIS_IBMMQ_MAX_GET_BYTES", 2 * max_message_bytes)
        if max_get_bytes < max_message_bytes:
            # A body the platform accepts must never be turned away by the source.
            raise ConfigurationError(
                f"SIS_IBMMQ_MAX_GET_BYTES={max_get_bytes} must be at least "
                f"SIS_MAX_MESSAGE_BYTES={max_message_bytes}"
            )
        queue = _required(env, "SIS_IBMMQ_QUEUE", profile)
        _require_other_queue(backout_queue, queue)
        return IbmMqQueueResource(
            queue_manager=_required(env, "SIS_IBMMQ_QMGR", profile),
            channel=_required(env, "SIS_IBMMQ_CHANNEL", profile),
            conn_name=_required(env, "SIS_IBMMQ_CONN", profile),
            queue=queue,
            user=env.get("SIS_IBMMQ_USER") or None,
            password=dg.EnvVar("SIS_IBMMQ_PASSWORD") if env.get("SIS_IBMMQ_PASSWORD") else None,
            cipher_spec=env.get("SIS_IBMMQ_CIPHER_SPEC") or None,
            key_repository=env.get("SIS_IBMMQ_KEY_REPOSITORY") or None,
            certificate_label=env.get("SIS_IBMMQ_CERT_LABEL") or None,
            client_reconnect=_choice(
                env, "SIS_IBMMQ_RECONNECT", ("disabled", "as_def", "any", "qmgr")
            ),
            backout_threshold=backout_threshold,
            backout_queue=backout_queue,
            max_get_bytes=max_get_bytes,
        )
    raise ConfigurationError(f"SIS_SOURCE={source!r}: expected embedded, stomp or ibmmq")


def _stomp_prefetch(env: Mapping[str, str]) -> int:
    prefetch = _int(env, "SIS_STOMP_PREFETCH", 10)
    if prefetch < 1:
        raise ConfigurationError(f"SIS_STOMP_PREFETCH={prefetch} must be at least 1")
    return prefetch


def _require_other_queue(backout_queue: str | None, queue: str) -> None:
    """SIS_BACKOUT_QUEUE must not name the queue itself (STOMP names with or without their
    /queue/ prefix)."""

    def bare(name: str) -> str:
        return name.removeprefix("/queue/")

    if backout_queue is not None and bare(backout_queue) == bare(queue):
        raise ConfigurationError(f"SIS_BACKOUT_QUEUE={backout_queue!r} is the queue itself")


def _backout_threshold(env: Mapping[str, str]) -> int:
    """SIS_BACKOUT_THRESHOLD: 0 (off) or more backouts than SIS_REDELIVERY_LIMIT allows
    deliveries, so that a message coming back is landed and dead-lettered by the fold, with
    its record in the message log, before the source moves it aside unlogged. Unset, it is
    twice the redelivery limit and at least DEFAULT_BACKOUT_THRESHOLD (10 with the default
    limit of 5), so raising the limit alone never makes the configuration invalid."""
    redelivery_limit = _int(
        env, "SIS_REDELIVERY_LIMIT", FeedProcessingResource.model_fields["redelivery_limit"].default
    )
    default = max(DEFAULT_BACKOUT_THRESHOLD, 2 * redelivery_limit)
    threshold = _int(env, "SIS_BACKOUT_THRESHOLD", default)
    if threshold < 0 or 0 < threshold <= redelivery_limit:
        raise ConfigurationError(
            f"SIS_BACKOUT_THRESHOLD={threshold} must be above SIS_REDELIVERY_LIMIT="
            f"{redelivery_limit} (unset: {default}), or 0 to turn it off"
        )
    return threshold


def _class_archive(env: Mapping[str, str]) -> str | None:
    from sis_platform.resources.jvm_archive import configured_archive

    try:
        return configured_archive(env.get("SIS_SPARK_CLASS_ARCHIVE") or None)
    except ValueError as error:
        raise ConfigurationError(str(error)) from None


def _spark_conf(env: Mapping[str, str]) -> dict[str, str]:
    """SIS_SPARK_CONF: further Spark settings, `key=value` pairs separated by whitespace, e.g.
    `spark.eventLog.enabled=true spark.eventLog.dir=/var/log/spark` (for the history server).
    They are applied last, so they override the platform's own."""
    conf: dict[str, str] = {}
    for pair in env.get("SIS_SPARK_CONF", "").split():
        key, sep, value = pair.partition("=")
        if not sep or not key.startswith("spark.") or not value:
            raise ConfigurationError(f"SIS_SPARK_CONF: {pair!r} is not a spark.<name>=<value> pair")
        conf[key] = value
    return conf


def spark_config(env: Mapping[str, str], master: str) -> dict[str, str]:
    """The Spark settings of the environment for a driver (or Spark Connect client) at
    `master`: the platform's runs, and the local Spark Connect server (cli/spark_connect.py)."""
    return delta_spark_config(
        master=master,
        driver_memory=_get(env, "SIS_SPARK_DRIVER_MEMORY", DEFAULT_DRIVER_MEMORY),
        shuffle_partitions=_int(env, "SIS_SPARK_SHUFFLE_PARTITIONS", 4),
        ui_enabled=_get(env, "SIS_SPARK_UI", "false") == "true",
        jars_dir=env.get("SIS_SPARK_JARS_DIR") or None,
        class_archive=_class_archive(env),
        extra=_spark_conf(env),
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


# Each resource bound (sis_platform.domain.limits) and the variable that sets it.
LIMIT_VARIABLES = {
    "max_message_bytes": "SIS_MAX_MESSAGE_BYTES",
    "max_elements": "SIS_MAX_ELEMENTS",
    "max_depth": "SIS_MAX_DEPTH",
    "max_attributes": "SIS_MAX_ATTRIBUTES",
    "max_children": "SIS_MAX_CHILDREN",
    "max_ids": "SIS_MAX_IDS",
    "max_split_bytes": "SIS_MAX_SPLIT_BYTES",
    "max_patch_operations": "SIS_MAX_PATCH_OPERATIONS",
    "max_selector_length": "SIS_MAX_SELECTOR_LENGTH",
    "max_selector_steps": "SIS_MAX_SELECTOR_STEPS",
    "item_budget_seconds": "SIS_ITEM_BUDGET_SECONDS",
}


def limits_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """The resource bounds the environment sets (defaults: DEFAULT_LIMITS); each must be
    positive."""
    settings: dict[str, Any] = {}
    for name, variable in LIMIT_VARIABLES.items():
        default = getattr(DEFAULT_LIMITS, name)
        value: float = (
            _float(env, variable, default)
            if isinstance(default, float)
            else _int(env, variable, default)
        )
        if value <= 0:
            raise ConfigurationError(f"{variable}={value:g} must be positive")
        settings[name] = value
    return settings


def resources(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The resources for the profile the environment names."""
    env = os.environ if env is None else env
    profile = _get(env, "SIS_PROFILE", "local")
    if profile not in PROFILES:
        raise ConfigurationError(f"SIS_PROFILE={profile!r}: expected one of {', '.join(PROFILES)}")
    data = data_dir(env)
    master = _get(env, "SIS_SPARK_MASTER", "local[*]")
    if profile == "cluster" and master.startswith("local"):
        raise ConfigurationError(
            "profile 'cluster' needs SIS_SPARK_MASTER (spark://, k8s://, yarn or sc://)"
        )
    lake_path = _get(env, "SIS_LAKE_PATH", str(data / "lake"))
    if master.startswith("sc://"):
        master = shared_spark_session(master, lake_path)
    max_seconds = _float(env, "SIS_BATCH_MAX_SECONDS", DEFAULT_BATCH_MAX_SECONDS)
    lease_seconds = _float(env, "SIS_LEASE_SECONDS", DEFAULT_LEASE_SECONDS)
    if lease_seconds < 3 * max_seconds:
        # A tick renews the lease and then consumes for up to max_seconds; the next tick must
        # renew before it expires, with room for the sensor interval and clock skew.
        raise ConfigurationError(
            f"SIS_LEASE_SECONDS={lease_seconds:g} must be at least 3 x SIS_BATCH_MAX_SECONDS"
            f"={max_seconds:g}"
        )
    return {
        "queue": queue_resource(env, profile),
        "landing": LandingZoneResource(
            root=_get(env, "SIS_LANDING_DIR", str(data / "landing")),
            max_messages=_int(env, "SIS_BATCH_MAX_MESSAGES", DEFAULT_BATCH_MAX_MESSAGES),
            max_bytes=_int(env, "SIS_BATCH_MAX_BYTES", DEFAULT_BATCH_MAX_BYTES),
            max_seconds=max_seconds,
            get_wait_seconds=_float(env, "SIS_GET_WAIT_SECONDS", DEFAULT_GET_WAIT_SECONDS),
            max_runs_in_flight=_int(env, "SIS_MAX_RUNS_IN_FLIGHT", 2),
            deployment=_get(env, "SIS_DEPLOYMENT", socket.gethostname()),
            lease_seconds=lease_seconds,
        ),
        "lake": DeltaLakeResource(base_path=lake_path),
        "processing": FeedProcessingResource(
            **limits_settings(env),
            redelivery_limit=_int(env, "SIS_REDELIVERY_LIMIT", 5),
            quarantine_after=_int(env, "SIS_QUARANTINE_AFTER", 3),
            selector=env.get("SIS_SELECTOR") or None,
        ),
        "spark": DeltaSparkResource(spark_config=spark_config(env, master)),
    }
