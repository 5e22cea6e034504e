"""SIS_LOG_FORMAT=json (sis_platform/runtime/logs.py): one JSON object per line, with the
identifiers of the message or master a line concerns as fields of their own; the default stays
a human-readable line."""

from __future__ import annotations

import json
import logging
import signal
import subprocess

from sis_platform.runtime.logs import JsonFormatter, concerning
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
