"""The platform's settings: every `SIS_*` variable read once, checked, and held in typed records.

The only module of the platform that reads the process environment. `load_settings` reads the
`SIS_*` variables (and the profile file `SIS_SETTINGS_FILE` names, if any: `SIS_NAME=value`
lines, under the environment) into a frozen `Settings`, which `sis_platform.config` turns into
Dagster resources. Every default lives here; a value that cannot be used raises
`ConfigurationError` naming the variable and what it accepts, so the platform stops at start.

Secrets (`*_PASSWORD`, tokens) are never held in `Settings`: a record only says whether one is
set. Resources bind them as `dg.EnvVar` (read when used); a URL-based entry point asks
`secret()` for one and passes it on explicitly. A profile file may not hold a secret.

A few things are read at call time rather than once, on purpose: the fault-injection hooks of
the test suite (`fault_injection`, set per child process), the user's cache folder
(`cache_home`), the environment handed to a child process (`child_environment`), and the
secrets. docs/configuration.md lists every variable.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast

from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.lease import DEFAULT_LEASE_SECONDS
from sis_platform.queues.base import DEFAULT_BACKOUT_THRESHOLD

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
DEFAULT_STOMP_PREFETCH = 10
DEFAULT_IBMMQ_RECONNECT: IbmMqReconnect = "disabled"
# The default bounds of one landing batch. Every batch run pays a fixed cost (Delta commits and
# snapshot reads), so a backlog should land in few large batches; but the Spark driver's heap
# and Python workers grow with the step, and these bounds keep a 1.2 M-message backlog under
# the 4 GiB budget on two cores (BENCHMARKS.md: batches of 100,000 were ~9% faster and peaked
# at 4.1 GiB). A live feed closes its batches long before any bound (SIS_GET_WAIT_SECONDS
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
DEFAULT_SENSOR_INTERVAL_SECONDS = 5
DEFAULT_SPARK_MASTER = "local[*]"
# The local driver's heap. A step of a full default batch (50,000 messages, 64 MiB) fits in it;
# every MiB more is resident for the whole run, and the platform's memory budget on a 2-core
# machine (4 GiB for the process tree: BENCHMARKS.md) has the JVM's off-heap part, Spark's
# Python workers and Dagster's own process to hold too. Raise it along with SIS_BATCH_MAX_*.
DEFAULT_DRIVER_MEMORY = "1536m"
DEFAULT_SHUFFLE_PARTITIONS = 4
# Three defaults are defined beside the code they bound and imported here: DEFAULT_LIMITS
# (domain/limits.py), DEFAULT_LEASE_SECONDS (lease.py) and DEFAULT_BACKOUT_THRESHOLD
# (queues/base.py; unset, the threshold is twice a higher SIS_REDELIVERY_LIMIT).

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
IBMMQ_REQUIRED = ("SIS_IBMMQ_QMGR", "SIS_IBMMQ_CHANNEL", "SIS_IBMMQ_CONN", "SIS_IBMMQ_QUEUE")
SECRET_VARIABLES = ("SIS_STOMP_PASSWORD", "SIS_IBMMQ_PASSWORD")
# Test hooks, read at call time (sis_platform/faults.py); production never sets them.
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
    SIS_IBMMQ_USER SIS_IBMMQ_PASSWORD SIS_IBMMQ_CIPHER_SPEC SIS_IBMMQ_KEY_REPOSITORY
    SIS_IBMMQ_CERT_LABEL SIS_IBMMQ_RECONNECT SIS_IBMMQ_MAX_GET_BYTES
    SIS_SENSOR_INTERVAL_SECONDS SIS_BATCH_MAX_MESSAGES SIS_BATCH_MAX_BYTES
    SIS_BATCH_MAX_SECONDS SIS_GET_WAIT_SECONDS SIS_MAX_RUNS_IN_FLIGHT SIS_DEPLOYMENT
    SIS_LEASE_SECONDS
    SIS_SPARK_MASTER SIS_SPARK_DRIVER_MEMORY SIS_SPARK_SHUFFLE_PARTITIONS SIS_SPARK_UI
    SIS_SPARK_CONF SIS_SPARK_JARS_DIR SIS_SPARK_CLASS_ARCHIVE
    SIS_REDELIVERY_LIMIT SIS_SELECTOR SIS_QUARANTINE_AFTER
    """.split(),
    *IBMMQ_REQUIRED,
    *LIMIT_VARIABLES.values(),
    *FAULT_INJECTION_VARIABLES,
    SETTINGS_FILE_VARIABLE,
)


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
    redelivery_counts: str
    host: str = DEFAULT_STOMP_HOST
    port: int = DEFAULT_STOMP_PORT
    destination: str = DEFAULT_STOMP_DESTINATION
    user: str | None = None
    has_password: bool = False  # SIS_STOMP_PASSWORD is set in the environment (value not held)
    selector: str | None = None
    prefetch: int = DEFAULT_STOMP_PREFETCH
    backout: Backout = field(default_factory=Backout)


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
    selector: str | None = None


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
    extra_conf: tuple[tuple[str, str], ...] = ()  # SIS_SPARK_CONF, in order


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
    sensor_interval_seconds: int = DEFAULT_SENSOR_INTERVAL_SECONDS


