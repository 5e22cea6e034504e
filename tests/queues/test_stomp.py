"""What ActiveMQ 5.17 does over STOMP (the facts sis_platform/queues/stomp/ is built on),
checked on the wire with plain stomp.py, plus StompQueue specifics."""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue as stdlib_queue
import signal
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import stomp
import stomp.utils
from hypothesis import given, settings
from hypothesis import strategies as st

from sis_platform.queues.base import SourceUnavailable
from sis_platform.queues.deliveries import RedeliveryCounts
from sis_platform.queues.stomp import (
    ACTIVEMQ_DLQ,
    BACKOUT_COUNT_PROPERTY,
    ID_PROPERTY,
    StompQueue,
)
from sis_platform.queues.stomp import frames as frames_module
from sis_platform.queues.stomp.frames import received_message
from sis_platform.settings import DEFAULT_BACKOUT_THRESHOLD
from tests.ports import free_port
from tests.queues.broker import Broker

WAIT = 10.0
SPAWN = multiprocessing.get_context("spawn")


class Wire(stomp.ConnectionListener):
    """A bare STOMP 1.2 connection that records every frame the broker sends."""

    def __init__(self, broker: Broker) -> None:
        self.frames: stdlib_queue.Queue[Any] = stdlib_queue.Queue()
        self.errors: stdlib_queue.Queue[Any] = stdlib_queue.Queue()
        self.conn = stomp.Connection12([(broker.host, broker.stomp_port)], auto_decode=False)
        self.conn.set_listener("wire", self)
        self.conn.connect(wait=True)

    def on_message(self, frame: Any) -> None:
        self.frames.put(frame)

    def on_error(self, frame: Any) -> None:
        self.errors.put(frame)

    def next(self, subscription: str | None = None) -> Any:
        while True:
            frame = self.frames.get(timeout=WAIT)
            if subscription is None or frame.headers.get("subscription") == subscription:
                return frame

    def close(self) -> None:
        self.conn.disconnect()


@pytest.fixture
def wire(activemq: Broker) -> Iterator[Wire]:
    w = Wire(activemq)
    yield w
    w.close()


@pytest.fixture
def name() -> str:
    return f"T{uuid.uuid4().hex}"


def source(broker: Broker, name: str, **kwargs: Any) -> StompQueue:
    return StompQueue(broker.host, broker.stomp_port, name, **kwargs)


@pytest.mark.broker
def test_activemq_marks_redelivery_with_a_flag_and_no_delivery_count(wire: Wire, name: str) -> None:
    dest = f"/queue/{name}"
    wire.conn.send(dest, b"\x00body", headers={"persistent": "true"})
    wire.conn.subscribe(dest, id="s1", ack="client-individual")
    first = wire.next("s1")
    assert set(first.headers) == {
        "ack",
        "content-length",
        "destination",
        "expires",
        "message-id",
        "persistent",
        "priority",
        "subscription",
        "timestamp",
    }
    assert first.headers["message-id"].startswith("ID:")
    assert first.body == b"\x00body"
    # Unacked messages come back when the subscription goes away.
    wire.conn.unsubscribe("s1")
    wire.conn.subscribe(dest, id="s2", ack="client-individual")
    again = wire.next("s2")
    assert again.headers["redelivered"] == "true"
    assert again.headers["message-id"] == first.headers["message-id"]
    assert set(again.headers) - set(first.headers) == {"redelivered"}
    wire.conn.ack(again.headers["ack"])


