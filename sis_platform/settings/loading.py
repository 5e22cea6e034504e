"""`load_settings`: the variables in effect read into `Settings`, section by section, each value
checked (a bad one raises `ConfigurationError` naming the variable and what it accepts)."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from sis_platform.domain.dedup import DedupWindow
from sis_platform.domain.limits import Limits
from sis_platform.settings.environment import (
    Reader,
    config_home,
    is_secret_spark_key,
    variables_in_effect,
)
from sis_platform.settings.records import (
    Backout,
    BatchSettings,
    ConfigurationError,
    EmbeddedSourceSettings,
    FeedChecksSettings,
    IbmMqSourceSettings,
    LakeUpkeepSettings,
    LiveSettings,
    LogSettings,
    NotifySettings,
    ProcessingSettings,
    RetentionSettings,
    ServingSettings,
    Settings,
    SourceSettings,
    SparkSettings,
    StompSourceSettings,
    is_local_master,
    longest_stretch,
)
from sis_platform.settings.transport import (
    TlsFiles,
    check_ssl_peer_name,
    is_loopback,
    listen_address,
)
from sis_platform.settings.variables import (
    DEFAULT_BACKOUT_THRESHOLD,
    DEFAULT_BATCH_MAX_BYTES,
    DEFAULT_BATCH_MAX_MESSAGES,
    DEFAULT_BATCH_MAX_SECONDS,
    DEFAULT_DATA_DIR,
    DEFAULT_DEAD_LETTER_RATE_WARN,
    DEFAULT_DEDUP_WINDOW_BATCHES,
    DEFAULT_DRIVER_MEMORY,
    DEFAULT_FRESHNESS_FAIL_SECONDS,
    DEFAULT_FRESHNESS_WARN_SECONDS,
    DEFAULT_GET_WAIT_SECONDS,
    DEFAULT_LAKE_LAG_FAIL_SECONDS,
    DEFAULT_LAKE_LAG_WARN_SECONDS,
    DEFAULT_LAKE_MAX_FILES,
    DEFAULT_LAKE_OPTIMIZE_EVERY,
    DEFAULT_LAKE_RETAIN_HOURS,
    DEFAULT_LAKE_VACUUM_EVERY,
    DEFAULT_LANDING_MERGE_GRACE_SECONDS,
    DEFAULT_LANDING_RETAIN_DAYS,
    DEFAULT_LEASE_SECONDS,
    DEFAULT_LIMITS,
    DEFAULT_LIVE_BATCH_SECONDS,
    DEFAULT_LIVE_FOLD_WORKERS,
    DEFAULT_LIVE_GROUP_MAX_MESSAGES,
    DEFAULT_LIVE_GROUP_WAIT_MS,
    DEFAULT_LIVE_MAX_LAG_SECONDS,
    DEFAULT_LIVE_MAX_MASTERS,
    DEFAULT_LIVE_PRIORITY_WINDOW,
    DEFAULT_LIVE_REPORT_SECONDS,
    DEFAULT_LIVE_STALL_SECONDS,
    DEFAULT_LOG_KEY_FILE,
    DEFAULT_LOG_WITNESS_DIR,
    DEFAULT_MAX_RUNS_IN_FLIGHT,
    DEFAULT_METRICS_ADDRESS,
    DEFAULT_PARTITION_RETAIN_DAYS,
    DEFAULT_PROFILE,
    DEFAULT_QUARANTINE_AFTER,
    DEFAULT_QUEUE_NAME,
    DEFAULT_REDELIVERY_LIMIT,
    DEFAULT_RUN_RETAIN_DAYS,
    DEFAULT_SENSOR_INTERVAL_SECONDS,
    DEFAULT_SERVING_FILE,
    DEFAULT_SERVING_HISTORY_DAYS,
    DEFAULT_SHUFFLE_PARTITIONS,
    DEFAULT_SPARK_MASTER,
    DEFAULT_STOMP_DESTINATION,
    DEFAULT_STOMP_HEARTBEATS,
    DEFAULT_STOMP_HOST,
    DEFAULT_STOMP_PORT,
    DEFAULT_STOMP_PREFETCH,
    IBMMQ_RECONNECT,
    IBMMQ_REQUIRED,
    INTAKE_MODES,
    LAKE_REPLAY_WINDOW_HOURS,
    LIMIT_VARIABLES,
    LIVE_HEARTBEAT_FILE,
    LOG_FORMATS,
    LOG_KEY_VARIABLE,
    MAX_LIVE_FOLD_WORKERS,
    OTEL_ENDPOINT_VARIABLE,
    OTEL_TRACES_ENDPOINT_VARIABLE,
    PROFILES,
    SERVING_SCHEMES,
    SOURCES,
    SPARK_CONNECT_TOKEN_VARIABLE,
    IbmMqReconnect,
    IntakeMode,
    LogFormat,
)


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """The settings `env` (default: the process environment) configures, all checked."""
    read = variables_in_effect(env)
    profile = read.choice("SIS_PROFILE", PROFILES, DEFAULT_PROFILE)
    data_dir = _data_dir(read)
    limits = _limits(read)
    processing = ProcessingSettings(
        redelivery_limit=read.whole("SIS_REDELIVERY_LIMIT", DEFAULT_REDELIVERY_LIMIT),
        quarantine_after=read.at_least("SIS_QUARANTINE_AFTER", DEFAULT_QUARANTINE_AFTER, 1),
        dedup_window_batches=read.at_least(
            "SIS_DEDUP_WINDOW_BATCHES", DEFAULT_DEDUP_WINDOW_BATCHES, 0
        ),
        selector=read.optional("SIS_SELECTOR"),
        priority=_priority(read),
    )
    spark = _spark(read, data_dir)
    batch = _batch(read)
    if profile == "cluster" and is_local_master(spark.master):
        raise ConfigurationError(
            "profile 'cluster' needs SIS_SPARK_MASTER (spark://, k8s://, yarn or sc://)"
        )
    landing_dir = read.text("SIS_LANDING_DIR", str(data_dir / "landing"))
    live = _live(read, data_dir, batch.lease_seconds)
    _check_dedup_window(processing, live)
    return Settings(
        profile=profile,
        data_dir=data_dir,
        source=_source(read, profile, data_dir, limits, processing.redelivery_limit),
        batch=batch,
        limits=limits,
        processing=processing,
        spark=spark,
        lake_path=read.text("SIS_LAKE_PATH", str(data_dir / "lake")),
        landing_dir=landing_dir,
        serving=_serving(read, data_dir),
        live=live,
        intake=cast(IntakeMode, read.choice("SIS_INTAKE", INTAKE_MODES)),
        sensor_interval_seconds=_sensor_interval(read),
        checks=_checks(read),
        upkeep=_upkeep(read),
        log=_log(read, data_dir, Path(landing_dir)),
        notify=_notify(read),
        log_format=cast(LogFormat, read.choice("SIS_LOG_FORMAT", LOG_FORMATS)),
        retention=_retention(read),
    )


def _check_dedup_window(processing: ProcessingSettings, live: LiveSettings) -> None:
    """SIS_DEDUP_WINDOW_BATCHES, when bounded, at least the longest stretch sis-live folds at
    once (a group, or with SIS_PRIORITY a backlog's window): a stretch folded whole must not
    hold two first copies of one id (sis_platform/domain/dedup.py)."""
    longest = longest_stretch(
        live.group_max_messages, live.priority_window, processing.priority is not None
    )
    if not DedupWindow(processing.dedup_window_batches).holds_stretch(longest):
        raise ConfigurationError(
            f"SIS_DEDUP_WINDOW_BATCHES={processing.dedup_window_batches} must be 0 (the whole "
            f"log) or at least {longest}, the most messages sis-live folds at once "
            "(SIS_LIVE_GROUP_MAX_MESSAGES, or SIS_LIVE_PRIORITY_WINDOW with SIS_PRIORITY)"
        )


def _retention(read: Reader) -> RetentionSettings:
    """How long Dagster keeps `batches` partitions and finished runs (docs/operations.md,
    "Dagster's partitions and runs"): days, at least 0."""
    return RetentionSettings(
        partition_retain_days=read.at_least_number(
            "SIS_PARTITION_RETAIN_DAYS", DEFAULT_PARTITION_RETAIN_DAYS, 0.0
        ),
        run_retain_days=read.at_least_number("SIS_RUN_RETAIN_DAYS", DEFAULT_RUN_RETAIN_DAYS, 0.0),
    )


def sensor_interval_seconds(env: Mapping[str, str] | None = None) -> int:
    """How often the daemon evaluates the queue sensor (SIS_SENSOR_INTERVAL_SECONDS): the
    floor of a message's latency from the queue to its master."""
    return _sensor_interval(variables_in_effect(env))


def spark_settings(env: Mapping[str, str] | None = None) -> SparkSettings:
    """The Spark section alone (the Spark Connect server needs nothing else)."""
    read = variables_in_effect(env)
    return _spark(read, _data_dir(read))


def ibmmq_settings(env: Mapping[str, str] | None = None) -> IbmMqSourceSettings:
    """The IBM MQ source the SIS_IBMMQ_* variables describe (an `ibmmq:` queue URL); the
    backout settings are the source's own defaults."""
    read = variables_in_effect(env)
    return _ibmmq(read, "the queue URL 'ibmmq:'", _limits(read), Backout())


def _data_dir(read: Reader) -> Path:
    return Path(read.text("SIS_DATA_DIR", DEFAULT_DATA_DIR)).resolve()


def _sensor_interval(read: Reader) -> int:
    return read.at_least("SIS_SENSOR_INTERVAL_SECONDS", DEFAULT_SENSOR_INTERVAL_SECONDS, 1)


def _limits(read: Reader) -> Limits:
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


def _batch(read: Reader) -> BatchSettings:
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
    read: Reader, profile: str, data_dir: Path, limits: Limits, redelivery_limit: int
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
        host = read.text("SIS_STOMP_HOST", DEFAULT_STOMP_HOST)
        stomp = StompSourceSettings(
            host=host,
            port=read.whole("SIS_STOMP_PORT", DEFAULT_STOMP_PORT),
            destination=read.text("SIS_STOMP_DESTINATION", DEFAULT_STOMP_DESTINATION),
            user=read.optional("SIS_STOMP_USER"),
            has_password=read.optional("SIS_STOMP_PASSWORD") is not None,
            selector=read.optional("SIS_STOMP_SELECTOR"),
            prefetch=read.at_least("SIS_STOMP_PREFETCH", DEFAULT_STOMP_PREFETCH, 1),
            heartbeats=_stomp_heartbeats(read),
            vhost=read.optional("SIS_STOMP_VHOST"),
            backout=backout,
            redelivery_counts=read.text(
                "SIS_STOMP_REDELIVERY_COUNTS", str(data_dir / "stomp" / "redeliveries.db")
            ),
            **_stomp_tls(read, host),
        )
        _require_other_queue(backout, stomp.destination)
        return stomp
    return _ibmmq(read, f"profile {profile!r}", limits, backout)


def _stomp_heartbeats(read: Reader) -> tuple[int, int]:
    """SIS_STOMP_HEARTBEATS: `SEND_MS,RECEIVE_MS`, two whole numbers of milliseconds."""
    raw = read.optional("SIS_STOMP_HEARTBEATS")
    if raw is None:
        return DEFAULT_STOMP_HEARTBEATS
    parts = [part.strip() for part in raw.split(",")]
    if len(parts) != 2 or not all(part.isdigit() for part in parts):
        raise ConfigurationError(
            f"SIS_STOMP_HEARTBEATS={raw!r}: expected SEND_MS,RECEIVE_MS (e.g. 10000,10000)"
        )
    return int(parts[0]), int(parts[1])


def _stomp_tls(read: Reader, host: str) -> dict[str, Any]:
    """The STOMP source's TLS settings, checked (DESIGN.md invariant 9). SIS_STOMP_TLS unset is
    on unless SIS_STOMP_HOST is this machine (loopback) and no TLS file is given: a connection
    that leaves the host is encrypted and its broker verified, while a broker on this machine
    (the `activemq` profile's) needs no certificate. The broker's certificate and host name are
    verified whenever TLS is on; there is no setting that turns that off. A password is refused
    for a broker off this host over a connection in clear, unless
    SIS_STOMP_ALLOW_PLAINTEXT_CREDENTIALS=true."""
    files = {
        "ca_file": read.optional("SIS_STOMP_CA_FILE"),
        "cert_file": read.optional("SIS_STOMP_CERT_FILE"),
        "key_file": read.optional("SIS_STOMP_KEY_FILE"),
    }
    given = [f"SIS_STOMP_{key.upper()}" for key, path in files.items() if path is not None]
    tls = read.flag("SIS_STOMP_TLS", bool(given) or not is_loopback(host))
    if not tls and given:
        raise ConfigurationError(f"{' and '.join(given)} given with SIS_STOMP_TLS=false")
    for key, path in files.items():
        if path is not None and not Path(path).is_file():
            raise ConfigurationError(f"SIS_STOMP_{key.upper()}={path!r} is not a file")
    if (files["cert_file"] is None) != (files["key_file"] is None):
        raise ConfigurationError(
            "SIS_STOMP_CERT_FILE and SIS_STOMP_KEY_FILE go together (the client certificate and"
            " its key; name one PEM file twice if it holds both)"
        )
    key_password = read.optional("SIS_STOMP_KEY_PASSWORD")
    if tls:
        _check_tls_files(files, key_password)
    allow_plaintext = read.flag("SIS_STOMP_ALLOW_PLAINTEXT_CREDENTIALS", False)
    has_password = read.optional("SIS_STOMP_PASSWORD") is not None
    if has_password and not tls and not is_loopback(host) and not allow_plaintext:
        raise ConfigurationError(
            f"SIS_STOMP_PASSWORD would cross the network in clear: SIS_STOMP_HOST={host!r} is not"
            " this machine and SIS_STOMP_TLS=false; turn TLS on (the default off this host), or"
            " set SIS_STOMP_ALLOW_PLAINTEXT_CREDENTIALS=true if this network must"
        )
    return {
        **files,
        "tls": tls,
        "has_key_password": key_password is not None,
        "allow_plaintext_credentials": allow_plaintext,
    }


def _check_tls_files(files: dict[str, str | None], key_password: str | None) -> None:
    """The TLS files' contents, checked as the STOMP source will load them (the key password is
    used for the check and not kept), so that a bad file stops the start, not the first tick."""
    try:
        TlsFiles(ca_file=files["ca_file"]).context()
    except ValueError as e:
        raise ConfigurationError(f"SIS_STOMP_CA_FILE: {e}") from None
    if files["cert_file"] is not None:
        client = TlsFiles(
            cert_file=files["cert_file"], key_file=files["key_file"], key_password=key_password
        )
        try:
            client.context()
        except ValueError as e:
            raise ConfigurationError(
                f"SIS_STOMP_CERT_FILE, SIS_STOMP_KEY_FILE, SIS_STOMP_KEY_PASSWORD: {e}"
            ) from None


def _ibmmq(read: Reader, needed_by: str, limits: Limits, backout: Backout) -> IbmMqSourceSettings:
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
        ssl_peer_name=read.optional("SIS_IBMMQ_SSL_PEER"),
        client_reconnect=cast(IbmMqReconnect, read.choice("SIS_IBMMQ_RECONNECT", IBMMQ_RECONNECT)),
        backout=backout,
        max_get_bytes=max_get_bytes,
    )
    _require_other_queue(backout, settings.queue)
    try:
        check_ssl_peer_name(settings.ssl_peer_name, settings.cipher_spec)
    except ValueError as e:
        raise ConfigurationError(f"SIS_IBMMQ_SSL_PEER: {e}") from None
    return settings


