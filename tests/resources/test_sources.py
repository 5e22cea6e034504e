"""Queue source resources: one cached source per process and configuration, and every setting
from the environment reaching the source."""

from __future__ import annotations

import threading

import dagster as dg
import pytest

from sis_platform.queues.base import (
    DEFAULT_MAX_GET_BYTES,
    QueueSource,
)
from sis_platform.queues.embedded import EmbeddedQueue
from sis_platform.queues.factory import open_configured_from_environment
from sis_platform.queues.ibmmq import IbmMqQueue
from sis_platform.queues.stomp import StompQueue
from sis_platform.resources import config
from sis_platform.resources.sources import EmbeddedQueueResource, StompQueueResource
from sis_platform.settings import (
    DEFAULT_BACKOUT_THRESHOLD,
    DEFAULT_STOMP_HEARTBEATS,
    Backout,
    ConfigurationError,
    EmbeddedSourceSettings,
    IbmMqSourceSettings,
    StompSourceSettings,
    load_settings,
)
from tests.harness import Harness

IBMMQ = {
    "SIS_PROFILE": "ibmmq",
    "SIS_IBMMQ_QMGR": "QM1",
    "SIS_IBMMQ_CHANNEL": "DEV.APP.SVRCONN",
    "SIS_IBMMQ_CONN": "mq1(1414),mq2(1414)",
    "SIS_IBMMQ_QUEUE": "SPORTSDATA.IN",
}


def test_two_sensor_ticks_use_the_same_source_object(tmp_path, monkeypatch):
    h = Harness(tmp_path)
    with h.resources["queue"].open().producer() as producer:
        producer.put(b"<m/>")
    connected: list[QueueSource] = []
    connect = EmbeddedQueue.connect

    def spy(self: EmbeddedQueue):  # type: ignore[no-untyped-def]
        connected.append(self)
        return connect(self)

    monkeypatch.setattr(EmbeddedQueue, "connect", spy)
    assert isinstance(h.tick(), dg.SensorResult)
    assert isinstance(h.tick(), dg.SkipReason)
    # Dagster hands each tick freshly initialised resource objects; the source outlives them.
    assert len(connected) == 2
    assert connected[0] is connected[1] is h.resources["queue"].open()


def test_open_caches_by_configuration():
    a = StompQueueResource(port=61001, destination="/queue/A")
    assert a.open() is StompQueueResource(port=61001, destination="/queue/A").open()
    assert a.open() is not StompQueueResource(port=61001, destination="/queue/B").open()
    assert a.open() is not StompQueueResource(port=61001, destination="/queue/A", prefetch=1).open()
    assert isinstance(a.open(), StompQueue)


