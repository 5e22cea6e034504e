"""STOMP over TLS (DESIGN.md invariant 9): a real ActiveMQ with a certificate from a CA made
for the test session (`activemq_tls`), and the refusals that need no broker: a password sent
in clear to a broker off this host, unusable TLS files, secrets in a repr (the sources' and
their resources')."""

from __future__ import annotations

import ssl
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sis_platform.queues.base import SourceUnavailable
from sis_platform.queues.factory import open_configured_from_environment, open_source
from sis_platform.queues.ibmmq import IbmMqQueue
from sis_platform.queues.stomp import StompQueue
from sis_platform.resources.sources import IbmMqQueueResource, StompQueueResource
from sis_platform.settings import Credentials, StompSourceSettings, load_settings
from sis_platform.settings.transport import TlsFiles, is_loopback
from tests.queues.broker import Broker
from tests.queues.pki import CLIENT_KEY_PASSWORD, Pki, make_pki

SECRET = "s3cret-broker-passw0rd"
# The broker sends its chain with the CA in it, which a client that trusts another CA (or only
# the system's) sees as a self-signed certificate it does not trust.
UNTRUSTED = (
    r"certificate is refused \("
    r"(self-signed certificate in certificate chain|unable to get local issuer certificate)\)"
)
WAIT = 10.0


def _pki(broker: Broker) -> Pki:
    assert broker.pki is not None and broker.ssl_port is not None
    return broker.pki


def tls_source(broker: Broker, host: str = "localhost", **kwargs: Any) -> StompQueue:
    """A source on the TLS port, with the session CA and client certificate unless replaced."""
    pki = _pki(broker)
    options: dict[str, Any] = {
        "ca_file": pki.ca_file,
        "cert_file": pki.client_cert,
        "key_file": pki.client_key,
        "connect_attempts": 1,
        "connect_timeout": 5.0,
        "receipt_timeout": WAIT,
        **kwargs,
    }
    assert broker.ssl_port is not None
    return StompQueue(host, broker.ssl_port, f"/queue/T{uuid.uuid4().hex}", **options)


# -- against the TLS broker ---------------------------------------------------------------


@pytest.mark.broker
def test_a_message_round_trips_over_tls_with_the_broker_verified(activemq_tls: Broker) -> None:
    source = tls_source(activemq_tls, user="feed", password=SECRET)
    assert source.description.startswith("stomp+ssl://feed@localhost:")
    with source.producer() as producer:
        message_id = producer.put(b"<SportsData/>")
    with source.connect() as session:
        link = session._link
        assert link is not None
        sock = link.conn.transport.socket
        assert isinstance(sock, ssl.SSLSocket)
        assert sock.getpeercert()["subjectAltName"] == (("DNS", "localhost"),)
        got = session.get(wait_seconds=WAIT)
        assert got is not None and (got.message_id, got.body) == (message_id, b"<SportsData/>")
        session.backout()  # the session's backout (unsubscribe, subscribe) works over TLS too
        again = session.get(wait_seconds=WAIT)
        assert again is not None and again.message_id == message_id and again.redelivered
        session.commit()
    assert source.browse() == []


@pytest.mark.broker
def test_a_broker_certificate_from_another_ca_is_refused(activemq_tls: Broker) -> None:
    source = tls_source(activemq_tls, ca_file=_pki(activemq_tls).other_ca_file)
    with pytest.raises(SourceUnavailable, match=UNTRUSTED):
        source.producer()


@pytest.mark.broker
def test_the_system_trust_store_does_not_vouch_for_a_private_ca(activemq_tls: Broker) -> None:
    """No CA file: the system's trust store, and verification still on."""
    source = tls_source(activemq_tls, ca_file=None, tls=True)
    assert source.tls is not None and source.tls.ca_file is None
    with pytest.raises(SourceUnavailable, match=UNTRUSTED):
        source.producer()