def _require_other_queue(backout: Backout, queue: str) -> None:
    """SIS_BACKOUT_QUEUE must not name the queue itself (STOMP names with or without their
    /queue/ prefix)."""

    def bare(name: str) -> str:
        return name.removeprefix("/queue/")

    if backout.queue is not None and bare(backout.queue) == bare(queue):
        raise ConfigurationError(f"SIS_BACKOUT_QUEUE={backout.queue!r} is the queue itself")


def _backout_threshold(read: Reader, redelivery_limit: int) -> int:
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


def _spark(read: Reader, data_dir: Path) -> SparkSettings:
    archive = read.optional("SIS_SPARK_CLASS_ARCHIVE")
    if archive is not None and archive != "off" and not Path(archive).is_file():
        raise ConfigurationError(f"SIS_SPARK_CLASS_ARCHIVE={archive!r} is not a file")
    master = read.text("SIS_SPARK_MASTER", DEFAULT_SPARK_MASTER)
    if master.startswith("sc://"):
        _check_spark_connect_url(
            master, has_token=read.optional(SPARK_CONNECT_TOKEN_VARIABLE) is not None
        )
    return SparkSettings(
        master=master,
        driver_memory=read.text("SIS_SPARK_DRIVER_MEMORY", DEFAULT_DRIVER_MEMORY),
        shuffle_partitions=read.whole("SIS_SPARK_SHUFFLE_PARTITIONS", DEFAULT_SHUFFLE_PARTITIONS),
        ui_enabled=read.text("SIS_SPARK_UI", "false") == "true",
        jars_dir=read.optional("SIS_SPARK_JARS_DIR"),
        class_archive=archive,
        scratch_dir=read.text("SIS_SPARK_SCRATCH_DIR", str(data_dir / "spark-scratch")),
        extra_conf=_spark_conf(read),
    )