def test_concurrent_opens_build_one_source(tmp_path, monkeypatch):
    builds: list[int] = []
    another_builder = threading.Event()
    build = EmbeddedQueueResource.build

    def slow_build(self: EmbeddedQueueResource) -> QueueSource:
        builds.append(1)
        if len(builds) > 1:
            another_builder.set()
        # Holds the door open a moment: an unlocked cache would let a second thread build too.
        another_builder.wait(0.2)
        return build(self)

    monkeypatch.setattr(EmbeddedQueueResource, "build", slow_build)
    start = threading.Barrier(8)
    opened: list[QueueSource] = []

    def open_source() -> None:
        resource = EmbeddedQueueResource(path=str(tmp_path / "q"))
        start.wait()
        opened.append(resource.open())

    threads = [threading.Thread(target=open_source) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1
    assert len({id(s) for s in opened}) == 1


def test_stomp_settings_reach_the_source(tmp_path):
    env = {
        "SIS_DATA_DIR": str(tmp_path),
        "SIS_PROFILE": "activemq",
        "SIS_STOMP_PORT": "61999",
        "SIS_STOMP_DESTINATION": "/queue/FEED",
        "SIS_STOMP_SELECTOR": "sport = 'horse-racing'",
        "SIS_STOMP_PREFETCH": "3",
        "SIS_BACKOUT_THRESHOLD": "12",
        "SIS_BACKOUT_QUEUE": "FEED.BACKOUT",
    }
    source = config.resources(env)["queue"].build()
    assert isinstance(source, StompQueue)
    assert source.destination == "/queue/FEED"
    assert source.selector == "sport = 'horse-racing'"
    assert source.prefetch == 3
    assert (source.backout_threshold, source.backout_queue) == (12, "/queue/FEED.BACKOUT")
    assert source.description == (
        "stomp://127.0.0.1:61999/queue/FEED (selector \"sport = 'horse-racing'\", "
        "backout threshold 12 -> /queue/FEED.BACKOUT)"
    )
    defaults = config.resources({"SIS_DATA_DIR": str(tmp_path), "SIS_PROFILE": "activemq"})
    plain = defaults["queue"].build()
    assert isinstance(plain, StompQueue)
    assert (plain.selector, plain.prefetch) == (None, 100)
    assert (plain.backout_threshold, plain.backout_queue) == (10, "/queue/ActiveMQ.DLQ")
    # Redeliveries are counted in a file under the data folder, so they outlive the process.
    assert plain._redeliveries.path == tmp_path / "stomp" / "redeliveries.db"


def test_stomp_heartbeats_and_virtual_host_are_settings_that_reach_the_source(tmp_path):
    env = {
        "SIS_DATA_DIR": str(tmp_path),
        "SIS_PROFILE": "activemq",
        "SIS_STOMP_HEARTBEATS": "4000, 0",
        "SIS_STOMP_VHOST": "sportsdata",
    }
    for source in (
        config.resources(env)["queue"].build(),
        open_configured_from_environment(load_settings(env).source),
    ):
        assert isinstance(source, StompQueue)
        assert (source._endpoint.heartbeats, source._endpoint.vhost) == ((4000, 0), "sportsdata")
    plain = load_settings({"SIS_DATA_DIR": str(tmp_path), "SIS_PROFILE": "activemq"}).source
    assert isinstance(plain, StompSourceSettings)
    assert (plain.heartbeats, plain.vhost) == (DEFAULT_STOMP_HEARTBEATS, None)


@pytest.mark.parametrize("value", ["4000", "a,b", "1,2,3", "-1,0"])
def test_bad_stomp_heartbeats_fail_at_start_naming_the_variable(tmp_path, value):
    env = {"SIS_DATA_DIR": str(tmp_path), "SIS_PROFILE": "activemq", "SIS_STOMP_HEARTBEATS": value}
    with pytest.raises(ConfigurationError, match="SIS_STOMP_HEARTBEATS"):
        load_settings(env)


@pytest.mark.parametrize(
    "record",
    [
        EmbeddedSourceSettings(path="/q", queue="FEED", backout=Backout(7, "FEED.BO")),
        StompSourceSettings(
            redelivery_counts="/r.db",
            host="broker.example",
            port=61614,
            destination="/queue/FEED",
            user="feed",
            has_password=True,
            selector="sport = 'x'",
            prefetch=7,
            heartbeats=(1, 2),
            vhost="v",
            backout=Backout(3, "/queue/BO"),
            tls=True,
            ca_file="/ca.pem",
            cert_file="/c.pem",
            key_file="/k.pem",
            has_key_password=True,
            allow_plaintext_credentials=True,
        ),
        IbmMqSourceSettings(
            queue_manager="QM1",
            channel="CH",
            conn_name="mq(1414)",
            queue="FEED",
            max_get_bytes=1234,
            user="feed",
            has_password=True,
            cipher_spec="ANY_TLS12_OR_HIGHER",
            key_repository="/keys/client",
            certificate_label="lbl",
            ssl_peer_name="CN=QM1",
            client_reconnect="qmgr",
            backout=Backout(4, "BO"),
        ),
    ],
    ids=["embedded", "stomp", "ibmmq"],
)
def test_a_source_resource_carries_every_option_of_its_settings_record(record, monkeypatch):
    # The resource is what the Dagster UI shows and the queue sensor opens; sis-live opens the
    # record itself. Both open through queues.factory.open_configured, so an option the
    # resource dropped would differ between the two intakes: this round trip finds it.
    monkeypatch.setenv("SIS_STOMP_PASSWORD", "p")
    monkeypatch.setenv("SIS_STOMP_KEY_PASSWORD", "k")
    monkeypatch.setenv("SIS_IBMMQ_PASSWORD", "p")
    resource = config.queue_resource(record)
    assert resource.settings() == record


def test_every_source_has_the_default_backout_threshold_and_zero_turns_it_off(tmp_path):
    for env in ({}, {"SIS_PROFILE": "activemq"}, IBMMQ):
        base = {"SIS_DATA_DIR": str(tmp_path), **env}
        assert config.resources(base)["queue"].build().backout_threshold == 10
        off = config.resources({**base, "SIS_BACKOUT_THRESHOLD": "0"})["queue"].build()
        assert off.backout_threshold == 0
    assert DEFAULT_BACKOUT_THRESHOLD == 10
    embedded = config.resources({"SIS_DATA_DIR": str(tmp_path)})["queue"].build()
    assert isinstance(embedded, EmbeddedQueue)
    assert embedded.backout_queue == "SPORTSDATA.BACKOUT"


def test_the_default_backout_threshold_follows_a_raised_redelivery_limit(tmp_path):
    # Raising SIS_REDELIVERY_LIMIT alone must not make the configuration invalid.
    base = {"SIS_DATA_DIR": str(tmp_path), "SIS_REDELIVERY_LIMIT": "10"}
    assert config.resources(base)["queue"].build().backout_threshold == 20
    with pytest.raises(config.ConfigurationError, match="SIS_BACKOUT_THRESHOLD=10"):
        config.resources({**base, "SIS_BACKOUT_THRESHOLD": "10"})


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"SIS_BACKOUT_THRESHOLD": "-1"}, "SIS_BACKOUT_THRESHOLD=-1 must be above"),
        ({"SIS_BACKOUT_THRESHOLD": "5"}, "SIS_BACKOUT_THRESHOLD=5 must be above SIS_REDELIVERY"),
        (
            {"SIS_BACKOUT_THRESHOLD": "10", "SIS_REDELIVERY_LIMIT": "10"},
            "must be above SIS_REDELIVERY_LIMIT=10",
        ),
        ({"SIS_BACKOUT_THRESHOLD": "ten"}, "SIS_BACKOUT_THRESHOLD='ten' is not a whole number"),
        ({"SIS_BACKOUT_QUEUE": "SPORTSDATA"}, "SIS_BACKOUT_QUEUE='SPORTSDATA' is the queue"),
        (
            {"SIS_PROFILE": "activemq", "SIS_BACKOUT_QUEUE": "SPORTSDATA"},
            "SIS_BACKOUT_QUEUE='SPORTSDATA' is the queue itself",
        ),
        ({**IBMMQ, "SIS_BACKOUT_QUEUE": "SPORTSDATA.IN"}, "is the queue itself"),
        ({"SIS_PROFILE": "activemq", "SIS_STOMP_PREFETCH": "0"}, "SIS_STOMP_PREFETCH=0 must be"),
        ({**IBMMQ, "SIS_IBMMQ_SSL_PEER": "CN=QM1"}, "SIS_IBMMQ_SSL_PEER: .* needs a cipher spec"),
        (
            {**IBMMQ, "SIS_IBMMQ_SSL_PEER": "QM1", "SIS_IBMMQ_CIPHER_SPEC": "ANY_TLS12_OR_HIGHER"},
            "SIS_IBMMQ_SSL_PEER: the SSL peer name 'QM1' is not a distinguished name",
        ),
    ],
)
def test_bad_source_settings_fail_at_start_naming_the_variable(tmp_path, settings, message):
    with pytest.raises(config.ConfigurationError, match=message):
        config.resources({"SIS_DATA_DIR": str(tmp_path), **settings})