# -- reading ------------------------------------------------------------------------------


class _Reader:
    """Typed reads of one mapping of variables; an unset or empty variable is its default."""

    def __init__(self, variables: Mapping[str, str]) -> None:
        self.variables = variables

    def text(self, name: str, default: str) -> str:
        return self.optional(name) or default

    def optional(self, name: str) -> str | None:
        return self.variables.get(name, "").strip() or None

    def whole(self, name: str, default: int) -> int:
        raw = self.text(name, str(default))
        try:
            return int(raw)
        except ValueError:
            raise ConfigurationError(f"{name}={raw!r} is not a whole number") from None

    def number(self, name: str, default: float) -> float:
        raw = self.text(name, str(default))
        try:
            return float(raw)
        except ValueError:
            raise ConfigurationError(f"{name}={raw!r} is not a number") from None

    def choice(self, name: str, choices: tuple[str, ...], default: str | None = None) -> str:
        """One of `choices` (default: the first)."""
        value = self.text(name, default or choices[0])
        if value not in choices:
            raise ConfigurationError(f"{name}={value!r}: expected one of {', '.join(choices)}")
        return value

    def at_least(self, name: str, default: int, least: int) -> int:
        value = self.whole(name, default)
        if value < least:
            raise ConfigurationError(f"{name}={value} must be at least {least}")
        return value


