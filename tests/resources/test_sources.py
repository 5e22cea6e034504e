"""Queue source resources: one cached source per process and configuration, and every setting
from the environment reaching the source."""

from __future__ import annotations

import threading

import dagster as dg
import pytest

from sis_platform import config
from sis_platform.queues.base import QueueSource
from sis_platform.queues.embedded import EmbeddedQueue
from sis_platform.queues.ibmmq import IbmMqQueue
from sis_platform.queues.stomp import StompQueue
from sis_platform.resources.sources import EmbeddedQueueResource, StompQueueResource
from tests.harness import Harness


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
    assert a.open() is not StompQueueResource(port=61001, destination="/queue/A",
                                              prefetch=1).open()
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
        "SIS_BACKOUT_THRESHOLD": "4",
        "SIS_BACKOUT_QUEUE": "FEED.BACKOUT",
    }
    source = config.resources(env)["queue"].build()
    assert isinstance(source, StompQueue)
    assert source.destination == "/queue/FEED"
    assert source.selector == "sport = 'horse-racing'"
    assert source.prefetch == 3
    assert (source.backout_threshold, source.backout_queue) == (4, "/queue/FEED.BACKOUT")
    assert source.description == (
        "stomp://127.0.0.1:61999/queue/FEED (selector \"sport = 'horse-racing'\", "
        "backout threshold 4 -> /queue/FEED.BACKOUT)"
    )
    defaults = config.resources({"SIS_DATA_DIR": str(tmp_path), "SIS_PROFILE": "activemq"})
    plain = defaults["queue"].build()
    assert isinstance(plain, StompQueue)
    assert (plain.selector, plain.prefetch, plain.backout_threshold) == (None, 10, 0)


IBMMQ = {
    "SIS_PROFILE": "ibmmq",
    "SIS_IBMMQ_QMGR": "QM1",
    "SIS_IBMMQ_CHANNEL": "DEV.APP.SVRCONN",
    "SIS_IBMMQ_CONN": "mq1(1414),mq2(1414)",
    "SIS_IBMMQ_QUEUE": "SPORTSDATA.IN",
}


def test_ibmmq_certificate_label_and_reconnect_reach_the_source(tmp_path):
    env = {
        "SIS_DATA_DIR": str(tmp_path),
        **IBMMQ,
        "SIS_IBMMQ_CIPHER_SPEC": "ANY_TLS12_OR_HIGHER",
        "SIS_IBMMQ_KEY_REPOSITORY": "/var/mqm/ssl/client",
        "SIS_IBMMQ_CERT_LABEL": "ibmwebspheremqapp",
        "SIS_IBMMQ_RECONNECT": "qmgr",
    }
    source = config.resources(env)["queue"].build()
    assert isinstance(source, IbmMqQueue)
    assert source.certificate_label == "ibmwebspheremqapp"
    assert source.client_reconnect == "qmgr"
    plain = config.resources({"SIS_DATA_DIR": str(tmp_path), **IBMMQ})["queue"].build()
    assert isinstance(plain, IbmMqQueue)
    assert (plain.certificate_label, plain.client_reconnect) == (None, "disabled")
    with pytest.raises(config.ConfigurationError, match="SIS_IBMMQ_RECONNECT='always'"):
        config.resources({"SIS_DATA_DIR": str(tmp_path), **IBMMQ, "SIS_IBMMQ_RECONNECT": "always"})
