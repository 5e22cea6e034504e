"""Feed files: JSON lines that round-trip simulated messages exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sis_platform.simulator.feedfile import FeedFileError, read_feed, write_feed
from sis_platform.simulator.generator import generate_feed


def test_a_feed_round_trips_through_a_file(tmp_path: Path) -> None:
    feed = list(
        generate_feed(
            2,
            600,
            invalid={"not-well-formed": 0.05, "too-large": 0.005},
            duplicates=0.05,
            max_bytes=64 * 1024,
        )
    )
    path = tmp_path / "feed.jsonl"
    assert write_feed(feed, path) == 600
    assert list(read_feed(path)) == feed


def test_each_line_is_one_json_record_with_the_four_fields(tmp_path: Path) -> None:
    path = tmp_path / "feed.jsonl"
    write_feed(generate_feed(1, 20), path)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 20
    for line in lines:
        record = json.loads(line)
        assert set(record) == {"message_id", "body_b64", "kind", "sent"}
        assert record["sent"].endswith("+00:00")


def test_bodies_that_are_not_utf8_survive(tmp_path: Path) -> None:
    feed = list(generate_feed(4, 400, invalid={"not-well-formed": 0.25}))
    broken = [m for m in feed if m.kind == "invalid:not-well-formed"]
    path = tmp_path / "feed.jsonl"
    write_feed(feed, path)
    again = [m for m in read_feed(path) if m.kind == "invalid:not-well-formed"]
    assert [m.body for m in again] == [m.body for m in broken]


def test_blank_lines_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "feed.jsonl"
    write_feed(generate_feed(1, 3), path)
    path.write_text(path.read_text() + "\n\n", encoding="utf-8")
    assert len(list(read_feed(path))) == 3


@pytest.mark.parametrize(
    "line",
    [
        "not json",
        "[1, 2]",
        '{"message_id": "ID:00", "kind": "update", "sent": "2026-11-21T10:00:00+00:00"}',
        '{"message_id": "ID:00", "body_b64": "!!", "kind": "update",'
        ' "sent": "2026-11-21T10:00:00+00:00"}',
        '{"message_id": "ID:00", "body_b64": "", "kind": "update", "sent": "yesterday"}',
        '{"message_id": "ID:00", "body_b64": "", "kind": "update", "sent": "2026-11-21T10:00:00"}',
    ],
)
def test_a_bad_line_is_reported_with_its_line_number(tmp_path: Path, line: str) -> None:
    path = tmp_path / "feed.jsonl"
    write_feed(generate_feed(1, 2), path)
    with path.open("a", encoding="utf-8") as out:
        out.write(line + "\n")
    with pytest.raises(FeedFileError, match=r"feed\.jsonl:3: not a simulated message"):
        list(read_feed(path))
