"""`sis-feed publish` to a real ActiveMQ broker over STOMP."""

from __future__ import annotations

from pathlib import Path

import pytest

from sis_platform.queues.factory import open_source
from sis_platform.simulator.cli import main
from sis_platform.simulator.feedfile import read_feed, write_feed
from sis_platform.simulator.generator import generate_feed
from tests.queues.broker import Broker, activemq

__all__ = ["activemq"]

pytestmark = pytest.mark.broker


def test_publish_over_stomp_keeps_ids_and_duplicates(tmp_path: Path, activemq: Broker) -> None:
    feed = tmp_path / "feed.jsonl"
    write_feed(generate_feed(6, 80, invalid={"not-well-formed": 0.05}, duplicates=0.1), feed)
    url = f"{activemq.url}/queue/sis-feed-cli-test"
    assert main(["publish", "--to", url, "--from-file", str(feed), "--backlog"]) == 0
    expected = [(m.message_id, m.body) for m in read_feed(feed)]
    received = []
    with open_source(url).connect() as session:
        for _ in expected:
            message = session.get(wait_seconds=10.0)
            assert message is not None
            received.append((message.message_id, message.body))
        assert session.get() is None
        session.commit()
    assert received == expected