@pytest.mark.broker
def test_activemq_nack_dead_letters_at_once_and_is_refused_in_a_transaction(
    wire: Wire, name: str
) -> None:
    dest = f"/queue/{name}"
    wire.conn.send(dest, b"poison", headers={"persistent": "true"})
    wire.conn.send(dest, b"next", headers={"persistent": "true"})
    wire.conn.subscribe(dest, id="s", ack="client-individual")
    poison = wire.next("s")
    wire.conn.begin("tx")
    wire.conn.nack(poison.headers["ack"], transaction="tx")
    error = wire.errors.get(timeout=WAIT)
    assert "Poison ack cannot be transacted" in error.headers["message"]
    wire.conn.abort("tx")
    wire.conn.nack(poison.headers["ack"])  # outside a transaction: straight to the DLQ
    nxt = wire.next("s")
    assert nxt.body == b"next" and "redelivered" not in nxt.headers
    wire.conn.ack(nxt.headers["ack"])
    selector = f"JMSMessageID = '{poison.headers['message-id']}'"
    wire.conn.subscribe(
        ACTIVEMQ_DLQ, id="dlq", ack="client-individual", headers={"selector": selector}
    )
    dead = wire.next("dlq")
    assert dead.body == b"poison"
    assert dead.headers["original-destination"] == dest
    wire.conn.ack(dead.headers["ack"])


@pytest.mark.broker
def test_activemq_redelivers_to_consumers_that_go_away_for_ever_flagged_but_uncounted(
    wire: Wire, name: str
) -> None:
    """Why the source counts: ActiveMQ's redelivery limit (redeliveryPlugin,
    maximumRedeliveries) acts on poison acks only, never on a consumer that disconnects or
    unsubscribes with the message unacked, and the frame says only `redelivered`."""
    dest = f"/queue/{name}"
    wire.conn.send(dest, b"poison", headers={"persistent": "true"})
    for n in range(2 * DEFAULT_BACKOUT_THRESHOLD):
        wire.conn.subscribe(dest, id=f"s{n}", ack="client-individual")
        frame = wire.next(f"s{n}")
        assert frame.body == b"poison"
        assert frame.headers.get("redelivered") == ("true" if n else None)
        assert not {"redelivery-count", "JMSXDeliveryCount"} & set(frame.headers)
        wire.conn.unsubscribe(f"s{n}")
    wire.conn.subscribe(dest, id="last", ack="client-individual")
    wire.conn.ack(wire.next("last").headers["ack"])


def get_one_and_die(host: str, port: int, destination: str, counts: str, pipe: Any) -> None:
    """A consumer with the platform's defaults that gets one message and is then killed
    (SIGKILL, no backout, no close): intake dying on a message before it is landed."""
    source = StompQueue(host, port, destination, redelivery_counts=Path(counts))
    session = source.connect()
    message = session.get(WAIT)
    pipe.send(None if message is None else (message.message_id, message.delivery_count))
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.broker
@pytest.mark.faults
def test_message_that_kills_its_consumer_reaches_the_default_threshold_and_the_next_is_delivered(
    activemq: Broker, name: str, tmp_path: Path
) -> None:
    counts = tmp_path / "stomp" / "redeliveries.db"
    src = source(activemq, name, redelivery_counts=counts)  # every other setting: defaults
    assert (src.backout_threshold, src.backout_queue) == (10, ACTIVEMQ_DLQ)
    with src.producer() as producer:
        poison, good = producer.put(b"<kills-intake/>"), producer.put(b"<good/>")
    seen = []
    for _ in range(DEFAULT_BACKOUT_THRESHOLD):
        parent_end, child_end = SPAWN.Pipe()
        child = SPAWN.Process(
            target=get_one_and_die,
            args=(activemq.host, activemq.stomp_port, name, str(counts), child_end),
        )
        child.start()
        assert parent_end.poll(60), "the consumer process did not report"
        seen.append(parent_end.recv())
        child.join(30)
        assert child.exitcode == -signal.SIGKILL
    assert seen == [(poison, n) for n in range(1, DEFAULT_BACKOUT_THRESHOLD + 1)]
    # A new process (a new source object, the same counts file): the 11th delivery is moved.
    with source(activemq, name, redelivery_counts=counts).connect() as session:
        m = session.get(WAIT)
        # The killed consumers had it prefetched, so it comes back flagged, and is counted
        # once: the documented cost of the broker's prefetch (stomp.py).
        assert m is not None and (m.message_id, m.delivery_count) == (good, 2)
        session.commit()
        assert session.get(0.5) is None
    [moved] = [m for m in src.browse(ACTIVEMQ_DLQ) if m.message_id == poison]
    assert moved.body == b"<kills-intake/>"
    assert moved.properties[BACKOUT_COUNT_PROPERTY] == str(DEFAULT_BACKOUT_THRESHOLD)
    assert RedeliveryCounts(counts).entries() == 0  # both committed: nothing left to count


