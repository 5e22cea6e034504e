"""sis-live's traces over a real broker: the sis-live command consuming a queue of a real
ActiveMQ (Debian's, over STOMP) exports a CONSUMER span per group that names the broker and the
queue as the messaging conventions name them, and its groups' message counts add up to every
message published. What the spans hold stage by stage is tested on the embedded queue
(test_traces.py); this is the same path on the source production runs."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from sis_platform.live.traces import GROUP_SPAN
from sis_platform.queues.factory import open_source
from sis_platform.simulator.generator import generate_feed
from tests.live.processes import finish, open_store_once_created, start_live
from tests.live.running import BOUND_SECONDS, Place
from tests.otlp import otlp_receiver
from tests.queues.broker import Broker, activemq

__all__ = ["activemq"]  # the broker fixture, used by name below

pytestmark = [pytest.mark.broker, pytest.mark.cost(30)]


def test_the_spans_of_a_broker_fed_sis_live_name_the_broker_and_count_every_message(
    tmp_path: Path, activemq: Broker
) -> None:
    place = Place(tmp_path / "data")
    destination = f"/queue/sis.traces.{uuid.uuid4().hex}"
    feed = list(generate_feed(55, 80))
    with open_source(f"{activemq.url}{destination}").producer() as producer:
        for message in feed:
            producer.put(message.body, message_id=message.message_id)
    log = tmp_path / "sis-live.log"
    with otlp_receiver() as receiver:
        live = start_live(
            place.root,
            log,
            SIS_PROFILE="activemq",
            SIS_SOURCE="stomp",
            SIS_STOMP_HOST=activemq.host,
            SIS_STOMP_PORT=str(activemq.stomp_port),
            SIS_STOMP_DESTINATION=destination,
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_SERVICE_NAME="sis-live-broker-test",
        )
        try:
            _wait_for_messages(place, live, log, len(feed))
        finally:
            live.terminate()
            assert finish(live, BOUND_SECONDS, log) == 0
        spans = receiver.spans()
    groups = [s for s in spans if s.name == GROUP_SPAN]
    assert groups, log.read_text(errors="replace")[-3000:]
    assert {g.service for g in groups} == {"sis-live-broker-test"}
    assert {g.attributes["messaging.system"] for g in groups} == {"activemq"}
    assert {g.attributes["messaging.destination.name"] for g in groups} == {destination}
    assert sum(g.attributes["messaging.batch.message_count"] for g in groups) == len(feed)
    assert all(g.attributes["sis.visible"] is True for g in groups)


def _wait_for_messages(place: Place, live, log: Path, messages: int) -> None:
    """Until the serving store holds `messages` messages, on its doorbell (bounded)."""
    deadline = time.monotonic() + BOUND_SECONDS
    store = open_store_once_created(place.url, live, BOUND_SECONDS, log)
    try:
        seen = store.last_seq()
        while store.status().messages < messages:
            assert live.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            seen = store.wait_for_changes(seen, 0.5)
    finally:
        store.close()
