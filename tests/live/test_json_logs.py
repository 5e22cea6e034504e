"""Every JSON log line sis-live writes about a message, a master or a batch carries its
identifiers as fields (sis_platform/runtime/logs.py, issue 52): the real sis-live command with
SIS_LOG_FORMAT=json over a feed with duplicates, invalid messages (dead letters), items the
selector filters, a master whose fold fails, and a group redelivered after two crashes until
the queue's backout threshold moves it aside. Any line whose text names a message id of the
feed, a master (`master X`) or a batch (`batch NNNNNNNNNN`) must carry the same value in the
field of that name."""

from __future__ import annotations

import json
import re
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sis_platform.queues.embedded import EmbeddedQueue
from sis_platform.serving import open_writer
from sis_platform.simulator.generator import generate_feed
from tests.live.feed import INVALID
from tests.live.processes import SIGKILLED, finish, start_live
from tests.live.running import BOUND_SECONDS, Place

pytestmark = [pytest.mark.faults, pytest.mark.cost(30)]

# Delivered more than once: dead-lettered `redelivery-limit`; backed out twice: moved aside.
VARIABLES = {
    "SIS_LOG_FORMAT": "json",
    "SIS_REDELIVERY_LIMIT": "1",
    "SIS_BACKOUT_THRESHOLD": "2",
    "SIS_SELECTOR": "sport = 'horse-racing'",
    "SIS_QUARANTINE_AFTER": "2",
}
MASTER_IN_TEXT = re.compile(r"\bmaster (\S+?)[,:;)]?(?:\s|$)")
BATCH_IN_TEXT = re.compile(r"\bbatch (\d{10})\b")


def _master_of(body: bytes) -> str:
    found = re.search(rb'<sportsdata [^>]*\bid="([^"]+)"', body)
    assert found is not None
    return found.group(1).decode()


def _drain(place: Place, proc: Any, log: Path) -> None:
    """Wait, on the serving store's doorbell, until nothing is left on the queue (in flight
    or not): every group got is landed, applied and committed (the queue commits last)."""
    queue = EmbeddedQueue(place.root / "queue")
    store = open_writer(place.url)
    deadline = time.monotonic() + BOUND_SECONDS
    try:
        seen = store.last_seq()
        while queue.depth() > 0:
            assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-4000:]
            # The queue's commit follows the store's: a short wait for the change after it.
            seen = store.wait_for_changes(seen, 0.5)
    finally:
        store.close()


def test_every_json_line_about_a_message_master_or_batch_carries_its_identifiers(tmp_path):
    place = Place(tmp_path / "data")
    feed = list(generate_feed(53, 150, invalid=INVALID, duplicates=0.05))
    kinds = Counter(m.kind.split(":")[0] for m in feed)
    assert kinds["duplicate"] and kinds["invalid"]
    failing = _master_of(next(m.body for m in feed[60:] if m.kind == "update"))
    place.put(feed)
    log = tmp_path / "sis-live.log"
    variables = {**VARIABLES, "SIS_INJECT_FOLD_FAILURE": f"{failing}:raise"}

    # Killed twice with the first group landed and not committed: it comes back twice.
    for _ in range(2):
        proc = start_live(place.root, log, SIS_CRASH_AT="live.after_land", **variables)
        assert finish(proc, BOUND_SECONDS, log) == SIGKILLED, log.read_text()[-4000:]
    proc = start_live(place.root, log, **variables)
    try:
        _drain(place, proc, log)
    finally:
        proc.send_signal(signal.SIGTERM)
    assert finish(proc, BOUND_SECONDS, log) == 0

    lines = [json.loads(line) for line in log.read_text().splitlines()]  # every line is JSON
    message_ids = {m.message_id for m in feed}
    checked: Counter[str] = Counter()
    for line in lines:
        text = line["message"]
        named = [word for word in re.findall(r"ID:[0-9a-f]+", text) if word in message_ids]
        for message_id in named:
            assert line.get("message_id") == message_id, line
            checked["message_id"] += 1
        for master_id in MASTER_IN_TEXT.findall(text):
            assert line.get("master_id") == master_id, line
            checked["master_id"] += 1
        for key in BATCH_IN_TEXT.findall(text):
            assert str(line.get("batch")) == key, line
            checked["batch"] += 1
    # The feed provoked each kind of line: the group moved aside, the failing fold, a batch.
    moved = [line for line in lines if "reached backout count" in line["message"]]
    assert moved and all(line["message_id"] in message_ids for line in moved)
    assert any(line.get("master_id") == failing for line in lines)
    assert checked["message_id"] >= len(moved) and checked["master_id"] and checked["batch"]
    assert lines[-1]["message"] == "sis-live stopped"