def _check_spark_connect_url(url: str, *, has_token: bool) -> None:
    """A Spark Connect URL names no token (the runs' configuration holds the URL: the token is
    SPARK_CONNECT_AUTHENTICATE_TOKEN's); and with a token, it names a server PySpark sends the
    token to. PySpark's client sends a token only over TLS (`;use_ssl=true`) or, without TLS,
    to the host `localhost` exactly, over gRPC's local credentials (loopback only); for any other
    host, 127.0.0.1 included, it starts a TLS handshake that a plain server never answers."""
    _, _, tail = url.partition("/;")
    params = {key: value for key, _, value in (p.partition("=") for p in tail.split(";") if p)}
    if "token" in params:
        raise ConfigurationError(
            f"SIS_SPARK_MASTER names a ;token=: set {SPARK_CONNECT_TOKEN_VARIABLE} in the "
            "environment instead (the URL is part of the runs' configuration)"
        )
    host = urlsplit(url).hostname
    if has_token and host != "localhost" and params.get("use_ssl", "").lower() != "true":
        raise ConfigurationError(
            f"SIS_SPARK_MASTER={url!r} with {SPARK_CONNECT_TOKEN_VARIABLE} set: PySpark sends "
            "the token only over TLS (;use_ssl=true) or, without TLS, to sc://localhost:PORT "
            "(a server on this machine): name the host localhost, or add ;use_ssl=true"
        )