@pytest.mark.broker
def test_backout_threshold_zero_turns_the_move_off(activemq: Broker, name: str) -> None:
    src = source(activemq, name, backout_threshold=0, backout_queue=f"{name}.BACKOUT")
    assert "no backout threshold" in src.description
    with src.producer() as producer:
        poison = producer.put(b"poison")
    with src.connect() as session:
        for delivery in range(1, DEFAULT_BACKOUT_THRESHOLD + 3):
            m = session.get(WAIT)
            assert m is not None and (m.message_id, m.delivery_count) == (poison, delivery)
            session.backout()
        m = session.get(WAIT)
        assert m is not None and m.message_id == poison
        session.commit()
    assert src.browse_backout() == []


@pytest.mark.broker
def test_prefetch_bounds_what_a_consumer_holds_back_from_others(
    activemq: Broker, name: str
) -> None:
    src = source(activemq, name, prefetch=2)
    with src.producer() as producer:
        put_ids = [producer.put(b"%d" % i) for i in range(10)]
    with src.connect() as first:
        m = first.get(WAIT)
        assert m is not None and m.message_id == put_ids[0]
        with source(activemq, name, prefetch=10).connect() as second:
            got = []
            while (m := second.get(2.0)) is not None:
                got.append(m.message_id)
            second.commit()
        # The first consumer holds its unit plus at most its prefetch.
        assert len(got) >= 10 - 1 - 2
        assert got == sorted(got, key=put_ids.index)
        first.commit()


@pytest.mark.broker
def test_the_broker_refuses_a_message_over_its_size_limit(activemq: Broker, name: str) -> None:
    """scripts/activemq.sh bounds a message body (ACTIVEMQ_MAX_MESSAGE_BYTES, 4 MiB by default),
    which bounds what a consumer's prefetch holds; the producer is told why."""
    limit = 4 * 1024 * 1024
    src = source(activemq, name)
    with src.producer() as producer:
        producer.put(b"x" * limit)
    with pytest.raises(SourceUnavailable, match="ERROR: The maximum data length was exceeded"):
        with src.producer() as producer:
            producer.put(b"y" * (limit + 1))
    with src.connect() as session:
        m = session.get(WAIT)
        assert m is not None and m.body == b"x" * limit
        assert session.get(0.5) is None
        session.commit()


@pytest.mark.broker
def test_selector_filters_and_application_properties_are_returned(
    wire: Wire, activemq: Broker, name: str
) -> None:
    dest = f"/queue/{name}"
    for kind in ("a", "b", "a"):
        wire.conn.send(dest, kind.encode(), headers={"persistent": "true", "kind": kind})
    src = source(activemq, name, selector="kind = 'b'")
    with src.connect() as session:
        m = session.get(WAIT)
        assert m is not None and m.body == b"b" and dict(m.properties) == {"kind": "b"}
        assert session.get(0.5) is None
        session.commit()
    assert [m.body for m in source(activemq, name).browse()] == [b"a", b"a"]


@pytest.mark.broker
def test_message_id_is_the_producers_sis_id_or_else_the_brokers(
    wire: Wire, activemq: Broker, name: str
) -> None:
    dest = f"/queue/{name}"
    wire.conn.send(dest, b"foreign", headers={"persistent": "true"})
    src = source(activemq, name)
    with src.producer() as producer:
        ours = producer.put(b"ours")
    with src.connect() as session:
        foreign, mine = session.get(WAIT), session.get(WAIT)
        session.commit()
    assert foreign is not None and mine is not None
    assert foreign.message_id.startswith("ID:") and len(foreign.message_id) != 51
    assert mine.message_id == ours and ID_PROPERTY not in mine.properties


