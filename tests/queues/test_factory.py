"""open_source(): URLs to configured sources, and clear errors for bad ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from sis_platform.queues.embedded import EmbeddedQueue
from sis_platform.queues.factory import open_source, open_source_from_environment
from sis_platform.queues.ibmmq import IbmMqQueue
from sis_platform.queues.stomp import StompQueue
from sis_platform.settings import Credentials


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
    from_env = open_source_from_environment("stomp://localhost/queue/Q")
    assert isinstance(from_env, StompQueue)
    assert (from_env._endpoint.user, from_env._endpoint.password) == ("env-user", "env-pw")
    assert from_env._endpoint.port == 61613
    explicit = open_source_from_environment("stomp://u:url-pw@localhost/queue/Q", password="kw-pw")
    assert isinstance(explicit, StompQueue)
    assert (explicit._endpoint.user, explicit._endpoint.password) == ("u", "kw-pw")
    from_url = open_source_from_environment("stomp://u:url-pw@localhost/queue/Q")
    assert isinstance(from_url, StompQueue)
    assert (from_url._endpoint.user, from_url._endpoint.password) == ("u", "url-pw")
    # open_source itself reads nothing from the environment: the login is passed to it.
    plain = open_source("stomp://localhost/queue/Q")
    assert isinstance(plain, StompQueue)
    assert (plain._endpoint.user, plain._endpoint.password) == (None, None)
    given = open_source("stomp://localhost/queue/Q", fallback=Credentials("f-user", "f-pw"))
    assert isinstance(given, StompQueue)
    assert (given._endpoint.user, given._endpoint.password) == ("f-user", "f-pw")


IBMMQ_ENV = {
    "SIS_IBMMQ_QMGR": "QM1",
    "SIS_IBMMQ_CHANNEL": "DEV.APP.SVRCONN",
    "SIS_IBMMQ_CONN": "mq1(1414)",
    "SIS_IBMMQ_QUEUE": "DEV.QUEUE.1",
    "SIS_IBMMQ_USER": "app",
    "SIS_IBMMQ_PASSWORD": "mq-pw",
    "SIS_IBMMQ_RECONNECT": "qmgr",
}


def test_an_ibmmq_url_without_a_queue_manager_is_the_sis_ibmmq_settings() -> None:
    source = open_source_from_environment("ibmmq:", IBMMQ_ENV, reconnect_attempts=2)
    assert isinstance(source, IbmMqQueue)
    assert (source.queue_manager, source.channel, source.conn_name, source.queue) == (
        "QM1",
        "DEV.APP.SVRCONN",
        "mq1(1414)",
        "DEV.QUEUE.1",
    )
    assert (source.user, source.client_reconnect, source.reconnect_attempts) == ("app", "qmgr", 2)
    pinned = open_source_from_environment(
        "ibmmq:",
        {
            **IBMMQ_ENV,
            "SIS_IBMMQ_CIPHER_SPEC": "ANY_TLS12_OR_HIGHER",
            "SIS_IBMMQ_SSL_PEER": "CN=QM1,O=SIS",
        },
    )
    assert isinstance(pinned, IbmMqQueue) and pinned.ssl_peer_name == "CN=QM1,O=SIS"
    assert source._password is not None and source._password.reveal() == "mq-pw"
    no_user = open_source_from_environment("ibmmq://", {**IBMMQ_ENV, "SIS_IBMMQ_USER": ""})
    assert isinstance(no_user, IbmMqQueue)
    assert (no_user.user, no_user._password) == (None, None)  # a password only with a user
    with pytest.raises(ValueError, match="SIS_IBMMQ_CONN, SIS_IBMMQ_QUEUE to be set"):
        open_source_from_environment("ibmmq:", {"SIS_IBMMQ_QMGR": "QM1", "SIS_IBMMQ_CHANNEL": "C"})
    with pytest.raises(ValueError, match="stands for the SIS_IBMMQ_\\* settings"):
        open_source("ibmmq:")


def test_an_ibmmq_url_without_a_queue_manager_takes_every_ibmmq_setting() -> None:
    # The same source the settings open for sis-live (open_configured): its get bound and
    # backout included, not only the connection's fields.
    source = open_source_from_environment(
        "ibmmq:", {**IBMMQ_ENV, "SIS_IBMMQ_MAX_GET_BYTES": "50000000"}
    )
    assert isinstance(source, IbmMqQueue)
    assert source.max_get_bytes == 50_000_000
    assert source.backout_threshold == 10


def test_an_ibmmq_user_takes_the_environments_password() -> None:
    url = "ibmmq://app@mq1/QM1/Q?channel=C"
    source = open_source_from_environment(url, {"SIS_IBMMQ_PASSWORD": "mq-pw"})
    assert isinstance(source, IbmMqQueue)
    assert source._password is not None and source._password.reveal() == "mq-pw"
    anonymous = open_source_from_environment("ibmmq://mq1/QM1/Q?channel=C", IBMMQ_ENV)
    assert isinstance(anonymous, IbmMqQueue) and anonymous._password is None


def test_extra_keywords_reach_the_constructor() -> None:
    source = open_source("stomp://localhost:1/queue/Q", connect_attempts=1, prefetch=3)
    assert isinstance(source, StompQueue)
    assert (source.connect_attempts, source.prefetch) == (1, 3)


def test_ibmmq_url_maps_to_the_ibm_mq_source() -> None:
    source = open_source(
        "ibmmq://app@mq1:1414,mq2/QM1/DEV.QUEUE.1?channel=DEV.APP.SVRCONN"
        "&cipher_spec=ANY_TLS12_OR_HIGHER&key_repository=/var/mqm/key"
        "&ssl_peer_name=CN%3DQM1%2CO%3DSIS",
        password="pw",
    )
    assert isinstance(source, IbmMqQueue)
    assert source.ssl_peer_name == "CN=QM1,O=SIS"
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
