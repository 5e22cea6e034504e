"""open_source(): URLs to configured sources, and clear errors for bad ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from sis_platform.queues.embedded import EmbeddedQueue
from sis_platform.queues.factory import open_source
from sis_platform.queues.ibmmq import IbmMqQueue
from sis_platform.queues.stomp import StompQueue


def test_embedded_url_with_options(tmp_path: Path) -> None:
    source = open_source(
        f"embedded://{tmp_path}/q?queue=FEED&backout_threshold=3&backout_queue=FEED.BOQ"
    )
    assert isinstance(source, EmbeddedQueue)
    assert source.path == tmp_path / "q"
    assert (source.queue, source.backout_threshold, source.backout_queue) == (
        "FEED",
        3,
        "FEED.BOQ",
    )


def test_embedded_url_defaults(tmp_path: Path) -> None:
    source = open_source(f"embedded://{tmp_path}")
    assert isinstance(source, EmbeddedQueue)
    assert (source.queue, source.backout_threshold) == ("SPORTSDATA", 10)
    off = open_source(f"embedded://{tmp_path}?backout_threshold=0")
    assert isinstance(off, EmbeddedQueue) and off.backout_threshold == 0


def test_stomp_url_with_credentials_and_options() -> None:
    source = open_source(
        "stomp://feed:p%40ss@broker.example:61614/queue/SPORTSDATA"
        "?prefetch=20&selector=kind%20%3D%20'a'&backout_threshold=5&backout_queue=SPORTSDATA.BOQ"
        "&heartbeats=5000,5000&redelivery_counts=/var/lib/sis/stomp/redeliveries.db"
    )
    assert isinstance(source, StompQueue)
    assert source._redeliveries.path == Path("/var/lib/sis/stomp/redeliveries.db")
    assert source.destination == "/queue/SPORTSDATA"
    assert (source.prefetch, source.selector, source.backout_threshold) == (20, "kind = 'a'", 5)
    assert source.backout_queue == "/queue/SPORTSDATA.BOQ"
    assert source._endpoint.password == "p@ss"
    assert source._endpoint.heartbeats == (5000, 5000)
    assert "p@ss" not in source.description and "feed@broker.example:61614" in source.description


def test_stomp_credentials_come_from_keywords_then_url_then_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SIS_STOMP_USER", "env-user")
    monkeypatch.setenv("SIS_STOMP_PASSWORD", "env-pw")
    from_env = open_source("stomp://localhost/queue/Q")
    assert isinstance(from_env, StompQueue)
    assert (from_env._endpoint.user, from_env._endpoint.password) == ("env-user", "env-pw")
    assert from_env._endpoint.port == 61613
    explicit = open_source("stomp://u:url-pw@localhost/queue/Q", password="kw-pw")
    assert isinstance(explicit, StompQueue)
    assert (explicit._endpoint.user, explicit._endpoint.password) == ("u", "kw-pw")


def test_extra_keywords_reach_the_constructor() -> None:
    source = open_source("stomp://localhost:1/queue/Q", connect_attempts=1, prefetch=3)
    assert isinstance(source, StompQueue)
    assert (source.connect_attempts, source.prefetch) == (1, 3)


def test_ibmmq_url_maps_to_the_ibm_mq_source() -> None:
    source = open_source(
        "ibmmq://app@mq1:1414,mq2/QM1/DEV.QUEUE.1?channel=DEV.APP.SVRCONN"
        "&cipher_spec=ANY_TLS12_OR_HIGHER&key_repository=/var/mqm/key",
        password="pw",
    )
    assert isinstance(source, IbmMqQueue)
    assert (source.queue_manager, source.queue, source.channel) == (
        "QM1",
        "DEV.QUEUE.1",
        "DEV.APP.SVRCONN",
    )
    assert source.conn_name == "mq1(1414),mq2(1414)"
    assert (source.user, source.cipher_spec, source.key_repository) == (
        "app",
        "ANY_TLS12_OR_HIGHER",
        "/var/mqm/key",
    )


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "scheme must be one of"),
        ("amqp://host/queue/x", "scheme must be one of"),
        ("embedded://host/dir", "names a host"),
        ("embedded:relative/dir", "absolute folder"),
        ("embedded:///dir?colour=red", "unknown parameter 'colour'"),
        ("embedded:///dir?backout_threshold=-1", "bad value for 'backout_threshold'"),
        (
            "stomp://h/queue/Q?redelivery_counts=relative.db",
            "bad value for 'redelivery_counts'",
        ),
        ("embedded:///dir?backout_threshold=two", "bad value for 'backout_threshold'"),
        ("embedded:///dir?queue=A&queue=B", "given twice"),
        ("stomp:///queue/x", "needs a host"),
        ("stomp://host/topic/x", "must name a queue"),
        ("stomp://host/queue/", "must name a queue"),
        ("stomp://host:port/queue/x", "bad STOMP URL"),
        ("stomp://host/queue/x?prefetch=0", "bad value for 'prefetch'"),
        ("stomp://host/queue/x?heartbeats=1", "bad value for 'heartbeats'"),
        ("ibmmq://mq1/QM1/Q", "needs ?channel"),
        ("ibmmq://mq1/QM1?channel=C", "ibmmq://host:port/QMGR/QUEUE"),
        ("ibmmq://mq1:x/QM1/Q?channel=C", "bad port"),
    ],
)
def test_bad_urls_are_rejected_clearly(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("?", r"\?")):
        open_source(url)


def test_errors_never_show_a_password() -> None:
    with pytest.raises(ValueError) as raised:
        open_source("stomp://user:hunter2@host/queue/x?bogus=1")
    assert "hunter2" not in str(raised.value) and "***" in str(raised.value)