@pytest.mark.broker
@pytest.mark.parametrize(
    "timestamp", ["9223372036854775807", "-9223372036854775808", "253402300800000"]
)
def test_an_unreadable_timestamp_is_read_as_the_time_of_receipt_and_the_next_message_comes(
    wire: Wire, activemq: Broker, name: str, caplog: pytest.LogCaptureFixture, timestamp: str
) -> None:
    # Any producer can set `timestamp`; ActiveMQ passes any long on, even one past year 9999.
    dest = f"/queue/{name}"
    wire.conn.send(dest, b"<odd/>", headers={"persistent": "true", "timestamp": timestamp})
    wire.conn.send(dest, b"<next/>", headers={"persistent": "true"})
    before = datetime.now(UTC)
    with caplog.at_level(logging.WARNING), source(activemq, name).connect() as session:
        odd, following = session.get(WAIT), session.get(WAIT)
        session.commit()
        assert session.get(0.5) is None
    assert odd is not None and odd.body == b"<odd/>"
    assert before <= odd.put_time <= datetime.now(UTC)
    assert f"unreadable timestamp header '{timestamp}'" in caplog.text
    assert following is not None and following.body == b"<next/>"


@pytest.mark.broker
def test_a_message_whose_headers_fail_every_get_is_moved_aside_at_the_threshold(
    activemq: Broker, name: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # An error no header check foresaw: the threshold is checked before any header is read.
    real_put_time = frames_module._put_time

    def failing(headers: Any, *args: Any) -> datetime:
        if headers.get("kind") == "poison":
            raise RuntimeError("a header no check foresaw")
        return real_put_time(headers, *args)

    monkeypatch.setattr(frames_module, "_put_time", failing)
    backout = f"{name}.BACKOUT"
    src = source(activemq, name, backout_threshold=2, backout_queue=backout)
    with src.producer() as producer:
        producer.put(b"<first/>")
    wire = Wire(activemq)
    try:
        wire.conn.send(
            f"/queue/{name}", b"<poison/>", headers={"persistent": "true", "kind": "poison"}
        )
        wire.conn.send(f"/queue/{name}", b"<good/>", headers={"persistent": "true"})
    finally:
        wire.close()
    with caplog.at_level(logging.WARNING), src.connect() as session:
        first = session.get(WAIT)
        assert first is not None and first.body == b"<first/>"
        session.commit()
        for _ in range(2):  # the consumer fails, backs out, and gets again
            with pytest.raises(RuntimeError):
                session.get(WAIT)
            session.backout()
        m = session.get(WAIT)
        assert m is not None and m.body == b"<good/>"
        session.commit()
    assert "reached backout count 2, moving it to /queue/" + backout in caplog.text
    monkeypatch.undo()
    [moved] = src.browse(backout)
    assert moved.body == b"<poison/>" and moved.properties["kind"] == "poison"


def frame(headers: dict[str, str]) -> stomp.utils.Frame:
    return stomp.utils.Frame("MESSAGE", {"message-id": "ID:m-1", **headers}, b"<x/>")


def test_the_put_time_is_the_timestamp_header_in_milliseconds_utc() -> None:
    message = received_message(frame({"timestamp": "1795272600123"}), redeliveries=0)
    assert message.put_time == datetime(2026, 11, 21, 14, 50, 0, 123_000, tzinfo=UTC)


@pytest.mark.parametrize("timestamp", ["1" * 23, "-" + "1" * 23, "soon", "1" * 5000, ""])
def test_a_timestamp_no_datetime_holds_is_the_time_of_receipt_with_a_warning(
    timestamp: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A broker that passes any text on (RabbitMQ does) delivers these.
    before = datetime.now(UTC)
    with caplog.at_level(logging.WARNING):
        message = received_message(frame({"timestamp": timestamp}), redeliveries=0)
    assert before <= message.put_time <= datetime.now(UTC)
    assert "ID:m-1: unreadable timestamp header" in caplog.text
    [warned] = caplog.records
    assert warned.message_id == "ID:m-1"  # a field of a JSON line (sis_platform/runtime/logs.py)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.text(max_size=12), st.text(max_size=40), max_size=6),
    st.text() | st.from_regex(r"-?[0-9]{1,40}", fullmatch=True),
)
def test_any_header_values_make_a_message(headers: dict[str, str], timestamp: str) -> None:
    message = received_message(frame({**headers, "timestamp": timestamp}), redeliveries=0)
    assert message.body == b"<x/>" and message.put_time.tzinfo is UTC


def test_unreachable_broker_is_a_source_outage_after_bounded_retries() -> None:
    src = StompQueue(
        "127.0.0.1",
        free_port(),  # nobody listens on it
        "SPORTSDATA",
        user="feed",
        password="s3cret-pw",
        connect_attempts=3,
        retry_initial_seconds=0.01,
    )
    with pytest.raises(SourceUnavailable) as raised:
        src.connect()
    assert "3 attempt(s)" in str(raised.value)
    with pytest.raises(SourceUnavailable):
        src.producer()
    assert "s3cret-pw" not in str(raised.value) and "s3cret-pw" not in src.description
    assert src.description.startswith("stomp://feed@127.0.0.1:")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prefetch": 0},
        {"backout_threshold": -1},
        {"connect_attempts": 0},
        {"backout_queue": "/queue/SPORTSDATA"},
    ],
)
def test_bad_arguments_are_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        StompQueue("127.0.0.1", 61613, "SPORTSDATA", **kwargs)