def _spark_conf(read: Reader) -> tuple[tuple[str, str], ...]:
    """SIS_SPARK_CONF: further Spark settings, `key=value` pairs separated by whitespace, e.g.
    `spark.eventLog.enabled=true spark.eventLog.dir=/var/log/spark` (for the history server).
    They are applied last, so they override the platform's own. A setting that holds a secret
    is refused (SIS_SPARK_SECRET_CONF takes it)."""
    conf: dict[str, str] = {}
    for pair in (read.optional("SIS_SPARK_CONF") or "").split():
        key, sep, value = pair.partition("=")
        if not sep or not key.startswith("spark.") or not value:
            raise ConfigurationError(f"SIS_SPARK_CONF: {pair!r} is not a spark.<name>=<value> pair")
        if is_secret_spark_key(key):
            # Named without its value: the value is a secret.
            raise ConfigurationError(
                f"SIS_SPARK_CONF: {key} holds a secret, and SIS_SPARK_CONF reaches the Dagster "
                "UI, every run's snapshot and the Spark driver's command line: set it in "
                "SIS_SPARK_SECRET_CONF (environment only, applied to the session once started; "
                "Hadoop settings by their Hadoop name, e.g. fs.s3a.secret.key=...) or use the "
                "connector's own credential chain (AWS_* variables, a Hadoop credential "
                "provider: docs/deployment.md)"
            )
        conf[key] = value
    return tuple(conf.items())


