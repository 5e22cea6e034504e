"""The settings (sis_platform/settings/): defaults, every check a bad value fails at start,
the profile file, secrets kept out of the settings and the file, and what is read at call time."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from sis_platform import settings
from sis_platform.domain.limits import DEFAULT_LIMITS
from sis_platform.live.config import LiveConfig
from sis_platform.resources import config
from sis_platform.settings import (
    ConfigurationError,
    EmbeddedSourceSettings,
    IbmMqSourceSettings,
    Settings,
    StompSourceSettings,
    load_settings,
)
from tests.queues.pki import CLIENT_KEY_PASSWORD, Pki, make_pki

REPO = Path(__file__).resolve().parents[1]
IBMMQ = {
    "SIS_PROFILE": "ibmmq",
    "SIS_IBMMQ_QMGR": "QM1",
    "SIS_IBMMQ_CHANNEL": "DEV.APP.SVRCONN",
    "SIS_IBMMQ_CONN": "mq1(1414)",
    "SIS_IBMMQ_QUEUE": "SPORTSDATA.IN",
}


def test_defaults(tmp_path: Path) -> None:
    s = load_settings({"SIS_DATA_DIR": str(tmp_path), "SIS_DEPLOYMENT": "prod"})
    assert (s.profile, s.data_dir, s.sensor_interval_seconds) == ("local", tmp_path, 5)
    assert s.source == EmbeddedSourceSettings(path=str(tmp_path / "queue"))
    assert (s.source.queue, s.source.backout.threshold, s.source.backout.queue) == (
        "SPORTSDATA",
        10,
        None,
    )
    assert (s.lake_path, s.landing_dir) == (str(tmp_path / "lake"), str(tmp_path / "landing"))
    batch = s.batch
    assert (batch.deployment, batch.max_messages, batch.max_bytes) == ("prod", 50_000, 64 << 20)
    assert (batch.max_seconds, batch.get_wait_seconds, batch.max_runs_in_flight) == (10, 0.5, 2)
    assert batch.lease_seconds == 60
    assert s.limits == DEFAULT_LIMITS
    assert (s.processing.redelivery_limit, s.processing.quarantine_after) == (5, 3)
    assert s.processing.selector is None
    spark = s.spark
    assert (spark.master, spark.driver_memory, spark.shuffle_partitions) == ("local[*]", "1536m", 4)
    assert (spark.ui_enabled, spark.jars_dir, spark.class_archive, spark.extra_conf) == (
        False,
        None,
        None,
        (),
    )


def test_the_live_path_is_the_default_intake(tmp_path: Path) -> None:
    s = load_settings({"SIS_DATA_DIR": str(tmp_path)})
    assert s.intake == "live"
    assert s.serving == settings.ServingSettings(f"sqlite:///{tmp_path}/serving/serving.db")
    assert s.live == settings.LiveSettings(heartbeat_file=tmp_path / "run" / "sis-live.heartbeat")
    assert (s.live.group_wait_seconds, s.live.group_max_messages) == (0.002, 2000)
    chosen = load_settings(
        {
            "SIS_DATA_DIR": str(tmp_path),
            "SIS_INTAKE": "sensor",
            "SIS_SERVING_URL": "postgresql://sis@db.internal:5432/serving",
            "SIS_SERVING_PASSWORD": "pw",
            "SIS_LIVE_GROUP_WAIT_MS": "0",
        }
    )
    assert (chosen.intake, chosen.live.group_wait_seconds) == ("sensor", 0.0)
    assert chosen.serving == settings.ServingSettings(
        "postgresql://sis@db.internal:5432/serving", has_password=True
    )
    assert "pw" not in repr(chosen)


def test_the_resources_take_their_defaults_from_the_settings(tmp_path: Path) -> None:
    # A resource built without a value has the same default the settings give its variable.
    s = load_settings({"SIS_DATA_DIR": str(tmp_path)})
    resources = config.resources(s)
    landing, processing = resources["landing"], resources["processing"]
    assert (landing.max_messages, landing.max_bytes) == (s.batch.max_messages, s.batch.max_bytes)
    assert (landing.max_seconds, landing.get_wait_seconds) == (10.0, 0.5)
    assert landing.max_runs_in_flight == s.batch.max_runs_in_flight
    assert processing.limits() == s.limits
    assert (processing.redelivery_limit, processing.quarantine_after) == (5, 3)
    assert resources["lake"].base_path == s.lake_path
    # config.resources takes a mapping of variables as well, and both give the same resources.
    assert config.resources({"SIS_DATA_DIR": str(tmp_path)})["landing"] == landing


def test_profiles_pick_the_source(tmp_path: Path) -> None:
    base = {"SIS_DATA_DIR": str(tmp_path)}
    stomp = load_settings({**base, "SIS_PROFILE": "activemq"}).source
    assert stomp == StompSourceSettings(redelivery_counts=str(tmp_path / "stomp/redeliveries.db"))
    assert (stomp.host, stomp.port, stomp.destination, stomp.prefetch) == (
        "127.0.0.1",
        61613,
        "/queue/SPORTSDATA",
        100,
    )
    ibmmq = load_settings({**base, **IBMMQ}).source
    assert isinstance(ibmmq, IbmMqSourceSettings)
    assert (ibmmq.client_reconnect, ibmmq.max_get_bytes) == ("disabled", 8 << 20)
    cluster = {**base, "SIS_PROFILE": "cluster", "SIS_SPARK_MASTER": "spark://m:7077"}
    assert isinstance(load_settings(cluster).source, EmbeddedSourceSettings)
    assert isinstance(load_settings({**cluster, "SIS_SOURCE": "stomp"}).source, StompSourceSettings)


def test_ibmmq_settings_read_the_sis_ibmmq_variables() -> None:
    environ = {
        **IBMMQ,
        "SIS_IBMMQ_USER": "app",
        "SIS_IBMMQ_PASSWORD": "s3cr3t-Pa55w0rd",
        "SIS_IBMMQ_CIPHER_SPEC": "ANY_TLS12_OR_HIGHER",
        "SIS_IBMMQ_KEY_REPOSITORY": "/keys/client",
        "SIS_IBMMQ_RECONNECT": "qmgr",
    }
    source = settings.ibmmq_settings(environ)
    assert (source.queue_manager, source.channel, source.conn_name, source.queue) == (
        "QM1",
        "DEV.APP.SVRCONN",
        "mq1(1414)",
        "SPORTSDATA.IN",
    )
    assert (source.user, source.cipher_spec, source.key_repository) == (
        "app",
        "ANY_TLS12_OR_HIGHER",
        "/keys/client",
    )
    assert source.client_reconnect == "qmgr"
    assert source.has_password and "s3cr3t" not in repr(source)
    assert load_settings(environ).source == source


def test_ibmmq_settings_name_every_missing_variable() -> None:
    with pytest.raises(
        ConfigurationError, match="needs SIS_IBMMQ_CHANNEL, SIS_IBMMQ_CONN, SIS_IBMMQ_QUEUE to be"
    ):
        settings.ibmmq_settings({"SIS_IBMMQ_QMGR": "QM1"})
    with pytest.raises(
        ConfigurationError, match="profile 'ibmmq' needs SIS_IBMMQ_QMGR, SIS_IBMMQ_QUEUE to be set"
    ):
        load_settings({**IBMMQ, "SIS_IBMMQ_QMGR": "", "SIS_IBMMQ_QUEUE": " "})


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"SIS_PROFILE": "prod"}, "SIS_PROFILE='prod': expected one of local, activemq, ibmmq"),
        ({"SIS_SOURCE": "kafka"}, "SIS_SOURCE='kafka': expected embedded, stomp or ibmmq"),
        ({"SIS_PROFILE": "cluster"}, "profile 'cluster' needs SIS_SPARK_MASTER"),
        ({"SIS_BATCH_MAX_MESSAGES": "5k"}, "SIS_BATCH_MAX_MESSAGES='5k' is not a whole number"),
        ({"SIS_BATCH_MAX_SECONDS": "soon"}, "SIS_BATCH_MAX_SECONDS='soon' is not a number"),
        ({"SIS_LEASE_SECONDS": "20"}, "SIS_LEASE_SECONDS=20 must be at least 3 x SIS_BATCH_MAX"),
        ({"SIS_SENSOR_INTERVAL_SECONDS": "0"}, "SIS_SENSOR_INTERVAL_SECONDS=0 must be at least 1"),
        ({"SIS_QUARANTINE_AFTER": "0"}, "SIS_QUARANTINE_AFTER=0 must be at least 1"),
        ({"SIS_DEDUP_WINDOW_BATCHES": "-1"}, "SIS_DEDUP_WINDOW_BATCHES=-1 must be at least 0"),
        (
            {"SIS_DEDUP_WINDOW_BATCHES": "1999"},
            "SIS_DEDUP_WINDOW_BATCHES=1999 must be 0 (the whole log) or at least 2000",
        ),
        (
            {"SIS_DEDUP_WINDOW_BATCHES": "5000", "SIS_PRIORITY": "sport = 'football'"},
            "SIS_DEDUP_WINDOW_BATCHES=5000 must be 0 (the whole log) or at least 20000",
        ),
        ({"SIS_REDELIVERY_LIMIT": "x"}, "SIS_REDELIVERY_LIMIT='x' is not a whole number"),
        ({"SIS_MAX_IDS": "0"}, "SIS_MAX_IDS=0 must be positive"),
        ({"SIS_ITEM_BUDGET_SECONDS": "-1.5"}, "SIS_ITEM_BUDGET_SECONDS=-1.5 must be positive"),
        ({"SIS_BACKOUT_THRESHOLD": "3"}, "SIS_BACKOUT_THRESHOLD=3 must be above SIS_REDELIVERY"),
        ({"SIS_BACKOUT_QUEUE": "SPORTSDATA"}, "SIS_BACKOUT_QUEUE='SPORTSDATA' is the queue"),
        ({"SIS_PROFILE": "activemq", "SIS_STOMP_PORT": "x"}, "SIS_STOMP_PORT='x' is not a whole"),
        ({"SIS_PROFILE": "activemq", "SIS_STOMP_PREFETCH": "0"}, "SIS_STOMP_PREFETCH=0 must be"),
        ({"SIS_PROFILE": "activemq", "SIS_STOMP_TLS": "yes"}, "SIS_STOMP_TLS='yes': expected true"),
        (
            {"SIS_PROFILE": "activemq", "SIS_STOMP_CA_FILE": "/no/ca.pem"},
            "SIS_STOMP_CA_FILE='/no/ca.pem' is not a file",
        ),
        (
            {
                "SIS_PROFILE": "activemq",
                "SIS_STOMP_CA_FILE": "/no/ca.pem",
                "SIS_STOMP_TLS": "false",
            },
            "SIS_STOMP_CA_FILE given with SIS_STOMP_TLS=false",
        ),
        (
            {"SIS_PROFILE": "activemq", "SIS_STOMP_ALLOW_PLAINTEXT_CREDENTIALS": "1"},
            "SIS_STOMP_ALLOW_PLAINTEXT_CREDENTIALS='1': expected true or false",
        ),
        ({**IBMMQ, "SIS_IBMMQ_RECONNECT": "always"}, "SIS_IBMMQ_RECONNECT='always': expected"),
        ({**IBMMQ, "SIS_IBMMQ_MAX_GET_BYTES": "1"}, "SIS_IBMMQ_MAX_GET_BYTES=1 must be at least"),
        ({"SIS_SPARK_SHUFFLE_PARTITIONS": "many"}, "SIS_SPARK_SHUFFLE_PARTITIONS='many' is not"),
        ({"SIS_SPARK_CONF": "spark.a"}, "SIS_SPARK_CONF: 'spark.a' is not a spark.<name>=<value>"),
        ({"SIS_SPARK_CLASS_ARCHIVE": "/no/such.jsa"}, "SIS_SPARK_CLASS_ARCHIVE='/no/such.jsa' is"),
        ({"SIS_INTAKE": "both"}, "SIS_INTAKE='both': expected one of live, sensor"),
        ({"SIS_SERVING_URL": "redis://h/0"}, "SIS_SERVING_URL: scheme 'redis': expected sqlite"),
        ({"SIS_SERVING_URL": "sqlite:///"}, "SIS_SERVING_URL='sqlite:///': expected sqlite:///"),
        ({"SIS_SERVING_URL": "postgresql://u@h"}, "expected postgresql://user@host:port/database"),
        ({"SIS_SERVING_URL": "postgresql://u:pw@h/db"}, "'postgresql://u:***@h/db' holds a pass"),
        ({"SIS_SERVING_HISTORY_DAYS": "-1"}, "SIS_SERVING_HISTORY_DAYS=-1 must be at least 0"),
        ({"SIS_LIVE_GROUP_WAIT_MS": "5000"}, "SIS_LIVE_GROUP_WAIT_MS=5000 must be 0 to 1000"),
        ({"SIS_LIVE_GROUP_MAX_MESSAGES": "0"}, "SIS_LIVE_GROUP_MAX_MESSAGES=0 must be at least 1"),
        ({"SIS_LIVE_MAX_MASTERS": "0"}, "SIS_LIVE_MAX_MASTERS=0 must be at least 1"),
        ({"SIS_LIVE_REPORT_SECONDS": "0.5"}, "SIS_LIVE_REPORT_SECONDS=0.5 must be at least 1"),
        ({"SIS_LIVE_MAX_LAG_SECONDS": "0"}, "SIS_LIVE_MAX_LAG_SECONDS=0 positive"),
        ({"SIS_LIVE_BATCH_SECONDS": "0.5"}, "SIS_LIVE_BATCH_SECONDS=0.5 must be at least 1"),
        ({"SIS_LIVE_PRIORITY_WINDOW": "0"}, "SIS_LIVE_PRIORITY_WINDOW=0 must be at least 1"),
        ({"SIS_LIVE_FOLD_WORKERS": "-1"}, "SIS_LIVE_FOLD_WORKERS=-1 must be at least 0"),
        ({"SIS_LIVE_FOLD_WORKERS": "65"}, "SIS_LIVE_FOLD_WORKERS=65 must be at most 64"),
        ({"SIS_METRICS_ADDRESS": "9464"}, "SIS_METRICS_ADDRESS='9464': expected HOST:PORT"),
        ({"SIS_METRICS_ADDRESS": "127.0.0.1:0"}, "SIS_METRICS_ADDRESS='127.0.0.1:0': port '0'"),
        ({"SIS_METRICS_ADDRESS": ":9464"}, "SIS_METRICS_ADDRESS=':9464': expected HOST:PORT"),
        ({"SIS_LOG_FORMAT": "xml"}, "SIS_LOG_FORMAT='xml': expected one of text, json"),
        ({"SIS_PRIORITY": "sport = 'x';"}, "selector: priority selector 2 is empty"),
        ({"SIS_PRIORITY": "sport = 'x'; sport ="}, "priority selector 2: expected a value"),
    ],
)
def test_a_bad_value_fails_at_start_naming_the_variable(
    tmp_path: Path, variables: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        load_settings({"SIS_DATA_DIR": str(tmp_path), **variables})
    # The code location's resources fail the same way.
    with pytest.raises(config.ConfigurationError, match=re.escape(message)):
        config.resources({"SIS_DATA_DIR": str(tmp_path), **variables})


def test_sis_priority_reaches_sis_live_and_the_lake_s_fold(tmp_path: Path) -> None:
    text = "sport = 'horse-racing' AND country = 'IE'; sport = 'horse-racing'"
    env = {"SIS_DATA_DIR": str(tmp_path), "SIS_PRIORITY": text, "SIS_LIVE_PRIORITY_WINDOW": "900"}
    live = LiveConfig.from_settings(load_settings(env))
    assert live.fold.priority is not None and len(live.fold.priority.selectors) == 2
    assert live.priority_window == 900
    assert config.resources(env)["processing"].priority == text


def test_the_serving_history_window_reaches_sis_live(tmp_path: Path) -> None:
    env = {"SIS_DATA_DIR": str(tmp_path)}
    assert LiveConfig.from_settings(load_settings(env)).serving_history == timedelta(days=30)
    env["SIS_SERVING_HISTORY_DAYS"] = "0.5"
    assert LiveConfig.from_settings(load_settings(env)).serving_history == timedelta(hours=12)


def test_sis_live_fold_workers_reach_sis_live(tmp_path: Path) -> None:
    env = {"SIS_DATA_DIR": str(tmp_path)}
    assert LiveConfig.from_settings(load_settings(env)).fold_workers == 1
    env["SIS_LIVE_FOLD_WORKERS"] = "0"
    assert LiveConfig.from_settings(load_settings(env)).fold_workers == 0


def test_an_empty_variable_means_its_default(tmp_path: Path) -> None:
    s = load_settings({"SIS_DATA_DIR": str(tmp_path), "SIS_BATCH_MAX_MESSAGES": " "})
    assert s.batch.max_messages == 50_000


def test_a_secret_is_never_held_in_the_settings(tmp_path: Path) -> None:
    env = {
        "SIS_DATA_DIR": str(tmp_path),
        "SIS_PROFILE": "activemq",
        "SIS_STOMP_USER": "feed",
        "SIS_STOMP_PASSWORD": "hunter2",
    }
    s = load_settings(env)
    assert isinstance(s.source, StompSourceSettings)
    assert s.source.has_password and s.source.user == "feed"
    assert "hunter2" not in repr(s)
    queue = config.resources(env)["queue"]
    assert "hunter2" not in repr(queue)  # bound as dg.EnvVar, read when used
    assert settings.secret("SIS_STOMP_PASSWORD", env) == "hunter2"
    assert settings.secret("SIS_IBMMQ_PASSWORD", env) is None
    credentials = settings.url_credentials("stomp", env)
    assert (credentials.user, credentials.password) == ("feed", "hunter2")
    assert "hunter2" not in repr(credentials)
    with pytest.raises(ValueError, match="SIS_STOMP_USER is not a secret"):
        settings.secret("SIS_STOMP_USER", env)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_stomp_uses_tls_unless_the_broker_is_on_this_host(tmp_path: Path, pki: Pki) -> None:
    base = {"SIS_DATA_DIR": str(tmp_path), "SIS_PROFILE": "activemq"}

    def stomp(**variables: str) -> StompSourceSettings:
        source = load_settings({**base, **variables}).source
        assert isinstance(source, StompSourceSettings)
        return source

    assert not stomp().tls  # 127.0.0.1, the activemq profile's broker on this machine
    assert not stomp(SIS_STOMP_HOST="localhost").tls
    assert not stomp(SIS_STOMP_HOST="::1").tls
    remote = stomp(SIS_STOMP_HOST="broker.example")
    assert remote.tls and (remote.ca_file, remote.cert_file, remote.key_file) == (None,) * 3
    assert stomp(SIS_STOMP_HOST="localhost", SIS_STOMP_TLS="true").tls
    with_ca = stomp(SIS_STOMP_CA_FILE=str(pki.ca_file))  # a CA file means TLS, wherever
    assert with_ca.tls and with_ca.ca_file == str(pki.ca_file)
    assert not stomp(SIS_STOMP_HOST="broker.example", SIS_STOMP_TLS="false").tls  # no password


def test_a_stomp_password_never_crosses_the_network_in_clear_unless_allowed(
    tmp_path: Path,
) -> None:
    env = {
        "SIS_DATA_DIR": str(tmp_path),
        "SIS_PROFILE": "activemq",
        "SIS_STOMP_HOST": "10.1.2.3",
        "SIS_STOMP_USER": "feed",
        "SIS_STOMP_PASSWORD": "hunter2",
        "SIS_STOMP_TLS": "false",
    }
    with pytest.raises(ConfigurationError) as raised:
        load_settings(env)
    message = str(raised.value)
    assert message.startswith("SIS_STOMP_PASSWORD would cross the network in clear")
    assert "SIS_STOMP_HOST='10.1.2.3'" in message
    assert "SIS_STOMP_ALLOW_PLAINTEXT_CREDENTIALS=true" in message
    assert "hunter2" not in message
    with pytest.raises(ConfigurationError, match="SIS_STOMP_PASSWORD would cross"):
        config.resources(env)
    # Loopback, TLS (the default off this host) or the explicit opt-out: accepted.
    assert load_settings({**env, "SIS_STOMP_HOST": "127.0.0.1"}).source
    on = load_settings({k: v for k, v in env.items() if k != "SIS_STOMP_TLS"}).source
    assert isinstance(on, StompSourceSettings) and on.tls
    allowed = load_settings({**env, "SIS_STOMP_ALLOW_PLAINTEXT_CREDENTIALS": "true"}).source
    assert isinstance(allowed, StompSourceSettings)
    assert (allowed.tls, allowed.allow_plaintext_credentials) == (False, True)
    source = config.resources({**env, "SIS_STOMP_ALLOW_PLAINTEXT_CREDENTIALS": "true"})["queue"]
    assert source.allow_plaintext_credentials and not source.tls


def test_a_client_certificate_needs_its_key_and_the_files_must_exist(
    tmp_path: Path, pki: Pki
) -> None:
    cert, key = pki.client_cert, pki.client_encrypted_key
    base = {"SIS_DATA_DIR": str(tmp_path), "SIS_PROFILE": "activemq"}
    for variables in ({"SIS_STOMP_CERT_FILE": str(cert)}, {"SIS_STOMP_KEY_FILE": str(key)}):
        with pytest.raises(ConfigurationError, match="SIS_STOMP_CERT_FILE and SIS_STOMP_KEY_FILE"):
            load_settings({**base, **variables})
    with pytest.raises(ConfigurationError, match="SIS_STOMP_KEY_FILE='.*/nokey' is not a file"):
        load_settings(
            {
                **base,
                "SIS_STOMP_CERT_FILE": str(cert),
                "SIS_STOMP_KEY_FILE": str(tmp_path / "nokey"),
            }
        )
    env = {
        **base,
        "SIS_STOMP_CERT_FILE": str(cert),
        "SIS_STOMP_KEY_FILE": str(key),
        "SIS_STOMP_KEY_PASSWORD": CLIENT_KEY_PASSWORD,
    }
    s = load_settings(env).source
    assert isinstance(s, StompSourceSettings)
    assert (s.tls, s.cert_file, s.key_file, s.has_key_password) == (True, str(cert), str(key), True)
    assert CLIENT_KEY_PASSWORD not in repr(s)
    queue = config.resources(env)["queue"]
    assert CLIENT_KEY_PASSWORD not in repr(queue)  # the key's password is bound as dg.EnvVar
    assert settings.secret("SIS_STOMP_KEY_PASSWORD", env) == CLIENT_KEY_PASSWORD


def test_unusable_tls_files_stop_the_start_naming_the_variables(tmp_path: Path, pki: Pki) -> None:
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate\n")
    base = {"SIS_DATA_DIR": str(tmp_path), "SIS_PROFILE": "activemq"}
    with pytest.raises(ConfigurationError, match="SIS_STOMP_CA_FILE: .*no usable certificate"):
        load_settings({**base, "SIS_STOMP_CA_FILE": str(not_pem)})
    client = {
        **base,
        "SIS_STOMP_CERT_FILE": str(pki.client_cert),
        "SIS_STOMP_KEY_FILE": str(pki.client_encrypted_key),
    }
    for password in ({}, {"SIS_STOMP_KEY_PASSWORD": "n0t-the-key-passw0rd"}):
        with pytest.raises(
            ConfigurationError, match="SIS_STOMP_CERT_FILE, SIS_STOMP_KEY_FILE, SIS_STOMP_KEY_PASS"
        ) as refused:
            load_settings({**client, **password})
        assert "n0t-the-key-passw0rd" not in str(refused.value)
    with pytest.raises(ConfigurationError, match="SIS_STOMP_CERT_FILE, .*wrong key"):
        load_settings({**client, "SIS_STOMP_KEY_FILE": str(pki.ca_file.with_name("localhost.key"))})


def test_a_profile_file_sets_variables_under_the_environment(tmp_path: Path) -> None:
    profile = tmp_path / "prod.env"
    profile.write_text(
        "# production\n"
        "SIS_PROFILE=activemq\n"
        "\n"
        "SIS_STOMP_HOST = broker.example\n"
        "SIS_BATCH_MAX_MESSAGES=1000\n"
        "SIS_SELECTOR=sport = 'horse-racing'\n"
    )
    env = {
        "SIS_SETTINGS_FILE": str(profile),
        "SIS_DATA_DIR": str(tmp_path),
        "SIS_BATCH_MAX_MESSAGES": "2000",  # the environment wins
        "SIS_STOMP_PORT": "",  # empty: as if unset, so the file (or the default) applies
    }
    s = load_settings(env)
    assert s.profile == "activemq"
    assert isinstance(s.source, StompSourceSettings)
    assert (s.source.host, s.source.port) == ("broker.example", 61613)
    assert s.batch.max_messages == 2000
    assert s.processing.selector == "sport = 'horse-racing'"
    assert settings.sensor_interval_seconds(env) == 5


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("SIS_STOMP_PASSWORD=hunter2", "SIS_STOMP_PASSWORD is a secret; secrets are taken from"),
        ("SIS_IBMMQ_PASSWORD=hunter2", "SIS_IBMMQ_PASSWORD is a secret"),
        ("SIS_STOMP_KEY_PASSWORD=hunter2", "SIS_STOMP_KEY_PASSWORD is a secret"),
        ("SIS_API_TOKEN=abc", "SIS_API_TOKEN is a secret"),
        ("SIS_BATCH_MAX_MESAGES=10", "SIS_BATCH_MAX_MESAGES is not a setting of the platform"),
        ("SIS_SETTINGS_FILE=/other.env", "SIS_SETTINGS_FILE is not a setting"),
        ("just words", "line 2: expected SIS_NAME=value"),
    ],
)
def test_a_profile_file_refuses_secrets_and_unknown_lines(
    tmp_path: Path, line: str, message: str
) -> None:
    profile = tmp_path / "bad.env"
    profile.write_text(f"SIS_PROFILE=local\n{line}\n")
    with pytest.raises(ConfigurationError, match=re.escape(message)) as raised:
        load_settings({"SIS_SETTINGS_FILE": str(profile)})
    assert "hunter2" not in str(raised.value) and "bad.env" in str(raised.value)


def test_a_missing_profile_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="SIS_SETTINGS_FILE=.*missing.env"):
        load_settings({"SIS_SETTINGS_FILE": str(tmp_path / "missing.env")})


def test_settings_are_frozen(tmp_path: Path) -> None:
    s = load_settings({"SIS_DATA_DIR": str(tmp_path)})
    with pytest.raises(AttributeError):
        s.profile = "cluster"  # type: ignore[misc]
    assert replace(s, profile="cluster").profile == "cluster"
    assert isinstance(config.settings_of(s), Settings) and config.settings_of(s) is s


def test_fault_injection_is_read_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIS_CRASH_AT", raising=False)
    assert settings.fault_injection("SIS_CRASH_AT") is None
    monkeypatch.setenv("SIS_CRASH_AT", "consume.after_get")
    assert settings.fault_injection("SIS_CRASH_AT") == "consume.after_get"
    with pytest.raises(ValueError, match="not a fault-injection variable"):
        settings.fault_injection("SIS_PROFILE")


def test_the_cache_folder_and_a_spark_childs_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert settings.cache_home() == tmp_path / "cache"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert settings.cache_home() == Path.home() / ".cache"
    child = settings.child_environment({"SIS_SPARK_UI": "true"})
    assert child == {
        "SIS_SPARK_UI": "true",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    chosen = settings.child_environment({"PYSPARK_PYTHON": "/opt/python"})
    assert chosen["PYSPARK_PYTHON"] == "/opt/python"
    monkeypatch.setenv("SIS_SOMETHING", "1")
    assert settings.child_environment()["SIS_SOMETHING"] == "1"
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    settings.python_workers_use_this_interpreter()
    assert os.environ["PYSPARK_PYTHON"] == sys.executable


def test_only_the_settings_module_reads_the_environment() -> None:
    readers = [
        str(path.relative_to(REPO))
        for path in (REPO / "sis_platform").rglob("*.py")
        if re.search(r"os\.environ|getenv", path.read_text())
    ]
    assert readers == ["sis_platform/settings/environment.py"]


def test_the_configuration_reference_lists_every_variable() -> None:
    reference = (REPO / "docs" / "configuration.md").read_text()
    missing = [name for name in settings.VARIABLES if f"`{name}`" not in reference]
    assert missing == []


@pytest.mark.parametrize(
    "key",
    [
        "spark.hadoop.fs.s3a.secret.key",
        "spark.hadoop.fs.s3a.access.key",
        "spark.hadoop.fs.s3a.session.token",
        "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net",
        "spark.ssl.keyStorePassword",
        "spark.authenticate.secret",
        "spark.connect.authenticate.token",
        # Azure: an account key, a SAS per container (WASB) or fixed (ABFS), OAuth's secrets.
        "spark.hadoop.fs.azure.sas.lake.acct.blob.core.windows.net",
        "spark.hadoop.fs.azure.sas.fixed.token",
        "spark.hadoop.fs.azure.account.oauth2.client.secret",
        "spark.hadoop.fs.azure.account.oauth2.refresh.token",
        "spark.hadoop.fs.azure.account.oauth2.user.password",
        "spark.hadoop.fs.azure.encryption.encoded.client-provided-key",
        # Encryption keys of S3A (per bucket too, and the old name) and GCS.
        "spark.hadoop.fs.s3a.encryption.key",
        "spark.hadoop.fs.s3a.bucket.lake.encryption.key",
        "spark.hadoop.fs.s3a.server-side-encryption.key",
        "spark.hadoop.fs.gs.encryption.key",
        # GCS's service account and client credentials, a proxy's password.
        "spark.hadoop.fs.gs.auth.service.account.private.key",
        "spark.hadoop.fs.gs.auth.client.secret",
        "spark.hadoop.fs.s3a.proxy.password",
    ],
)
def test_a_secret_in_spark_conf_is_refused_without_echoing_it(tmp_path: Path, key: str) -> None:
    variables = {"SIS_DATA_DIR": str(tmp_path), "SIS_SPARK_CONF": f"{key}=hunter2"}
    with pytest.raises(ConfigurationError, match=re.escape(key)) as refused:
        load_settings(variables)
    assert "SIS_SPARK_SECRET_CONF" in str(refused.value)
    assert "hunter2" not in str(refused.value)


def test_spark_conf_keeps_settings_that_only_say_where_credentials_come_from(
    tmp_path: Path,
) -> None:
    conf = (
        "spark.hadoop.fs.s3a.aws.credentials.provider=com.amazonaws.auth.EnvironmentVariables"
        " spark.hadoop.hadoop.security.credential.provider.path=jceks://file/etc/sis.jceks"
        " spark.security.credentials.hive.enabled=false"
        " spark.hadoop.fs.azure.sas.token.provider.type=org.example.SasTokens"
        " spark.hadoop.fs.s3a.encryption.algorithm=SSE-KMS"
    )
    spark = load_settings({"SIS_DATA_DIR": str(tmp_path), "SIS_SPARK_CONF": conf}).spark
    assert len(spark.extra_conf) == 5


def test_secret_spark_settings_come_from_the_environment_under_their_hadoop_names() -> None:
    env = {"SIS_SPARK_SECRET_CONF": "spark.hadoop.fs.s3a.secret.key=s3cr=t fs.s3a.access.key=AK"}
    assert settings.spark_secret_conf(env) == {
        "fs.s3a.secret.key": "s3cr=t",
        "fs.s3a.access.key": "AK",
    }
    assert settings.spark_secret_conf({}) == {}
    with pytest.raises(ConfigurationError, match="fs.s3a.secret.key: expected") as bad:
        settings.spark_secret_conf({"SIS_SPARK_SECRET_CONF": "fs.s3a.secret.key="})
    with pytest.raises(ConfigurationError, match="without '='") as no_pair:
        settings.spark_secret_conf({"SIS_SPARK_SECRET_CONF": "hunter2"})
    assert "hunter2" not in str(bad.value) + str(no_pair.value)
    # A secret: never from a profile file.
    assert settings.is_secret("SIS_SPARK_SECRET_CONF")


def test_a_spark_connect_url_names_no_token_and_reaches_the_server_the_token_is_for(
    tmp_path: Path,
) -> None:
    def load(master: str, token: str | None = None) -> str:
        env = {"SIS_DATA_DIR": str(tmp_path), "SIS_SPARK_MASTER": master}
        if token is not None:
            env[settings.SPARK_CONNECT_TOKEN_VARIABLE] = token
        return load_settings(env).spark.master

    with pytest.raises(ConfigurationError, match="names a ;token=") as in_url:
        load("sc://localhost:15002/;token=hunter2")
    assert "hunter2" not in str(in_url.value)
    # Without TLS, PySpark sends a token to `localhost` only.
    assert load("sc://localhost:15002", "t0k") == "sc://localhost:15002"
    assert load("sc://spark.example:443/;use_ssl=true", "t0k").endswith("use_ssl=true")
    with pytest.raises(ConfigurationError, match="name the host localhost") as plain:
        load("sc://127.0.0.1:15002", "t0k")
    assert "t0k" not in str(plain.value)
    assert load("sc://127.0.0.1:15002") == "sc://127.0.0.1:15002"  # no token: no constraint


def test_sis_run_gives_its_spark_connect_server_and_runs_a_token_unless_one_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(settings.SPARK_CONNECT_TOKEN_VARIABLE, raising=False)
    settings.ensure_spark_connect_token()
    made = settings.spark_connect_token()
    assert made is not None and len(made) >= 32
    settings.ensure_spark_connect_token()
    assert settings.spark_connect_token() == made
    monkeypatch.setenv(settings.SPARK_CONNECT_TOKEN_VARIABLE, "chosen")
    settings.ensure_spark_connect_token()
    assert settings.spark_connect_token() == "chosen"


@pytest.mark.parametrize(
    ("master", "local"),
    [
        ("local", True),
        ("local[2]", True),
        ("local[*]", True),
        ("spark://127.0.0.1:7077", False),
        ("sc://localhost", False),
        ("k8s://https://10.0.0.1:6443", False),
        ("yarn", False),
    ],
)
def test_a_local_master_is_told_from_a_clusters_and_spark_connects(master, local):
    assert settings.is_local_master(master) is local


def test_sis_live_s_stall_bound_must_outlast_a_standby_s_wait(tmp_path: Path) -> None:
    base = {"SIS_DATA_DIR": str(tmp_path), "SIS_LEASE_SECONDS": "120"}
    assert load_settings(base).live.stall_seconds == 120.0  # unset: the lease, when longer
    assert load_settings({"SIS_DATA_DIR": str(tmp_path)}).live.stall_seconds == 60.0
    live = load_settings({**base, "SIS_LIVE_STALL_SECONDS": "61"}).live
    assert live.stall_seconds == 61.0
    assert live.heartbeat_file == tmp_path / "run" / "sis-live.heartbeat"
    with pytest.raises(ConfigurationError, match="SIS_LIVE_STALL_SECONDS=60 must be more than"):
        load_settings({**base, "SIS_LIVE_STALL_SECONDS": "60"})
    chosen = load_settings({"SIS_DATA_DIR": str(tmp_path), "SIS_LIVE_HEARTBEAT_FILE": "/run/sis/b"})
    assert chosen.live.heartbeat_file == Path("/run/sis/b")


def test_the_namespace_bounds_are_read_and_reach_the_processing_resource(tmp_path: Path) -> None:
    variables = {
        "SIS_DATA_DIR": str(tmp_path),
        "SIS_MAX_NAMESPACES": "3",
        "SIS_MAX_DOCUMENT_NAMESPACES": "7",
    }
    s = load_settings(variables)
    assert (s.limits.max_namespaces, s.limits.max_document_namespaces) == (3, 7)
    assert config.resources(variables)["processing"].limits() == s.limits


def test_the_metrics_endpoint_listens_on_loopback_unless_configured(tmp_path: Path) -> None:
    from sis_platform.settings.transport import is_loopback

    base = {"SIS_DATA_DIR": str(tmp_path)}
    host, port = load_settings(base).live.metrics_address or ("", 0)
    assert is_loopback(host) and port == 9464
    assert load_settings({**base, "SIS_METRICS_ADDRESS": "off"}).live.metrics_address is None
    pod = load_settings({**base, "SIS_METRICS_ADDRESS": "10.1.2.3:9100"}).live.metrics_address
    assert pod == ("10.1.2.3", 9100)
    v6 = load_settings({**base, "SIS_METRICS_ADDRESS": "[::1]:9464"}).live.metrics_address
    assert v6 == ("::1", 9464)


def test_traces_are_off_unless_an_otlp_endpoint_is_set_and_leave_the_host_over_https(
    tmp_path: Path,
) -> None:
    base = {"SIS_DATA_DIR": str(tmp_path)}

    def endpoint(**variables: str) -> str | None:
        return load_settings({**base, **variables}).live.traces_endpoint

    assert endpoint() is None
    # The general endpoint is a base URL (the SDK's rule); the traces one is used as it is.
    assert endpoint(OTEL_EXPORTER_OTLP_ENDPOINT="https://otel.example:4318/") == (
        "https://otel.example:4318/v1/traces"
    )
    assert (
        endpoint(
            OTEL_EXPORTER_OTLP_ENDPOINT="https://otel.example:4318",
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="https://traces.example/otlp",
        )
        == "https://traces.example/otlp"
    )
    assert endpoint(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4318") == (
        "http://127.0.0.1:4318/v1/traces"
    )
    assert endpoint(OTEL_EXPORTER_OTLP_ENDPOINT="http://localhost:4318") is not None
    for variables, message in [
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel.example:4318"},
            "plain http leaves the host only over https",
        ),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://10.0.0.5:4318/v1/traces"},
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT='http://10.0.0.5:4318/v1/traces': plain http",
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "otel.example:4318"}, "expected https://host"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://user:pw@otel.example"},
            "set OTEL_EXPORTER_OTLP_HEADERS in the environment instead",
        ),
    ]:
        with pytest.raises(ConfigurationError, match=re.escape(message)):
            load_settings({**base, **variables})


def test_lake_upkeep_is_read_and_a_retention_under_the_replay_window_is_refused(
    tmp_path: Path,
) -> None:
    base = {"SIS_DATA_DIR": str(tmp_path)}
    assert load_settings(base).upkeep == settings.LakeUpkeepSettings(30, 720, 168.0, 1000)
    chosen = load_settings(
        {
            **base,
            "SIS_LAKE_OPTIMIZE_EVERY": "1",
            "SIS_LAKE_VACUUM_EVERY": "0",
            "SIS_LAKE_RETAIN_HOURS": "24",
            "SIS_LAKE_MAX_FILES": "50",
        }
    ).upkeep
    assert chosen == settings.LakeUpkeepSettings(1, 0, 24.0, 50)
    with pytest.raises(ConfigurationError, match="SIS_LAKE_RETAIN_HOURS=12 is under the lake's"):
        load_settings({**base, "SIS_LAKE_RETAIN_HOURS": "12"})
    with pytest.raises(ConfigurationError, match="SIS_LAKE_OPTIMIZE_EVERY=-1 must be at least 0"):
        load_settings({**base, "SIS_LAKE_OPTIMIZE_EVERY": "-1"})