@pytest.mark.broker
@pytest.mark.faults
def test_heartbeats_keep_an_idle_session_alive_and_detect_a_frozen_broker(
    activemq_outage: Broker, name: str
) -> None:
    broker = activemq_outage
    src = source(
        broker,
        name,
        heartbeats=(300, 300),
        connect_attempts=1,
        connect_timeout=1.0,
    )
    with src.connect() as session:
        # Idle for several heartbeat periods: the link must survive on heartbeats alone.
        assert session.get(2.0) is None
        with src.producer() as producer:
            put_id = producer.put(b"after idling")
        m = session.get(WAIT)
        assert m is not None and m.message_id == put_id
        session.commit()
        # A broker that stops answering (frozen JVM, dead network) keeps the TCP connection
        # open; only the missing heartbeats reveal it.
        pid = int((broker.directory / "broker.pid").read_text())
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(SourceUnavailable):
                session.get(30.0)
            assert time.monotonic() - started < 10.0
        finally:
            os.kill(pid, signal.SIGCONT)
        with src.producer() as producer:
            put_id = producer.put(b"after thaw")
        m = session.get(WAIT)  # the session reconnects by itself
        assert m is not None and m.message_id == put_id
        session.commit()


@pytest.mark.broker
def test_connection_lost_with_a_unit_open_must_be_backed_out(
    activemq_outage: Broker, name: str
) -> None:
    broker = activemq_outage
    src = source(broker, name, connect_attempts=1, connect_timeout=2.0)
    with src.producer() as producer:
        put_ids = [producer.put(b"a"), producer.put(b"b")]
    with src.connect() as session:
        m = session.get(WAIT)
        assert m is not None and m.message_id == put_ids[0]
        with broker.down():
            with pytest.raises(SourceUnavailable, match="unit of work"):
                session.get(WAIT)
            # Until the caller acknowledges the lost unit, nothing pretends to go on.
            with pytest.raises(SourceUnavailable, match="backout"):
                session.get(0.0)
            with pytest.raises(SourceUnavailable, match="backout"):
                session.commit()
            session.backout()  # the broker already did it; this just ends the unit
        again = [session.get(WAIT), session.get(WAIT)]
        session.commit()
    # Back in order, as the same messages. Not necessarily flagged redelivered: the broker
    # restarted, and scripts/activemq.sh does not persist the flag.
    assert [m.message_id if m else None for m in again] == put_ids