def _serving(read: Reader, data_dir: Path) -> ServingSettings:
    """SIS_SERVING_URL: `sqlite:///<absolute path>` (default: DEFAULT_SERVING_FILE under
    SIS_DATA_DIR) or `postgresql://user@host[:port]/database`; a password in the URL is refused
    (SIS_SERVING_PASSWORD holds it)."""
    default = f"sqlite:///{data_dir / DEFAULT_SERVING_FILE}"
    url = read.text("SIS_SERVING_URL", default)
    parts = urlsplit(url)
    if parts.scheme not in SERVING_SCHEMES:
        raise ConfigurationError(
            f"SIS_SERVING_URL: scheme {parts.scheme or '(none)'!r}: expected sqlite:///<path> "
            "or postgresql://user@host:port/database"
        )
    if parts.password is not None:
        shown = parts._replace(netloc=f"{parts.username}:***@{parts.hostname}").geturl()
        raise ConfigurationError(
            f"SIS_SERVING_URL={shown!r} holds a password: set SIS_SERVING_PASSWORD instead"
        )
    if parts.scheme == "sqlite" and not parts.path.strip("/"):
        raise ConfigurationError(f"SIS_SERVING_URL={url!r}: expected sqlite:///<path>")
    if parts.scheme == "postgresql" and not (parts.hostname and parts.path.strip("/")):
        raise ConfigurationError(
            f"SIS_SERVING_URL={url!r}: expected postgresql://user@host:port/database"
        )
    return ServingSettings(
        url,
        has_password=read.optional("SIS_SERVING_PASSWORD") is not None,
        history_days=read.at_least_number(
            "SIS_SERVING_HISTORY_DAYS", DEFAULT_SERVING_HISTORY_DAYS, 0.0
        ),
    )


