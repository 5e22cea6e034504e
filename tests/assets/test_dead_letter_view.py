"""The dead letters by reason (lake/spark/dead_letter_summary.py) and how the `dead_letters` asset
shows
them (assets/dead_letter_view.py): counts and the latest example per reason, committed steps
only; feed-supplied text escaped so a hostile message cannot break the table or reach out."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest

from sis_platform.assets.dead_letter_view import MAX_CELL, dead_letter_metadata, markdown
from sis_platform.lake.delta import Lake
from sis_platform.lake.spark.dead_letter_summary import ReasonSummary, dead_letter_summary
from sis_platform.lake.tables import DEAD_LETTERS
from tests.domain.sportsdata_fixtures import ASCOT_1430, ASCOT_1500, GO_SOFT, event, master, update
from tests.harness import Harness

pytestmark = [pytest.mark.cost(60)]

T0 = datetime(2026, 11, 21, 14, 29, 58, tzinfo=UTC)


def _letter(n: int, reason: str, *, master: str | None, step: int, detail: str = "d"):
    return DEAD_LETTERS.row(
        message_id=f"ID:{n:048x}",
        master_id=master,
        position=None if master is None else 0,
        reason=reason,
        detail=detail,
        body=b"<x/>",
        batch_key=f"{n:010d}",
        batch_seq=n,
        msg_seq=0,
        delivery_count=1,
        fold_step=step,
        dead_lettered_at=T0 + timedelta(seconds=n),
    )


@pytest.mark.spark
def test_counts_and_latest_example_per_reason_of_committed_steps(spark, tmp_path):
    lake = Lake(spark, str(tmp_path))
    lake.ensure(DEAD_LETTERS)
    rows = [
        _letter(1, "orphan-update", master="M1", step=1),
        _letter(2, "not-well-formed", master=None, step=1, detail="unclosed tag"),
        _letter(3, "orphan-update", master="M2", step=2, detail="no master M2"),
        _letter(4, "orphan-update", master="M3", step=3),  # an uncommitted step's row
    ]
    lake.append(DEAD_LETTERS, spark.createDataFrame(rows, DEAD_LETTERS.schema()))

    summary = dead_letter_summary(lake, committed_step=2)
    assert summary == [
        ReasonSummary(
            "orphan-update", 2, T0 + timedelta(seconds=3), f"ID:{3:048x}", "M2", "no master M2"
        ),
        ReasonSummary(
            "not-well-formed", 1, T0 + timedelta(seconds=2), f"ID:{2:048x}", None, "unclosed tag"
        ),
    ]
    assert dead_letter_summary(Lake(spark, str(tmp_path / "empty")), committed_step=2) == []


def test_the_table_and_a_count_per_reason():
    summary = [
        ReasonSummary("orphan-update", 2, T0, "ID:abc", "M2", "no master"),
        ReasonSummary("not-well-formed", 1, T0, "ID:def", None, None),
    ]
    metadata = dead_letter_metadata(summary)
    assert metadata["dead_letters_total"] == 3
    assert metadata["dead_letters_orphan_update"] == 2
    assert metadata["dead_letters_not_well_formed"] == 1
    table = metadata["dead_letters_by_reason"].value
    assert table.splitlines()[2] == (
        "| orphan\\-update | 2 | 2026-11-21T14:29:58Z | ID:abc | M2 | no master |"
    )
    assert "| (whole message) |" in table.splitlines()[3]
    assert "replay_dead_letters" in table
    assert markdown([]) == "No dead letters.\n"


def test_feed_text_is_escaped_flattened_and_shortened():
    hostile = "a|b\n| x | ![pixel](http://attacker/p.png) <img src=x> `code` \x1b[31m" + "z" * 500
    (row,) = markdown(
        [ReasonSummary("schema-invalid", 1, T0, hostile, hostile, hostile)]
    ).splitlines()[2:3]
    assert row.count(" | ") == 5  # the six cells of the table, no more
    assert "\n" not in row and "\x1b" not in row
    cells = row.strip("| ").split(" | ")
    feed_cells = cells[3:]  # message id, master id, detail
    # Every character markdown or HTML acts on is escaped in them.
    for cell in feed_cells:
        assert re.findall(r"(?<!\\)[`*_{}\[\]()#+\-.!<>~&|]", cell.replace("\\\\", "")) == []
        assert cell.startswith("a\\|b \\| x")  # a line break is a space, a pipe is text
        assert "\\!\\[pixel\\]\\(http://attacker/p\\.png\\)" in cell
        assert len(cell.replace("\\", "")) <= MAX_CELL


@pytest.mark.spark
@pytest.mark.dagster
def test_a_run_shows_the_view_and_the_row_counts_and_check_lake_passes(tmp_path, spark):
    h = Harness(tmp_path / "data")
    with h.resources["queue"].open().producer() as producer:
        producer.put(master(event(ASCOT_1430), event(ASCOT_1500)))
        orphan = producer.put(update("NOPE-1", GO_SOFT))
    h.drain()
    (key,) = h.requested
    result = h.run(key)

    def metadata(node: str, asset: str) -> dict:
        (m,) = [
            m for m in result.asset_materializations_for_node(node) if m.asset_key.path == [asset]
        ]
        return {k: v.value for k, v in m.metadata.items()}

    logged = metadata("raw_messages", "raw_messages")
    assert (logged["dagster/row_count"], logged["redelivered"], logged["moved_aside"]) == (2, 0, 0)
    landed = h.resources["landing"].catalog().iter_messages()
    assert logged["bytes"] == sum(len(m["body"]) for m in landed)
    letters = metadata("fold_masters", "dead_letters")
    assert (letters["dead_letters_total"], letters["dead_letters_orphan_update"]) == (1, 1)
    table = letters["dead_letters_by_reason"]
    assert "| orphan\\-update | 1 |" in table and orphan in table
    documents = metadata("fold_masters", "master_documents")
    assert documents["dagster/row_count"] == 2
    assert documents["fold_step"] == "1"  # an identifier, not plotted
    assert metadata("interpreted_model", "events")["dagster/row_count"] == 2
    # A batch run evaluates the log's chain and the fold's own checks: nothing waits for the
    # fold, and one message of the batch's two dead-lettered is over the 5% threshold: a
    # warning, which stops nothing (the model was refreshed above).
    ran = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert set(ran) == {
        "hash_chain_intact",
        "lake_lag_within_bounds",
        "dead_letter_rate_below_threshold",
    }
    lag = ran["lake_lag_within_bounds"]
    assert lag.passed and lag.metadata["messages_waiting"].value == 0
    rate = ran["dead_letter_rate_below_threshold"]
    assert (rate.passed, rate.severity) == (False, dg.AssetCheckSeverity.WARN)
    assert rate.metadata["worst_batch_rate"].value == 0.5
    assert rate.metadata["dead_letters_orphan_update"].value == 1
    # The lake's integrity checks, run by their own job, pass (each one's faults:
    # tests/lake/spark/test_checks.py); a batch run does not evaluate them.
    checked = h.defs.resolve_job_def("check_lake").execute_in_process(instance=h.instance)
    evaluations = {e.check_name: e for e in checked.get_asset_check_evaluations()}
    assert set(evaluations) == {
        "one_row_per_master",
        "versions_gap_free",
        "applied_at_most_once",
        "one_end_state_per_message",
        "model_references_hold",
        "files_within_bound",
    }
    assert all(e.passed for e in evaluations.values()), evaluations
    assert evaluations["one_end_state_per_message"].metadata["messages_checked"].value == 2
