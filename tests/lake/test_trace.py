"""Tracing a message through the log (sis_platform/lake/trace.py and the sis-trace command).

One small log is built once for the module by the real pipeline: messages put on the embedded
queue, landed by the sensor, each batch run through the Dagster job in-process:

  batch 1  master new (1430, 1500), update of both; the tick crashed before the queue commit
  batch 2  both redelivered (delivery count 2), a broken message, an orphan update
           (batches 1 and 2 folded together: fold step 2)
  batch 3  an update logged and parsed, its fold not run yet
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sis_platform.cli.trace import main
from sis_platform.intake.consumer import BatchLimits, consume_batch
from sis_platform.lake.asof import LAKE, SERVING_STORE, master_as_of
from sis_platform.lake.tables import FOLD_STEPS, MASTER_DOCUMENTS, MESSAGE_OUTCOMES
from sis_platform.lake.trace import NOT_FOLDED, PARSED_INVALID, normalize_message_id, trace_message
from sis_platform.live.applier import Applier
from sis_platform.live.config import LiveConfig
from sis_platform.log.landing import LandedBatch
from sis_platform.queues.base import new_message_id
from sis_platform.serving import open_reader, open_writer
from tests.domain.sportsdata_fixtures import (
    ASCOT_1430,
    ASCOT_1500,
    GO_SOFT,
    PRICE_7_TO_9,
    event,
    master,
    update,
)
from tests.harness import LOG_ASSETS, Harness

pytestmark = [pytest.mark.spark, pytest.mark.dagster, pytest.mark.cost(150)]

BROKEN = b"<sportsdata category='master' type='new' id='X'><event"


@dataclass(frozen=True)
class Log:
    harness: Harness
    new_id: str  # master new of both races: batch 1, redelivered in batch 2
    multi_id: str  # update of both races: batch 1, redelivered in batch 2
    broken_id: str
    orphan_id: str
    pending_id: str  # in batch 3, not folded


def _crash_before_commit(_batch: LandedBatch) -> None:
    raise RuntimeError("simulated crash between landing and queue commit")


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory, spark) -> Log:
    h = Harness(tmp_path_factory.mktemp("trace") / "data")
    queue = h.resources["queue"].open()
    with queue.producer() as producer:
        new_id = producer.put(master(event(ASCOT_1430), event(ASCOT_1500)))
        multi_id = producer.put(update(f"{ASCOT_1430} {ASCOT_1500}", GO_SOFT))
    # Landed as batch 1, then backed out: the queue redelivers both, so the log holds two copies.
    with queue.connect() as session, pytest.raises(RuntimeError):
        consume_batch(
            session,
            h.zone.writer,
            BatchLimits(get_wait_seconds=0.05),
            before_commit=_crash_before_commit,
        )
    with queue.producer() as producer:
        broken_id = producer.put(BROKEN)
        orphan_id = producer.put(update("NOPE-1", GO_SOFT))
    h.drain()
    assert h.requested == ["0000000001", "0000000002"]
    # Batch 1's run stops after logging (as if its fold had failed); batch 2's run, the whole
    # job, then folds both in one step: the fold takes every logged batch without a gap. One
    # fold instead of two keeps this module's setup short.
    h.materialize("0000000001", *LOG_ASSETS)
    h.run("0000000002")

    with queue.producer() as producer:
        pending_id = producer.put(update(ASCOT_1430, PRICE_7_TO_9))
    h.drain()
    h.materialize("0000000003", *LOG_ASSETS)  # logged and parsed, not folded
    return Log(h, new_id, multi_id, broken_id, orphan_id, pending_id)


@pytest.fixture
def cli_env(log: Log, monkeypatch: pytest.MonkeyPatch) -> None:
    # The same variables as the harness: the command's getOrCreate() then reuses this session.
    for name, value in log.harness.env.items():
        monkeypatch.setenv(name, value)


def test_applied_multi_id_update_names_the_version_each_item_produced(log: Log, spark):
    trace = trace_message(log.harness.lake(spark), log.multi_id)
    first = trace.copies[0]
    assert (first.batch_key, first.delivery_count, first.folded) == ("0000000001", 1, True)
    assert first.outcome is None  # per item
    assert [(i.position, i.master_id, i.category) for i in first.items] == [
        (0, ASCOT_1430, "update"),
        (1, ASCOT_1500, "update"),
    ]
    versions = [i.outcome.version for i in first.items]
    assert [(v.master_id, v.version, v.operation, v.fold_step) for v in versions if v] == [
        (ASCOT_1430, 2, "update", 2),
        (ASCOT_1500, 2, "update", 2),
    ]
    assert all(i.outcome.status == "applied" for i in first.items)
    assert first.body_intact and first.link_consistent
    assert trace.counted == first.ref


def test_redelivered_copy_is_a_duplicate_of_the_copy_that_counted(log: Log, spark):
    trace = trace_message(log.harness.lake(spark), log.new_id)
    first, second = trace.copies
    assert (second.batch_key, second.delivery_count) == ("0000000002", 2)
    assert second.body_sha256 == first.body_sha256
    assert second.outcome is not None and second.outcome.status == "duplicate"
    assert second.outcome.duplicate_of == first.ref
    assert second.outcome.fold_step == 2
    assert all(i.outcome.duplicate_of == first.ref for i in second.items)
    assert [i.outcome.version.operation for i in first.items if i.outcome.version] == [
        "new",
        "new",
    ]


def test_invalid_message_is_dead_lettered_whole_with_its_reason(log: Log, spark):
    trace = trace_message(log.harness.lake(spark), log.broken_id)
    (copy,) = trace.copies
    assert (copy.parsed, copy.invalid_reason, copy.items) == (
        PARSED_INVALID,
        "not-well-formed",
        (),
    )
    assert copy.outcome is not None and copy.outcome.status == "dead-lettered"
    assert copy.outcome.dead_letter is not None
    assert copy.outcome.dead_letter.reason == "not-well-formed"
    assert copy.outcome.dead_letter.detail
    assert copy.outcome.dead_letter.dead_lettered_at >= copy.received_at


def test_orphan_update_item_is_dead_lettered(log: Log, spark):
    trace = trace_message(log.harness.lake(spark), log.orphan_id)
    (copy,) = trace.copies
    (item,) = copy.items
    assert item.master_id == "NOPE-1"
    assert item.outcome.status == "dead-lettered"
    assert item.outcome.dead_letter is not None
    assert (item.outcome.dead_letter.reason, item.outcome.dead_letter.fold_step) == (
        "orphan-update",
        2,
    )


def test_message_in_a_batch_without_a_committed_fold_step_is_not_yet_folded(log: Log, spark):
    trace = trace_message(log.harness.lake(spark), log.pending_id)
    assert trace.committed_fold_step == 2
    (copy,) = trace.copies
    assert (copy.batch_key, copy.folded) == ("0000000003", False)
    assert copy.outcome is not None and copy.outcome.status == NOT_FOLDED
    assert [(i.master_id, i.outcome.status) for i in copy.items] == [(ASCOT_1430, NOT_FOLDED)]
    assert trace.counted is None


def test_rows_of_an_uncommitted_fold_step_are_ignored(log: Log, spark):
    lake = log.harness.lake(spark)
    (copy,) = trace_message(lake, log.orphan_id).copies
    # An interrupted step 3 left a contradicting outcome behind (the next step's recovery would
    # delete it): no fold_steps row commits step 3, so the trace must not believe it.
    stray = spark.createDataFrame(
        [
            (
                log.orphan_id,
                copy.batch_seq,
                copy.msg_seq,
                0,
                "NOPE-1",
                "applied",
                1,
                None,
                None,
                None,
                3,
            )
        ],
        MESSAGE_OUTCOMES.schema(),
    )
    lake.append(MESSAGE_OUTCOMES, stray)
    try:
        (again,) = trace_message(lake, log.orphan_id).copies
    finally:
        lake.delete(MESSAGE_OUTCOMES, "fold_step > 2")
    assert again.items[0].outcome.status == "dead-lettered"
    assert again == copy


def test_unknown_id_is_not_found(log: Log, spark):
    trace = trace_message(log.harness.lake(spark), new_message_id())
    assert not trace.found and trace.copies == ()


def test_mq_msgid_hex_is_accepted_as_a_message_id():
    digits = "AB" * 24
    assert normalize_message_id(digits) == "ID:" + "ab" * 24
    assert normalize_message_id(f"  ID:{digits} ") == "ID:" + "ab" * 24
    assert normalize_message_id("ID:host-1-2:1:1:1") == "ID:host-1-2:1:1:1"


def test_cli_reports_copies_and_outcomes(log: Log, cli_env, capsys):
    assert main([log.new_id]) == 0
    out = capsys.readouterr().out
    assert f"Message {log.new_id}" in out
    assert "Copy 2 of 2: batch 0000000002" in out
    assert "duplicate of batch 0000000001 message 0" in out
    assert f"verdict         2 applied: {ASCOT_1430} v1, {ASCOT_1500} v1" in out
    assert f"{ASCOT_1500}  applied: version 1 (new), fold step 2" in out


def test_cli_shows_a_dead_letter_reason_and_the_body(log: Log, cli_env, capsys):
    assert main(["--show-body", log.broken_id]) == 0
    out = capsys.readouterr().out
    assert "invalid message: not-well-formed" in out
    assert "dead-lettered: not-well-formed" in out
    assert BROKEN.decode() in out


def test_cli_json_output(log: Log, cli_env, capsys):
    assert main(["--json", log.pending_id]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["found"] is True and data["committed_fold_step"] == 2
    (copy,) = data["copies"]
    assert copy["batch_key"] == "0000000003"
    assert copy["outcome"]["status"] == NOT_FOLDED
    assert copy["items"][0]["master_id"] == ASCOT_1430
    assert copy["received_at"].endswith("+00:00")
    assert "body_base64" not in copy


def test_cli_unknown_id_exits_1_with_a_clear_message(log: Log, cli_env, capsys):
    unknown = new_message_id()
    assert main([unknown]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"{unknown} is not in the message log" in captured.err


def test_cli_bad_arguments_exit_2(capsys):
    assert main([]) == 2
    assert main(["--no-such-flag", "ID:x"]) == 2
    assert main(["two words"]) == 2
    assert "not a message id" in capsys.readouterr().err


def test_sis_trace_help_runs_as_a_command():
    # The console script next to this interpreter (the venv's bin/; PATH may not include it).
    command = Path(sys.executable).parent / "sis-trace"
    assert command.exists(), "sis-trace is not installed: pip install -e ."
    out = subprocess.run(
        [str(command), "--help"], capture_output=True, text=True, check=False, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "MESSAGE_ID" in out.stdout and "--json" in out.stdout


# --- as of an instant (sis_platform/lake/asof.py, sis-trace --as-of)
# --------------------------------


def _received(log: Log, spark, message_id: str) -> datetime:
    return trace_message(log.harness.lake(spark), message_id).copies[0].received_at


def _fold_step_2_committed_at(log: Log, spark) -> datetime:
    (row,) = log.harness.lake(spark).read(FOLD_STEPS).where("fold_step = 2").collect()
    return row["committed_at"].astimezone(UTC)


def test_as_of_is_what_the_lake_showed_and_what_had_been_received(log: Log, spark):
    lake = log.harness.lake(spark)
    committed = _fold_step_2_committed_at(log, spark)
    new_at, update_at = _received(log, spark, log.new_id), _received(log, spark, log.multi_id)

    before = master_as_of(lake, ASCOT_1430, new_at - timedelta(microseconds=1))
    assert (before.found, before.shown, before.received) == (False, None, None)

    # Both versions were received in batch 1 (a landing stamps its messages with one instant);
    # the lake showed them from fold step 2's commit.
    assert update_at == new_at
    between = master_as_of(lake, ASCOT_1430, new_at)
    assert between.shown_by == LAKE and between.shown is None
    assert between.received is not None
    assert (between.received.version, between.received.message_id) == (2, log.multi_id)
    assert between.received.received_at == update_at

    shown = master_as_of(lake, ASCOT_1430, committed).shown
    assert shown is not None
    assert (shown.version, shown.operation, shown.message_id) == (2, "update", log.multi_id)
    assert (shown.in_lake_from, shown.fold_step, shown.received_at) == (committed, 2, update_at)
    (current,) = lake.read(MASTER_DOCUMENTS).where(f"master_id = '{ASCOT_1430}'").collect()
    assert shown.document == current["document"]
    # The pending update (batch 3) is logged, not folded: the lake knows no version 3 yet.
    assert master_as_of(lake, ASCOT_1430, datetime.now(UTC)).shown == shown
    assert not master_as_of(lake, "NOPE-1", datetime.now(UTC)).found


def test_as_of_with_the_serving_store_is_what_its_readers_were_shown(log: Log, spark, tmp_path):
    lake = log.harness.lake(spark)
    url = f"sqlite:///{tmp_path / 'serving.db'}"
    # A commit per message, as sis-live makes at the feed's pace (a catch-up commits a chunk).
    config = LiveConfig(group_max_messages=1)
    applier = Applier(log.harness.zone.catalog, lambda: open_writer(url), config)
    applier.catch_up(log.harness.zone.catalog.last_position())
    applier.close()
    with open_reader(url) as store:
        changes = [c for c in store.changes(limit=100) if c.master_id == ASCOT_1430]
        assert [c.version for c in changes] == [1, 2, 3]  # sis-live applied batch 3 too
        first, _, third = changes

        early = master_as_of(lake, ASCOT_1430, first.committed_at, store=store)
        assert early.shown_by == SERVING_STORE and early.shown is not None
        assert (early.shown.version, early.shown.in_store_from) == (1, first.committed_at)
        assert early.shown.fold_step == 2 and early.shown.document is not None
        assert early.shown.document_sha256 == first.document_sha256

        # Version 3 only the store has applied: its document is the store's current one, its
        # message the lake's logged (not folded) pending update.
        latest = master_as_of(lake, ASCOT_1430, third.committed_at, store=store).shown
        assert latest is not None
        assert (latest.version, latest.message_id, latest.fold_step) == (3, log.pending_id, None)
        assert latest.received_at == _received(log, spark, log.pending_id)
        stored = store.master(ASCOT_1430)
        assert stored is not None and latest.document == stored.document.decode()
        assert latest.document_sha256 == third.document_sha256


def test_cli_as_of(log: Log, cli_env, spark, capsys):
    committed = _fold_step_2_committed_at(log, spark)
    at = committed.isoformat().replace("+00:00", "Z")
    assert main(["--as-of", ASCOT_1500, at]) == 0
    out = capsys.readouterr().out
    assert f"Master {ASCOT_1500} as of {at}" in out
    assert "shown           version 2 (update)" in out
    assert f"made by         message {log.multi_id}" in out
    assert "in the lake     from " in out and "(fold step 2)" in out
    assert "<event" in out

    assert main(["--json", "--as-of", ASCOT_1500, at]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["shown_by"], data["shown"]["version"], data["received"]["version"]) == (
        "lake",
        2,
        2,
    )

    early = _received(log, spark, log.new_id).isoformat()
    assert main(["--as-of", ASCOT_1500, early]) == 1  # received, not shown yet
    captured = capsys.readouterr()
    assert "received by then version 2" in captured.out
    assert "had no version shown by the lake" in captured.err


def test_cli_as_of_bad_arguments_exit_2(capsys):
    assert main(["--as-of", ASCOT_1430, "yesterday"]) == 2
    assert main(["--as-of", ASCOT_1430, "2026-11-21T14:29:58Z", "ID:x"]) == 2
    err = capsys.readouterr().err
    assert "not an ISO 8601 time" in err and "either MESSAGE_ID or --as-of" in err