def _log(read: Reader, data_dir: Path, landing_dir: Path) -> LogSettings:
    """SIS_LOG_KEY (environment only) or SIS_LOG_KEY_FILE, and SIS_LOG_WITNESS: both files must
    resolve outside the data folder and the landing zone, or whoever can rewrite the log could
    rewrite its key and witness too."""
    home = config_home()
    key_file = read.optional("SIS_LOG_KEY_FILE")
    landing = landing_dir.resolve()
    default_witness = hashlib.sha256(str(landing).encode()).hexdigest()[:16] + ".json"
    witness = read.optional("SIS_LOG_WITNESS")
    settings = LogSettings(
        key_file=Path(key_file or home / DEFAULT_LOG_KEY_FILE).resolve(),
        witness=Path(witness or home / DEFAULT_LOG_WITNESS_DIR / default_witness).resolve(),
        has_key=bool(read.variables.get(LOG_KEY_VARIABLE)),
        create_key=key_file is None,
    )
    folders = {"SIS_DATA_DIR": data_dir, "SIS_LANDING_DIR": landing}
    if not settings.has_key:
        _check_outside("SIS_LOG_KEY_FILE", settings.key_file, folders)
    _check_outside("SIS_LOG_WITNESS", settings.witness, folders)
    return settings


def _check_outside(name: str, path: Path, folders: dict[str, Path]) -> None:
    for what, folder in folders.items():
        if path.is_relative_to(folder):
            raise ConfigurationError(
                f"{name}={str(path)!r} lies inside {what} ({folder}): the log's key and "
                "witness must be out of reach of whoever can write the data folder"
            )


def _live(read: Reader, data_dir: Path, lease_seconds: float) -> LiveSettings:
    wait_ms = read.number("SIS_LIVE_GROUP_WAIT_MS", DEFAULT_LIVE_GROUP_WAIT_MS)
    if not 0 <= wait_ms <= 1000:
        raise ConfigurationError(f"SIS_LIVE_GROUP_WAIT_MS={wait_ms:g} must be 0 to 1000")
    report = read.number("SIS_LIVE_REPORT_SECONDS", DEFAULT_LIVE_REPORT_SECONDS)
    lag = read.number("SIS_LIVE_MAX_LAG_SECONDS", DEFAULT_LIVE_MAX_LAG_SECONDS)
    if report < 1 or lag <= 0:
        raise ConfigurationError(
            f"SIS_LIVE_REPORT_SECONDS={report:g} must be at least 1 and "
            f"SIS_LIVE_MAX_LAG_SECONDS={lag:g} positive"
        )
    return LiveSettings(
        heartbeat_file=Path(
            read.text("SIS_LIVE_HEARTBEAT_FILE", str(data_dir / LIVE_HEARTBEAT_FILE))
        ),
        group_wait_seconds=wait_ms / 1000,
        group_max_messages=read.at_least(
            "SIS_LIVE_GROUP_MAX_MESSAGES", DEFAULT_LIVE_GROUP_MAX_MESSAGES, 1
        ),
        max_masters_in_memory=read.at_least("SIS_LIVE_MAX_MASTERS", DEFAULT_LIVE_MAX_MASTERS, 1),
        report_seconds=report,
        max_lag_seconds=lag,
        batch_seconds=read.at_least_number(
            "SIS_LIVE_BATCH_SECONDS", DEFAULT_LIVE_BATCH_SECONDS, 1.0
        ),
        priority_window=read.at_least("SIS_LIVE_PRIORITY_WINDOW", DEFAULT_LIVE_PRIORITY_WINDOW, 1),
        fold_workers=_fold_workers(read),
        stall_seconds=_stall_seconds(read, lease_seconds),
        merge_grace_seconds=read.at_least_number(
            "SIS_LANDING_MERGE_GRACE_SECONDS", DEFAULT_LANDING_MERGE_GRACE_SECONDS, 0.0
        ),
        landing_retain_days=read.at_least_number(
            "SIS_LANDING_RETAIN_DAYS", DEFAULT_LANDING_RETAIN_DAYS, 1.0
        ),
        metrics_address=_metrics_address(read),
        traces_endpoint=_traces_endpoint(read),
    )