def _environment(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def _variables(env: Mapping[str, str] | None) -> _Reader:
    """The variables in effect: the environment over the profile file it names, if any."""
    env = _environment(env)
    path = env.get(SETTINGS_FILE_VARIABLE, "").strip()
    if not path:
        return _Reader(env)
    from_file = read_settings_file(Path(path))
    return _Reader({**from_file, **{k: v for k, v in env.items() if v.strip()}})


def read_settings_file(path: Path) -> dict[str, str]:
    """A profile file's variables: `SIS_NAME=value` lines (blank lines and `#` comments
    skipped; no quoting: the value is the rest of the line, stripped). A secret, an unknown
    name or a malformed line is an error."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise ConfigurationError(f"{SETTINGS_FILE_VARIABLE}={str(path)!r}: {error}") from None
    variables: dict[str, str] = {}
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        where = f"{SETTINGS_FILE_VARIABLE}={str(path)!r} line {number}"
        name, sep, value = text.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ConfigurationError(f"{where}: expected SIS_NAME=value")
        if is_secret(name):
            raise ConfigurationError(
                f"{where}: {name} is a secret; secrets are taken from the environment only"
            )
        if name not in VARIABLES or name == SETTINGS_FILE_VARIABLE:
            raise ConfigurationError(f"{where}: {name} is not a setting of the platform")
        variables[name] = value.strip()
    return variables


def is_secret(name: str) -> bool:
    """Whether variable `name` holds a secret (a password, token or other secret)."""
    return name in SECRET_VARIABLES or name.endswith(("_PASSWORD", "_TOKEN", "_SECRET"))


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """The settings `env` (default: the process environment) configures, all checked."""
    read = _variables(env)
    profile = read.choice("SIS_PROFILE", PROFILES, DEFAULT_PROFILE)
    data_dir = _data_dir(read)
    limits = _limits(read)
    processing = ProcessingSettings(
        redelivery_limit=read.whole("SIS_REDELIVERY_LIMIT", DEFAULT_REDELIVERY_LIMIT),
        quarantine_after=read.at_least("SIS_QUARANTINE_AFTER", DEFAULT_QUARANTINE_AFTER, 1),
        selector=read.optional("SIS_SELECTOR"),
    )
    spark = _spark(read)
    if profile == "cluster" and spark.master.startswith("local"):
        raise ConfigurationError(
            "profile 'cluster' needs SIS_SPARK_MASTER (spark://, k8s://, yarn or sc://)"
        )
    return Settings(
        profile=profile,
        data_dir=data_dir,
        source=_source(read, profile, data_dir, limits, processing.redelivery_limit),
        batch=_batch(read),
        limits=limits,
        processing=processing,
        spark=spark,
        lake_path=read.text("SIS_LAKE_PATH", str(data_dir / "lake")),
        landing_dir=read.text("SIS_LANDING_DIR", str(data_dir / "landing")),
        sensor_interval_seconds=_sensor_interval(read),
    )


def sensor_interval_seconds(env: Mapping[str, str] | None = None) -> int:
    """How often the daemon evaluates the queue sensor (SIS_SENSOR_INTERVAL_SECONDS): the
    floor of a message's latency from the queue to its master."""
    return _sensor_interval(_variables(env))


def spark_settings(env: Mapping[str, str] | None = None) -> SparkSettings:
    """The Spark section alone (the Spark Connect server needs nothing else)."""
    return _spark(_variables(env))


def ibmmq_settings(env: Mapping[str, str] | None = None) -> IbmMqSourceSettings:
    """The IBM MQ source the SIS_IBMMQ_* variables describe (an `ibmmq:` queue URL); the
    backout settings are the source's own defaults."""
    read = _variables(env)
    return _ibmmq(read, "the queue URL 'ibmmq:'", _limits(read), Backout())


def _data_dir(read: _Reader) -> Path:
    return Path(read.text("SIS_DATA_DIR", DEFAULT_DATA_DIR)).resolve()


def _sensor_interval(read: _Reader) -> int:
    return read.at_least("SIS_SENSOR_INTERVAL_SECONDS", DEFAULT_SENSOR_INTERVAL_SECONDS, 1)


def _limits(read: _Reader) -> Limits:
    """The resource bounds (defaults: DEFAULT_LIMITS); each must be positive."""
    values: dict[str, int | float] = {}
    for name, variable in LIMIT_VARIABLES.items():
        default = getattr(DEFAULT_LIMITS, name)
        value = (
            read.number(variable, default)
            if isinstance(default, float)
            else read.whole(variable, default)
        )
        if value <= 0:
            raise ConfigurationError(f"{variable}={value:g} must be positive")
        values[name] = value
    return Limits(**values)  # type: ignore[arg-type]  # each value has its field's type


def _batch(read: _Reader) -> BatchSettings:
    max_seconds = read.number("SIS_BATCH_MAX_SECONDS", DEFAULT_BATCH_MAX_SECONDS)
    lease_seconds = read.number("SIS_LEASE_SECONDS", DEFAULT_LEASE_SECONDS)
    if lease_seconds < 3 * max_seconds:
        # A tick renews the lease and then consumes for up to max_seconds; the next tick must
        # renew before it expires, with room for the sensor interval and clock skew.
        raise ConfigurationError(
            f"SIS_LEASE_SECONDS={lease_seconds:g} must be at least 3 x SIS_BATCH_MAX_SECONDS"
            f"={max_seconds:g}"
        )
    return BatchSettings(
        deployment=read.text("SIS_DEPLOYMENT", socket.gethostname()),
        max_messages=read.whole("SIS_BATCH_MAX_MESSAGES", DEFAULT_BATCH_MAX_MESSAGES),
        max_bytes=read.whole("SIS_BATCH_MAX_BYTES", DEFAULT_BATCH_MAX_BYTES),
        max_seconds=max_seconds,
        get_wait_seconds=read.number("SIS_GET_WAIT_SECONDS", DEFAULT_GET_WAIT_SECONDS),
        max_runs_in_flight=read.whole("SIS_MAX_RUNS_IN_FLIGHT", DEFAULT_MAX_RUNS_IN_FLIGHT),
        lease_seconds=lease_seconds,
    )


def _source(
    read: _Reader, profile: str, data_dir: Path, limits: Limits, redelivery_limit: int
) -> SourceSettings:
    """The queue source. SIS_SOURCE defaults by profile (activemq: stomp, ibmmq: ibmmq, else
    embedded)."""
    default_source = {"activemq": "stomp", "ibmmq": "ibmmq"}.get(profile, "embedded")
    source = read.text("SIS_SOURCE", default_source)
    if source not in SOURCES:
        raise ConfigurationError(f"SIS_SOURCE={source!r}: expected embedded, stomp or ibmmq")
    backout = Backout(
        _backout_threshold(read, redelivery_limit), read.optional("SIS_BACKOUT_QUEUE")
    )
    if source == "embedded":
        embedded = EmbeddedSourceSettings(
            path=read.text("SIS_QUEUE_DIR", str(data_dir / "queue")),
            queue=read.text("SIS_QUEUE_NAME", DEFAULT_QUEUE_NAME),
            backout=backout,
        )
        _require_other_queue(backout, embedded.queue)
        return embedded
    if source == "stomp":
        stomp = StompSourceSettings(
            host=read.text("SIS_STOMP_HOST", DEFAULT_STOMP_HOST),
            port=read.whole("SIS_STOMP_PORT", DEFAULT_STOMP_PORT),
            destination=read.text("SIS_STOMP_DESTINATION", DEFAULT_STOMP_DESTINATION),
            user=read.optional("SIS_STOMP_USER"),
            has_password=read.optional("SIS_STOMP_PASSWORD") is not None,
            selector=read.optional("SIS_STOMP_SELECTOR"),
            prefetch=read.at_least("SIS_STOMP_PREFETCH", DEFAULT_STOMP_PREFETCH, 1),
            backout=backout,
            redelivery_counts=read.text(
                "SIS_STOMP_REDELIVERY_COUNTS", str(data_dir / "stomp" / "redeliveries.db")
            ),
        )
        _require_other_queue(backout, stomp.destination)
        return stomp
    return _ibmmq(read, f"profile {profile!r}", limits, backout)


def _ibmmq(read: _Reader, needed_by: str, limits: Limits, backout: Backout) -> IbmMqSourceSettings:
    missing = [name for name in IBMMQ_REQUIRED if read.optional(name) is None]
    if missing:
        raise ConfigurationError(
            f"{needed_by} needs {', '.join(missing)} to be set (IBM MQ source not configured)"
        )
    max_message_bytes = limits.max_message_bytes
    max_get_bytes = read.whole("SIS_IBMMQ_MAX_GET_BYTES", 2 * max_message_bytes)
    if max_get_bytes < max_message_bytes:
        # A body the platform accepts must never be turned away by the source.
        raise ConfigurationError(
            f"SIS_IBMMQ_MAX_GET_BYTES={max_get_bytes} must be at least "
            f"SIS_MAX_MESSAGE_BYTES={max_message_bytes}"
        )
    settings = IbmMqSourceSettings(
        queue_manager=read.text("SIS_IBMMQ_QMGR", ""),
        channel=read.text("SIS_IBMMQ_CHANNEL", ""),
        conn_name=read.text("SIS_IBMMQ_CONN", ""),
        queue=read.text("SIS_IBMMQ_QUEUE", ""),
        user=read.optional("SIS_IBMMQ_USER"),
        has_password=read.optional("SIS_IBMMQ_PASSWORD") is not None,
        cipher_spec=read.optional("SIS_IBMMQ_CIPHER_SPEC"),
        key_repository=read.optional("SIS_IBMMQ_KEY_REPOSITORY"),
        certificate_label=read.optional("SIS_IBMMQ_CERT_LABEL"),
        client_reconnect=cast(IbmMqReconnect, read.choice("SIS_IBMMQ_RECONNECT", IBMMQ_RECONNECT)),
        backout=backout,
        max_get_bytes=max_get_bytes,
    )
    _require_other_queue(backout, settings.queue)
    return settings


def _require_other_queue(backout: Backout, queue: str) -> None:
    """SIS_BACKOUT_QUEUE must not name the queue itself (STOMP names with or without their
    /queue/ prefix)."""

    def bare(name: str) -> str:
        return name.removeprefix("/queue/")

    if backout.queue is not None and bare(backout.queue) == bare(queue):
        raise ConfigurationError(f"SIS_BACKOUT_QUEUE={backout.queue!r} is the queue itself")


def _backout_threshold(read: _Reader, redelivery_limit: int) -> int:
    """SIS_BACKOUT_THRESHOLD: 0 (off) or more backouts than SIS_REDELIVERY_LIMIT allows
    deliveries, so that a message coming back is landed and dead-lettered by the fold, with
    its record in the message log, before the source moves it aside unlogged. Unset, it is
    twice the redelivery limit and at least DEFAULT_BACKOUT_THRESHOLD (10 with the default
    limit of 5), so raising the limit alone never makes the configuration invalid."""
    default = max(DEFAULT_BACKOUT_THRESHOLD, 2 * redelivery_limit)
    threshold = read.whole("SIS_BACKOUT_THRESHOLD", default)
    if threshold < 0 or 0 < threshold <= redelivery_limit:
        raise ConfigurationError(
            f"SIS_BACKOUT_THRESHOLD={threshold} must be above SIS_REDELIVERY_LIMIT="
            f"{redelivery_limit} (unset: {default}), or 0 to turn it off"
        )
    return threshold


def _spark(read: _Reader) -> SparkSettings:
    archive = read.optional("SIS_SPARK_CLASS_ARCHIVE")
    if archive is not None and archive != "off" and not Path(archive).is_file():
        raise ConfigurationError(f"SIS_SPARK_CLASS_ARCHIVE={archive!r} is not a file")
    return SparkSettings(
        master=read.text("SIS_SPARK_MASTER", DEFAULT_SPARK_MASTER),
        driver_memory=read.text("SIS_SPARK_DRIVER_MEMORY", DEFAULT_DRIVER_MEMORY),
        shuffle_partitions=read.whole("SIS_SPARK_SHUFFLE_PARTITIONS", DEFAULT_SHUFFLE_PARTITIONS),
        ui_enabled=read.text("SIS_SPARK_UI", "false") == "true",
        jars_dir=read.optional("SIS_SPARK_JARS_DIR"),
        class_archive=archive,
        extra_conf=_spark_conf(read),
    )


def _spark_conf(read: _Reader) -> tuple[tuple[str, str], ...]:
    """SIS_SPARK_CONF: further Spark settings, `key=value` pairs separated by whitespace, e.g.
    `spark.eventLog.enabled=true spark.eventLog.dir=/var/log/spark` (for the history server).
    They are applied last, so they override the platform's own."""
    conf: dict[str, str] = {}
    for pair in (read.optional("SIS_SPARK_CONF") or "").split():
        key, sep, value = pair.partition("=")
        if not sep or not key.startswith("spark.") or not value:
            raise ConfigurationError(f"SIS_SPARK_CONF: {pair!r} is not a spark.<name>=<value> pair")
        conf[key] = value
    return tuple(conf.items())


# -- read at call time ----------------------------------------------------------------------


def secret(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The secret variable `name` (e.g. SIS_STOMP_PASSWORD) from the environment, or None if it
    is unset or empty. Never from a profile file, never kept in `Settings`."""
    if not is_secret(name):
        raise ValueError(f"{name} is not a secret variable")
    return _environment(env).get(name) or None


@dataclass(frozen=True)
class Credentials:
    """A login for a queue URL that names none (the password is left out of the repr)."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)


def url_credentials(scheme: str, env: Mapping[str, str] | None = None) -> Credentials:
    """The environment's login for a queue URL of `scheme` that names none: SIS_STOMP_USER and
    SIS_STOMP_PASSWORD for `stomp`, SIS_IBMMQ_PASSWORD for `ibmmq` (its user is the URL's or
    the settings'); nothing for another scheme."""
    if scheme == "stomp":
        return Credentials(
            _variables(env).optional("SIS_STOMP_USER"), secret("SIS_STOMP_PASSWORD", env)
        )
    if scheme == "ibmmq":
        return Credentials(None, secret("SIS_IBMMQ_PASSWORD", env))
    return Credentials()


def fault_injection(variable: str) -> str | None:
    """A fault-injection hook's variable (FAULT_INJECTION_VARIABLES), read each time it is
    asked, so a test sets it per child process; None when unset or empty."""
    if variable not in FAULT_INJECTION_VARIABLES:
        raise ValueError(f"{variable} is not a fault-injection variable")
    return os.environ.get(variable) or None


def cache_home() -> Path:
    """The user's cache folder: $XDG_CACHE_HOME, else ~/.cache."""
    return Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache"))


def python_workers_use_this_interpreter() -> None:
    """Make PySpark start its Python workers with this interpreter unless the operator chose one.

    PySpark takes the workers' interpreter from $PYSPARK_PYTHON when the session starts (else
    whatever `python3` is first on PATH); in local mode it must be the platform's own (its
    virtualenv holds pandas, pyarrow, lxml and the platform). The Spark settings
    `spark.pyspark.python` and `spark.pyspark.driver.python` do not replace it: pyspark 4.2
    started from Python reads only the environment variable (tried: a local session with
    `spark.pyspark.python` set ran its Arrow workers on the `python3` of PATH).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def child_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process that runs Spark (the Spark Connect server): `env`
    (default: this process's), with PYSPARK_PYTHON this interpreter unless set."""
    child = dict(_environment(env))
    child.setdefault("PYSPARK_PYTHON", sys.executable)
    return child
