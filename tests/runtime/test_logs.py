"""SIS_LOG_FORMAT=json (sis_platform/runtime/logs.py): one JSON object per line, with the
identifiers of the message or master a line concerns as fields of their own; the default stays
a human-readable line."""

from __future__ import annotations

import json
import logging
import signal
import subprocess

from sis_platform.runtime.logs import (
    MAX_EXCEPTION_CHARS,
    MAX_IDENTIFIER_CHARS,
    MAX_MESSAGE_CHARS,
    JsonFormatter,
    TextFormatter,
    concerning,
)
from tests.live.processes import finish, start_live
from tests.live.running import BOUND_SECONDS, Place
from tests.live.test_budget import ASCOT_1500, FEED, POISON, _put


def record(msg: str, *args: object, extra: dict[str, object] | None = None) -> logging.LogRecord:
    logger = logging.getLogger("sis_platform.test")
    made = logger.makeRecord(logger.name, logging.ERROR, __file__, 1, msg, args, None, extra=extra)
    return made


def test_a_json_line_carries_the_identifiers_it_concerns_and_nothing_else_extra() -> None:
    line = JsonFormatter().format(
        record(
            "the fold of master %s failed",
            "m-1",
            extra={**concerning(master_id="m-1", message_id="x\ny", position=0), "free": "text"},
        )
    )
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["message"] == "the fold of master m-1 failed"
    assert (parsed["level"], parsed["logger"]) == ("ERROR", "sis_platform.test")
    assert (parsed["master_id"], parsed["message_id"], parsed["position"]) == ("m-1", "x\ny", 0)
    assert "free" not in parsed and "batch" not in parsed
    assert parsed["time"].endswith("+00:00")


def _written(tmp_path, *records: logging.LogRecord) -> bytes:
    """What a real stream handler with the JSON format writes for `records` to a UTF-8 file
    (as sis-live's stderr would carry it)."""
    path = tmp_path / "out.log"
    with path.open("w", encoding="utf-8") as stream:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(JsonFormatter())
        for made in records:
            handler.emit(made)
    return path.read_bytes()


def test_a_hostile_message_id_yields_one_bounded_ascii_line_per_record(tmp_path) -> None:
    # A message id is whatever a producer put in a header: a megabyte, line breaks, a forged
    # JSON line, Unicode line separators, a lone surrogate (an undecodable byte kept).
    hostile = [
        "x" * 1_000_000,
        'a\n{"level": "INFO", "message": "forged"}\r\n',
        "\u2028\u2029\x00\x1b[31m\x85",
        "bad-\udcff-byte",
    ]
    records = [
        record(
            "embedded queue q: message %s reached backout count %d",
            message_id,
            5,
            extra=concerning(message_id=message_id, master_id=message_id, batch=message_id),
        )
        for message_id in hostile
    ]
    written = _written(tmp_path, *records)
    lines = written.split(b"\n")
    assert lines[-1] == b"" and len(lines) == len(hostile) + 1  # one line per record
    for message_id, raw in zip(hostile, lines, strict=False):
        assert raw.isascii()
        assert len(raw) < 2 * MAX_MESSAGE_CHARS + 6 * 3 * MAX_IDENTIFIER_CHARS
        parsed = json.loads(raw)
        for key in ("message_id", "master_id", "batch"):
            assert message_id.startswith(parsed[key][:MAX_IDENTIFIER_CHARS])
        if len(message_id) > MAX_IDENTIFIER_CHARS:
            cut = len(message_id) - MAX_IDENTIFIER_CHARS
            assert parsed["message_id"].endswith(f"...[{cut} more characters]")
            assert parsed["message"].endswith("more characters]")
        else:
            assert parsed["message_id"] == message_id  # escaped on the line, whole in the value
    assert b"\nforged" not in written and b'\n{"level": "INFO"' not in written


def test_a_hostile_message_id_cannot_forge_or_stretch_a_text_line(tmp_path) -> None:
    forged = "a\n2026-12-02 10:00:00,000 INFO sis_platform.live: forged\u2028\x1b[2J\udcff"
    path = tmp_path / "out.log"
    with path.open("w", encoding="utf-8") as stream:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(TextFormatter())
        for message_id in (forged, "y" * 1_000_000, "plain-id é"):
            handler.emit(record("message %s reached backout count %d", message_id, 5))
    lines = path.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 4 and lines[-1] == ""
    assert " ERROR sis_platform.test: message a\\n2026-12-02 10:00:00,000 INFO" in lines[0]
    assert lines[0].endswith("forged\\u2028\\x1b[2J\\udcff reached backout count 5")
    assert len(lines[1]) < MAX_MESSAGE_CHARS + 100 and lines[1].endswith("more characters]")
    assert lines[2].endswith(" ERROR sis_platform.test: message plain-id é reached backout count 5")


def test_a_long_traceback_keeps_its_end(tmp_path) -> None:
    try:
        raise ValueError("y" * (3 * MAX_EXCEPTION_CHARS) + " the end")
    except ValueError:
        import sys

        made = record("failed")
        made.exc_info = sys.exc_info()
    [raw, _] = _written(tmp_path, made).split(b"\n")
    trace = json.loads(raw)["exception"]
    assert len(trace) < MAX_EXCEPTION_CHARS + 100
    assert trace.endswith(" the end") and "characters cut]" in trace


def test_an_exception_stays_on_the_one_line() -> None:
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        import sys

        made = record("failed")
        made.exc_info = sys.exc_info()
    line = JsonFormatter().format(made)
    assert "\n" not in line
    assert "ValueError: bad\nthing" in json.loads(line)["exception"]


def test_sis_live_logs_json_lines_naming_the_master_a_failure_concerns(tmp_path) -> None:
    place = Place(tmp_path / "data")
    _put(place, FEED)
    log = tmp_path / "sis-live.log"
    proc = start_live(
        place.root,
        log,
        SIS_LOG_FORMAT="json",
        SIS_LIVE_GROUP_MAX_MESSAGES="2",
        SIS_INJECT_FOLD_FAILURE=f"{POISON}:raise",
    )
    try:
        for _ in range(int(BOUND_SECONDS * 10)):
            if "the fold of master" in log.read_text(errors="replace"):
                break
            # Waiting on sis-live itself (it must not exit): the log has no event to await.
            try:
                proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                continue
            raise AssertionError(f"sis-live exited: {log.read_text()[-3000:]}")
    finally:
        proc.send_signal(signal.SIGTERM)
    assert finish(proc, BOUND_SECONDS, log) == 0
    lines = [json.loads(line) for line in log.read_text().splitlines()]  # every line is JSON
    assert any("acquired the consumer lease" in line["message"] for line in lines)
    [failed] = [line for line in lines if line["message"].startswith("the fold of master")]
    assert (failed["level"], failed["master_id"]) == ("ERROR", ASCOT_1500)
    assert lines[-1]["message"] == "sis-live stopped"


def test_the_default_is_a_human_readable_line(tmp_path) -> None:
    place = Place(tmp_path / "data")
    log = tmp_path / "sis-live.log"
    proc = start_live(place.root, log)
    for _ in range(int(BOUND_SECONDS * 10)):
        if "acquired the consumer lease" in log.read_text(errors="replace"):
            break
        try:
            proc.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            continue
        raise AssertionError(f"sis-live exited: {log.read_text()[-3000:]}")
    proc.send_signal(signal.SIGTERM)
    assert finish(proc, BOUND_SECONDS, log) == 0
    first = log.read_text().splitlines()[0]
    assert " WARNING sis_platform" in first or " INFO sis_platform" in first
    assert not first.startswith("{")