def test_ibmmq_certificate_label_peer_name_and_reconnect_reach_the_source(tmp_path):
    env = {
        "SIS_DATA_DIR": str(tmp_path),
        **IBMMQ,
        "SIS_IBMMQ_CIPHER_SPEC": "ANY_TLS12_OR_HIGHER",
        "SIS_IBMMQ_KEY_REPOSITORY": "/var/mqm/ssl/client",
        "SIS_IBMMQ_CERT_LABEL": "ibmwebspheremqapp",
        "SIS_IBMMQ_SSL_PEER": "CN=QM1,O=SIS",
        "SIS_IBMMQ_RECONNECT": "qmgr",
    }
    source = config.resources(env)["queue"].build()
    assert isinstance(source, IbmMqQueue)
    assert source.certificate_label == "ibmwebspheremqapp"
    assert source.ssl_peer_name == "CN=QM1,O=SIS"
    assert source.client_reconnect == "qmgr"
    plain = config.resources({"SIS_DATA_DIR": str(tmp_path), **IBMMQ})["queue"].build()
    assert isinstance(plain, IbmMqQueue)
    assert (plain.certificate_label, plain.client_reconnect) == (None, "disabled")
    assert plain.ssl_peer_name is None
    assert (plain.backout_threshold, plain.backout_queue) == (10, None)
    assert plain.max_get_bytes == DEFAULT_MAX_GET_BYTES == 8 * 1024 * 1024
    with pytest.raises(config.ConfigurationError, match="SIS_IBMMQ_RECONNECT='always'"):
        config.resources({"SIS_DATA_DIR": str(tmp_path), **IBMMQ, "SIS_IBMMQ_RECONNECT": "always"})


def test_ibmmq_backout_and_get_limit_settings_reach_the_source(tmp_path):
    env = {
        "SIS_DATA_DIR": str(tmp_path),
        **IBMMQ,
        "SIS_BACKOUT_THRESHOLD": "7",
        "SIS_BACKOUT_QUEUE": "SPORTSDATA.BACKOUT",
        "SIS_MAX_MESSAGE_BYTES": "1000000",
    }
    source = config.resources(env)["queue"].build()
    assert isinstance(source, IbmMqQueue)
    assert (source.backout_threshold, source.backout_queue) == (7, "SPORTSDATA.BACKOUT")
    assert source.max_get_bytes == 2_000_000  # twice SIS_MAX_MESSAGE_BYTES unless set
    explicit = config.resources({**env, "SIS_IBMMQ_MAX_GET_BYTES": "3000000"})
    assert explicit["queue"].build().max_get_bytes == 3_000_000
    with pytest.raises(
        config.ConfigurationError,
        match="SIS_IBMMQ_MAX_GET_BYTES=999999 must be at least SIS_MAX_MESSAGE_BYTES=1000000",
    ):
        config.resources({**env, "SIS_IBMMQ_MAX_GET_BYTES": "999999"})
