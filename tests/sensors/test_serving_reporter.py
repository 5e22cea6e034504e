"""The serving store's reporter against a real SQLite store and a landing zone written by
GroupWriter; time is the sensor's injected clock (the store stamps its own commits)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest

from sis_platform.assets.serving import LIVE_STORE_FRESH, SERVING_STORE_KEY
from sis_platform.log.landing import ClosedBy, GroupWriter, LandingZone, LogPosition
from sis_platform.resources.platform import LandingZoneResource
from sis_platform.resources.serving import ServingStoreResource
from sis_platform.sensors.serving_reporter import (
    REPORTER_NAME,
    ReporterState,
    build_serving_reporter,
    lag_behind,
)
from sis_platform.serving import (
    ChangeRow,
    GroupCommit,
    MasterRow,
    OutcomeRow,
    ServingWriter,
    open_writer,
)
from tests.harness import received

pytestmark = [pytest.mark.dagster]

REPORT_SECONDS = 5.0
MAX_LAG = 30.0


def _commit(store: ServingWriter, position: LogPosition, first_msg_seq: int) -> None:
    """A group applying the messages first_msg_seq..position.msg_seq of position's batch, one
    new master each."""
    masters, changes, outcomes = [], [], []
    for m in range(first_msg_seq, position.msg_seq + 1):
        master_id = f"M{position.batch_seq}-{m}"
        document = f"<event id='{master_id}'/>".encode()
        masters.append(MasterRow(master_id, 1, document, f"id-{m}", False, False))
        changes.append(
            ChangeRow(
                master_id,
                1,
                f"id-{m}",
                0,
                position.batch_seq,
                m,
                None,
                "new",
                hashlib.sha256(document).hexdigest(),
            )
        )
        outcomes.append(
            OutcomeRow(f"id-{m}", position.batch_seq, m, -1, master_id, "applied", None)
        )
    store.commit(GroupCommit(position, masters, {}, changes, [], outcomes))


class Reporter:
    """The reporter evaluated as the daemon does, at the times the test sets."""

    def __init__(self, tmp_path: Path) -> None:
        self.url = f"sqlite:///{tmp_path / 'serving' / 'serving.db'}"
        self.zone = LandingZone(tmp_path / "landing")
        self.resources = {
            "landing": LandingZoneResource(root=str(self.zone.catalog.root)),
            "serving": ServingStoreResource(url=self.url),
        }
        self.instance = dg.DagsterInstance.ephemeral()
        self.start = datetime.now(UTC)
        self.now = self.start
        self.sensor = build_serving_reporter(REPORT_SECONDS, MAX_LAG, clock=lambda: self.now)
        self.cursor: str | None = None

    def store(self) -> ServingWriter:
        return open_writer(self.url)

    def tick(self, at_seconds: float) -> str:
        self.now = self.start + timedelta(seconds=at_seconds)
        context = dg.build_sensor_context(
            instance=self.instance, cursor=self.cursor, resources=self.resources
        )
        result = self.sensor(context)
        assert isinstance(result, dg.SensorResult)
        assert not result.run_requests
        self.cursor = result.cursor or self.cursor
        return (result.skip_reason.skip_message or "") if result.skip_reason else ""

    def materializations(self) -> list[dict[str, object]]:
        records = self.instance.fetch_materializations(SERVING_STORE_KEY, limit=100).records
        found = [r.asset_materialization for r in records]
        return [
            {k: v.value for k, v in m.metadata.items()}
            for m in reversed(found)  # oldest first
            if m is not None
        ]

    def freshness(self) -> list[tuple[bool, str]]:
        key = dg.AssetCheckKey(SERVING_STORE_KEY, LIVE_STORE_FRESH)
        history = self.instance.event_log_storage.get_asset_check_execution_history(key, 100)
        evaluations = []
        for record in reversed(history):  # oldest first
            assert record.event is not None and record.event.dagster_event is not None
            evaluation = record.event.dagster_event.event_specific_data
            assert isinstance(evaluation, dg.AssetCheckEvaluation)
            evaluations.append((evaluation.passed, evaluation.severity.value))
        return evaluations


@pytest.fixture
def reporter(tmp_path: Path) -> Iterator[Reporter]:
    yield Reporter(tmp_path)


def _land(writer: GroupWriter, n: int) -> None:
    writer.land([received(f"<m n='{i}'/>".encode()) for i in range(n)])


def test_reports_only_when_the_store_moved_and_at_most_once_per_interval(reporter):
    writer = GroupWriter(reporter.zone.writer)
    _land(writer, 3)
    with reporter.store() as store:
        _commit(store, LogPosition(1, 2), 0)

        reporter.tick(0)
        (first,) = reporter.materializations()
        assert first["batch_seq"] == 1 and first["msg_seq"] == 2
        assert first["messages_applied"] == 3 and first["masters"] == 3
        assert first["last_change_seq"] == 3
        assert first["lag_messages"] == 0 and first["lag_exact"] is True
        assert "messages_per_second" not in first  # no earlier report to measure from
        assert isinstance(first["seconds_since_commit"], float)

        reporter.tick(6)  # the store did not move: nothing reported
        assert len(reporter.materializations()) == 1

        _land(writer, 2)
        _commit(store, LogPosition(1, 4), 3)
        reporter.tick(7)  # moved, but within the interval of the last tick
        assert len(reporter.materializations()) == 1

        reporter.tick(12)
        second = reporter.materializations()[1]
        assert second["msg_seq"] == 4 and second["messages_applied"] == 5
        assert second["messages_per_second"] == pytest.approx(2 / 12, abs=1e-3)
    assert reporter.sensor.name == REPORTER_NAME
    assert reporter.sensor.minimum_interval_seconds == 5


def test_the_lag_counts_landed_messages_the_store_has_not_applied(reporter):
    writer = GroupWriter(reporter.zone.writer)
    _land(writer, 3)
    writer.seal(ClosedBy.MESSAGES)  # batch 1: 3 messages
    _land(writer, 4)
    writer.seal(ClosedBy.MESSAGES)  # batch 2: 4 messages
    _land(writer, 2)  # batch 3: 2 so far, open
    with reporter.store() as store:
        _commit(store, LogPosition(1, 0), 0)
    reporter.tick(0)
    (reported,) = reporter.materializations()
    assert reported["lag_messages"] == 2 + 4 + 2
    assert (reported["landed_batch_seq"], reported["landed_msg_seq"]) == (3, 1)
    zone = reporter.zone
    assert lag_behind(zone.catalog, LogPosition(0, -1), LogPosition(3, 1)).messages == 9
    assert lag_behind(zone.catalog, LogPosition(2, 3), LogPosition(3, 1)).messages == 2
    assert lag_behind(zone.catalog, LogPosition(3, 1), LogPosition(3, 1)).messages == 0


def test_freshness_fails_on_a_lag_or_a_stall_and_is_reported_when_it_changes(reporter):
    # The store stamps its commits with the real time; the sensor's clock runs 100 s behind it
    # here, so a commit looks recent however far the test moves the clock (up to 100 s).
    reporter.start -= timedelta(seconds=100)
    writer = GroupWriter(reporter.zone.writer)
    _land(writer, 2)
    with reporter.store() as store:
        _commit(store, LogPosition(1, 1), 0)
        reporter.tick(0)
        assert reporter.freshness() == [(True, "WARN")]  # caught up: passes

        _land(writer, 1)  # landed, not applied
        reporter.tick(10)
        reporter.tick(20)
        assert reporter.freshness() == [(True, "WARN")]  # waiting less than the bound
        reporter.tick(45)  # the message seen waiting at 10 s has waited 35 s > 30 s
        assert reporter.freshness() == [(True, "WARN"), (False, "WARN")]
        reporter.tick(50)
        assert len(reporter.freshness()) == 2  # unchanged: not reported again

        _commit(store, LogPosition(1, 2), 2)
        reporter.tick(60)
        assert reporter.freshness()[-1] == (True, "WARN")

        _land(writer, 1)
        reporter.tick(200)  # the last commit was ~100 s ago: sis-live has stalled
        assert reporter.freshness()[-1] == (False, "ERROR")


def test_the_cursor_round_trips(reporter):
    state = ReporterState.load(None)
    assert state == ReporterState()
    _land(GroupWriter(reporter.zone.writer), 1)
    reporter.store().close()  # sis-live's store, created and not yet committed to
    reporter.tick(0)
    loaded = ReporterState.load(reporter.cursor)
    assert loaded.ticked_at == reporter.now
    assert loaded.watermark is not None and loaded.watermark.position == LogPosition(1, 0)
    assert ReporterState.load(loaded.dump()) == loaded


def test_an_unreachable_store_is_a_freshness_error_and_no_materialization(tmp_path):
    reporter = Reporter(tmp_path)
    # Nothing listens on port 1 of the loopback: the connection is refused.
    reporter.resources["serving"] = ServingStoreResource(url="postgresql://sis@127.0.0.1:1/sis")
    _land(GroupWriter(reporter.zone.writer), 1)
    summary = reporter.tick(0)
    assert "the serving store is unavailable" in summary
    assert reporter.freshness() == [(False, "ERROR")]
    assert reporter.materializations() == []


def test_a_store_sis_live_has_not_created_is_a_freshness_error_naming_it(reporter):
    _land(GroupWriter(reporter.zone.writer), 1)
    summary = reporter.tick(0)
    assert "the serving store is unavailable: no serving store at " in summary
    assert "sis-live creates it" in summary
    assert reporter.freshness() == [(False, "ERROR")]
    assert reporter.materializations() == []
    assert not (Path(reporter.url.removeprefix("sqlite:///"))).exists()  # the sensor made none