@pytest.mark.broker
def test_a_host_name_the_broker_certificate_does_not_name_is_refused(activemq_tls: Broker) -> None:
    """The certificate names `localhost` only; 127.0.0.1 is the same broker, another name
    (Python checks an IP address against the certificate's IP entries, a name against its DNS
    entries: the same check)."""
    source = tls_source(activemq_tls, host="127.0.0.1")
    with pytest.raises(SourceUnavailable, match="certificate is refused \\(IP address mismatch"):
        source.producer()


@pytest.mark.broker
def test_the_client_certificate_is_presented_and_required(activemq_tls: Broker) -> None:
    """The broker requires a client certificate: without one it drops the connection, so the
    round trip above proves the configured one is sent."""
    source = tls_source(activemq_tls, cert_file=None, key_file=None)
    with pytest.raises(SourceUnavailable, match="broker refused the client certificate"):
        source.producer()


@pytest.mark.broker
def test_an_encrypted_client_key_is_opened_with_its_password(activemq_tls: Broker) -> None:
    pki = _pki(activemq_tls)
    source = tls_source(
        activemq_tls, key_file=pki.client_encrypted_key, key_password=CLIENT_KEY_PASSWORD
    )
    with source.producer() as producer:
        producer.put(b"x")
    assert [m.body for m in source.browse()] == [b"x"]