def _traces_endpoint(read: Reader) -> str | None:
    """The OTLP/HTTP URL of sis-live's traces: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it is, or
    OTEL_EXPORTER_OTLP_ENDPOINT with `/v1/traces` appended (the SDK's rule); None: tracing off.
    https, or plain http to a loopback address only (message and master ids must not cross a
    network in clear), never with credentials (OTEL_EXPORTER_OTLP_HEADERS carries them)."""
    name = OTEL_TRACES_ENDPOINT_VARIABLE
    url = read.optional(name)
    if url is None:
        name = OTEL_ENDPOINT_VARIABLE
        base = read.optional(name)
        if base is None:
            return None
        url = base.rstrip("/") + "/v1/traces"
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ConfigurationError(f"{name}={url!r}: expected https://host[:port][/path]")
    if parts.username is not None or parts.password is not None:
        raise ConfigurationError(
            f"{name} holds credentials: set OTEL_EXPORTER_OTLP_HEADERS in the environment instead"
        )
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ConfigurationError(
            f"{name}={url!r}: plain http leaves the host only over https; "
            "use https (http is accepted for a loopback address)"
        )
    return url


def _metrics_address(read: Reader) -> tuple[str, int] | None:
    """SIS_METRICS_ADDRESS: `HOST:PORT` or `off`. Another host than loopback is taken as the
    operator's choice (a pod's address for Prometheus to scrape): the default stays loopback."""
    raw = read.text("SIS_METRICS_ADDRESS", DEFAULT_METRICS_ADDRESS)
    try:
        return listen_address(raw)
    except ValueError as error:
        raise ConfigurationError(f"SIS_METRICS_ADDRESS={raw!r}: {error}") from None


def _stall_seconds(read: Reader, lease_seconds: float) -> float:
    """SIS_LIVE_STALL_SECONDS: more than half the lease, which a standby beats a quarter of
    (unset: the default, or the lease if that is longer)."""
    default = max(DEFAULT_LIVE_STALL_SECONDS, lease_seconds)
    stall = read.number("SIS_LIVE_STALL_SECONDS", default)
    if stall <= lease_seconds / 2:
        raise ConfigurationError(
            f"SIS_LIVE_STALL_SECONDS={stall:g} must be more than half of "
            f"SIS_LEASE_SECONDS={lease_seconds:g}"
        )
    return stall


def _fold_workers(read: Reader) -> int:
    workers = read.at_least("SIS_LIVE_FOLD_WORKERS", DEFAULT_LIVE_FOLD_WORKERS, 0)
    if workers > MAX_LIVE_FOLD_WORKERS:
        raise ConfigurationError(
            f"SIS_LIVE_FOLD_WORKERS={workers} must be at most {MAX_LIVE_FOLD_WORKERS}"
        )
    return workers


def _priority(read: Reader) -> str | None:
    """SIS_PRIORITY, every selector in it compiled once here so that a bad one stops the
    start with its position, not the first stretch folded."""
    text = read.optional("SIS_PRIORITY")
    if text is None:
        return None
    # Here, not at the top: reading the settings must not load lxml (a CLI's --help is quick).
    from sis_platform.domain.priority import Priority
    from sis_platform.standards.selector import InvalidSelector

    try:
        Priority.compile(text)
    except InvalidSelector as error:
        raise ConfigurationError(f"SIS_PRIORITY: {error}") from None
    return text