@pytest.mark.broker
def test_the_settings_configure_a_verified_tls_source(
    activemq_tls: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From SIS_STOMP_* to a connection, as sis-live builds it; the key's password is taken
    from the environment when the source is built, never held in the settings."""
    pki = _pki(activemq_tls)
    env = {
        "SIS_PROFILE": "activemq",
        "SIS_DATA_DIR": str(tmp_path),
        "SIS_STOMP_HOST": "localhost",
        "SIS_STOMP_PORT": str(activemq_tls.ssl_port),
        "SIS_STOMP_DESTINATION": f"/queue/T{uuid.uuid4().hex}",
        "SIS_STOMP_CA_FILE": str(pki.ca_file),
        "SIS_STOMP_CERT_FILE": str(pki.client_cert),
        "SIS_STOMP_KEY_FILE": str(pki.client_encrypted_key),
        "SIS_STOMP_KEY_PASSWORD": CLIENT_KEY_PASSWORD,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    stomp = load_settings().source
    assert isinstance(stomp, StompSourceSettings)
    assert stomp.tls and stomp.has_key_password
    assert CLIENT_KEY_PASSWORD not in repr(stomp)
    source = open_configured_from_environment(stomp)
    assert isinstance(source, StompQueue) and source.tls is not None
    with source.producer() as producer:
        producer.put(b"configured")
    with source.connect() as session:
        got = session.get(wait_seconds=WAIT)
        assert got is not None and got.body == b"configured"
        session.commit()


# -- no broker needed ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST.", True),
        ("broker.localhost", True),
        ("10.0.0.5", False),
        ("broker.example", False),
        ("localhost.example", False),
        ("0.0.0.0", False),
    ],
)
def test_only_loopback_addresses_and_localhost_count_as_this_host(
    host: str, loopback: bool
) -> None:
    assert is_loopback(host) is loopback


def test_tls_is_on_unless_the_broker_is_on_this_host() -> None:
    assert StompQueue("broker.example", 61614, "Q").tls == TlsFiles()
    assert StompQueue("127.0.0.1", 61613, "Q").tls is None
    assert StompQueue("localhost", 61613, "Q", tls=True).tls == TlsFiles()


def test_a_password_is_not_sent_in_clear_to_a_broker_off_this_host() -> None:
    with pytest.raises(ValueError, match="refusing to send the password in clear") as caught:
        StompQueue("broker.example", 61613, "Q", user="feed", password=SECRET, tls=False)
    assert SECRET not in str(caught.value)
    # No password, or a broker on this host: nothing secret crosses the network.
    assert StompQueue("broker.example", 61613, "Q", user="feed", tls=False).tls is None
    assert StompQueue("127.0.0.1", 61613, "Q", user="feed", password=SECRET).tls is None


def test_plaintext_credentials_are_sent_off_this_host_only_when_allowed() -> None:
    source = StompQueue(
        "broker.example",
        61613,
        "Q",
        user="feed",
        password=SECRET,
        tls=False,
        allow_plaintext_credentials=True,
    )
    assert source.tls is None and source._endpoint.password == SECRET
    assert source.backout_source().tls is None  # the backout queue's source inherits it


def test_a_queue_url_follows_the_same_rules() -> None:
    url = f"stomp://feed:{SECRET}@broker.example:61613/queue/Q"
    assert isinstance(source := open_source(url), StompQueue) and source.tls == TlsFiles()
    with pytest.raises(ValueError, match="refusing to send the password in clear") as caught:
        open_source(f"{url}?tls=false")
    assert SECRET not in str(caught.value)
    allowed = open_source(f"{url}?tls=false&allow_plaintext_credentials=true")
    assert isinstance(allowed, StompQueue) and allowed.tls is None
    with pytest.raises(ValueError, match="'tls'.*expected true or false"):
        open_source(f"{url}?tls=yes")


def test_unusable_tls_files_are_refused_when_the_source_is_built(tmp_path: Path) -> None:
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate\n")
    with pytest.raises(ValueError, match="CA file .* holds no usable certificate"):
        StompQueue("localhost", 61614, "Q", ca_file=not_pem)
    with pytest.raises(ValueError, match="TLS CA file .*missing.pem' is not a file"):
        StompQueue("localhost", 61614, "Q", ca_file=tmp_path / "missing.pem")
    with pytest.raises(ValueError, match="client certificate needs its key"):
        StompQueue("localhost", 61614, "Q", cert_file=not_pem)
    with pytest.raises(ValueError, match="TLS files given .* with TLS off"):
        StompQueue("localhost", 61614, "Q", ca_file=not_pem, tls=False)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_an_encrypted_client_key_without_its_password_is_refused_when_built(pki: Pki) -> None:
    for password in (None, "wrong"):
        with pytest.raises(ValueError, match="cannot be loaded .*key password missing or wrong"):
            StompQueue(
                "localhost",
                61614,
                "Q",
                ca_file=pki.ca_file,
                cert_file=pki.client_cert,
                key_file=pki.client_encrypted_key,
                key_password=password,
            )


def test_a_client_key_that_is_not_the_certificates_is_refused_when_built(pki: Pki) -> None:
    with pytest.raises(ValueError, match="cannot be loaded .*wrong key"):
        StompQueue("localhost", 61614, "Q", cert_file=pki.client_cert, key_file=pki.ca_file)


def test_no_repr_or_str_shows_a_password() -> None:
    """The broker password and a client key's password, in every object that holds one."""
    key_secret = "k3y-passw0rd"
    plain = StompQueue("127.0.0.1", 61613, "Q", user="feed", password=SECRET)
    remote = StompQueue("broker.example", 61614, "Q", user="feed", password=SECRET)
    assert plain._endpoint.password == SECRET  # held, for CONNECT, and only shown masked
    endpoint_with_key = replace(remote._endpoint, tls=TlsFiles(key_password=key_secret))
    ibmmq = IbmMqQueue(
        queue_manager="QM1", channel="C", conn_name="mq(1414)", queue="Q", user="u", password=SECRET
    )
    resources = [
        StompQueueResource(user="feed", password=SECRET, key_password=key_secret),
        IbmMqQueueResource(
            queue_manager="QM1", channel="C", conn_name="mq(1414)", queue="Q", password=SECRET
        ),
    ]
    shown: list[object] = [
        plain,
        remote,
        plain._endpoint,
        endpoint_with_key,
        endpoint_with_key.tls,
        plain.backout_source(),
        ibmmq,
        Credentials("feed", SECRET),
        *resources,
    ]
    for thing in shown:
        for text in (repr(thing), str(thing)):
            assert SECRET not in text and key_secret not in text, text
    assert all(SECRET not in s.description for s in (plain, remote, ibmmq))