def _notify(read: Reader) -> NotifySettings:
    """SIS_NOTIFY_WEBHOOK_URL: https, or plain http to a loopback address only (a token and
    the failures it carries must not cross a network in clear), never with credentials (the
    token comes from SIS_NOTIFY_WEBHOOK_TOKEN)."""
    url = read.optional("SIS_NOTIFY_WEBHOOK_URL")
    if url is None:
        return NotifySettings()
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ConfigurationError(
            f"SIS_NOTIFY_WEBHOOK_URL={url!r}: expected https://host[:port]/path"
        )
    if parts.username is not None or parts.password is not None:
        raise ConfigurationError(
            "SIS_NOTIFY_WEBHOOK_URL holds credentials: set SIS_NOTIFY_WEBHOOK_TOKEN instead"
        )
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ConfigurationError(
            f"SIS_NOTIFY_WEBHOOK_URL={url!r}: plain http leaves the host only over https; "
            "use https (http is accepted for a loopback address)"
        )
    return NotifySettings(url)


def _upkeep(read: Reader) -> LakeUpkeepSettings:
    """Delta upkeep of the fold's and the model's tables (docs/operations.md, "The lake's
    files"). A retention under the replay window would let VACUUM remove files that an
    interrupted step's recovery or a reader still needs."""
    retain = read.number("SIS_LAKE_RETAIN_HOURS", DEFAULT_LAKE_RETAIN_HOURS)
    if not retain >= LAKE_REPLAY_WINDOW_HOURS:
        raise ConfigurationError(
            f"SIS_LAKE_RETAIN_HOURS={retain:g} is under the lake's replay window of "
            f"{LAKE_REPLAY_WINDOW_HOURS:g} hours: VACUUM would remove files that an "
            "interrupted step's recovery or a reader of an older table version still needs"
        )
    return LakeUpkeepSettings(
        optimize_every=read.at_least("SIS_LAKE_OPTIMIZE_EVERY", DEFAULT_LAKE_OPTIMIZE_EVERY, 0),
        vacuum_every=read.at_least("SIS_LAKE_VACUUM_EVERY", DEFAULT_LAKE_VACUUM_EVERY, 0),
        retain_hours=retain,
        max_files=read.at_least("SIS_LAKE_MAX_FILES", DEFAULT_LAKE_MAX_FILES, 1),
    )


def _checks(read: Reader) -> FeedChecksSettings:
    """The feed checks' thresholds and the freshness windows (docs/operations.md, "Checks that
    watch the feed"). Dagster's freshness windows are a minute at least, the warning shorter
    than the failure."""
    lag_warn = read.number("SIS_LAKE_LAG_WARN_SECONDS", DEFAULT_LAKE_LAG_WARN_SECONDS)
    lag_fail = read.number("SIS_LAKE_LAG_FAIL_SECONDS", DEFAULT_LAKE_LAG_FAIL_SECONDS)
    if not 0 < lag_warn <= lag_fail:
        raise ConfigurationError(
            f"SIS_LAKE_LAG_WARN_SECONDS={lag_warn:g} must be positive and at most "
            f"SIS_LAKE_LAG_FAIL_SECONDS={lag_fail:g}"
        )
    rate = read.number("SIS_DEAD_LETTER_RATE_WARN", DEFAULT_DEAD_LETTER_RATE_WARN)
    if not 0 < rate <= 1:
        raise ConfigurationError(
            f"SIS_DEAD_LETTER_RATE_WARN={rate:g} must be a share above 0 and at most 1"
        )
    fresh_warn = read.number("SIS_FRESHNESS_WARN_SECONDS", DEFAULT_FRESHNESS_WARN_SECONDS)
    fresh_fail = read.number("SIS_FRESHNESS_FAIL_SECONDS", DEFAULT_FRESHNESS_FAIL_SECONDS)
    if not 60 <= fresh_warn < fresh_fail:
        raise ConfigurationError(
            f"SIS_FRESHNESS_WARN_SECONDS={fresh_warn:g} must be at least 60 and under "
            f"SIS_FRESHNESS_FAIL_SECONDS={fresh_fail:g}"
        )
    return FeedChecksSettings(
        lake_lag_warn_seconds=lag_warn,
        lake_lag_fail_seconds=lag_fail,
        dead_letter_rate_warn=rate,
        freshness_warn_seconds=fresh_warn,
        freshness_fail_seconds=fresh_fail,
    )
