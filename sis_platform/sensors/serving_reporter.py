"""The serving store's reporter: sis-live's progress in Dagster, without a run.

Every SIS_LIVE_REPORT_SECONDS (at most) it reads the store's status and the landing zone's last
position, and when the store's position has moved since its last report it records one runless
materialization of `serving_store` with the position, the last change seq, masters, messages
applied, messages per second since the last report, the lag in messages behind the landed log
and the seconds since the last commit. It evaluates `live_store_fresh` at every tick and
reports the evaluation without a run when its result changes (and beside each
materialization). So the event log grows with the interval, never with the messages.

Its cursor holds what the next tick compares with (`ReporterState`, JSON). It never touches the
queue, and sis-live never imports Dagster: the store and the landing zone are the interface.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from sis_platform.assets.serving import (
    SERVING_STORE,
    Freshness,
    Watermark,
    assess_freshness,
    freshness_evaluation,
    position_text,
    store_unavailable,
    utc,
)
from sis_platform.log.landing import START_POSITION, Catalog, LogPosition, batch_key
from sis_platform.resources.platform import LandingZoneResource
from sis_platform.resources.serving import ServingStoreResource
from sis_platform.serving import ServingUnavailable, StoreStatus

REPORTER_NAME = "serving_store_reporter"
LAG_BATCHES_READ = 200  # anchors read to count the lag in messages; beyond, the count is a floor


@dataclass(frozen=True)
class Lag:
    """Landed messages the store has not applied (a floor when not `exact`)."""

    messages: int
    exact: bool


@dataclass(frozen=True)
class ReporterState:
    """The reporter's cursor: its last tick, its last report and the freshness it reported."""

    ticked_at: datetime | None = None
    position: LogPosition | None = None  # the store's position at the last materialization
    messages: int = 0  # messages applied then
    reported_at: datetime | None = None
    watermark: Watermark | None = None
    fresh: str | None = None  # the last reported freshness state (Freshness.state)

    def dump(self) -> str:
        return json.dumps(
            {
                "ticked_at": _iso(self.ticked_at),
                "position": list(self.position) if self.position is not None else None,
                "messages": self.messages,
                "reported_at": _iso(self.reported_at),
                "watermark": None
                if self.watermark is None
                else [*self.watermark.position, _iso(self.watermark.since)],
                "fresh": self.fresh,
            }
        )

    @classmethod
    def load(cls, cursor: str | None) -> ReporterState:
        if not cursor:
            return cls()
        data: dict[str, Any] = json.loads(cursor)
        mark = data.get("watermark")
        return cls(
            ticked_at=_time(data.get("ticked_at")),
            position=LogPosition(*data["position"]) if data.get("position") else None,
            messages=int(data.get("messages", 0)),
            reported_at=_time(data.get("reported_at")),
            watermark=None
            if not mark
            else Watermark(
                LogPosition(int(mark[0]), int(mark[1])), utc(datetime.fromisoformat(mark[2]))
            ),
            fresh=data.get("fresh"),
        )


def build_serving_reporter(
    report_seconds: float,
    max_lag_seconds: float,
    *,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> dg.SensorDefinition:
    """The reporter, evaluated every `report_seconds` (rounded up to whole seconds for the
    daemon, and enforced on its own cursor, less a tenth for the daemon's scheduling jitter, at
    most half a second, so a tick a little early is not put off a whole interval). `clock`: the
    current time, aware."""
    gap = report_seconds - min(0.5, report_seconds / 10)

    @dg.sensor(
        name=REPORTER_NAME,
        minimum_interval_seconds=max(1, math.ceil(report_seconds)),
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Reports the serving store's progress (position, lag, messages/s) as "
        "runless materializations of serving_store while it moves, and its live_store_fresh "
        "check when the result changes. Reads the store and the landing zone only.",
    )
    def serving_store_reporter(
        context: dg.SensorEvaluationContext,
        landing: LandingZoneResource,
        serving: ServingStoreResource,
    ) -> dg.SensorResult:
        now = clock()
        state = ReporterState.load(context.cursor)
        if state.ticked_at is not None and (now - state.ticked_at).total_seconds() < gap:
            return dg.SensorResult(skip_reason=f"reported less than {report_seconds:g}s ago")
        catalog = landing.catalog()
        landed = catalog.last_position()
        try:
            status = _status(serving)
        except ServingUnavailable as exc:
            fresh = store_unavailable(exc)
            landed_only = {"landed_position": position_text(landed)}
            state = _report_freshness(context.instance, state, fresh, landed_only, force=False)
            return _result(state, now, fresh.description)
        fresh = assess_freshness(status, landed, now, max_lag_seconds, state.watermark)
        moved = status.position != (state.position or START_POSITION)
        metadata = _metadata(status, landed, catalog, state, now) if moved else {}
        if moved:
            context.instance.report_runless_asset_event(
                dg.AssetMaterialization(asset_key=SERVING_STORE, metadata=metadata)
            )
            state = replace(
                state, position=status.position, messages=status.messages, reported_at=now
            )
        positions = {
            "store_position": position_text(status.position),
            "landed_position": position_text(landed),
        }
        state = _report_freshness(
            context.instance, state, fresh, {**metadata, **positions}, force=moved
        )
        summary = ("reported " if moved else "no movement: ") + fresh.description
        return _result(state, now, summary)

    return serving_store_reporter


def _status(serving: ServingStoreResource) -> StoreStatus:
    store = serving.open_reader()
    try:
        return store.status()
    finally:
        store.close()


def _report_freshness(
    instance: dg.DagsterInstance,
    state: ReporterState,
    fresh: Freshness,
    metadata: dict[str, Any],
    *,
    force: bool,
) -> ReporterState:
    """Report the freshness evaluation when its state changed (or `force`); the new state."""
    if force or fresh.state != state.fresh:
        instance.report_runless_asset_event(freshness_evaluation(fresh, metadata))
    return replace(state, watermark=fresh.watermark, fresh=fresh.state)


def _result(state: ReporterState, now: datetime, summary: str) -> dg.SensorResult:
    return dg.SensorResult(skip_reason=summary, cursor=replace(state, ticked_at=now).dump())


def _metadata(
    status: StoreStatus,
    landed: LogPosition,
    catalog: Catalog,
    previous: ReporterState,
    now: datetime,
) -> dict[str, Any]:
    """What a materialization of serving_store carries."""
    lag = lag_behind(catalog, status.position, landed)
    metadata: dict[str, Any] = {
        "batch_seq": status.position.batch_seq,
        "msg_seq": status.position.msg_seq,
        "last_change_seq": status.last_seq,
        "masters": status.masters,
        "messages_applied": status.messages,
        "lag_messages": lag.messages,
        "lag_exact": lag.exact,
        "landed_batch_seq": landed.batch_seq,
        "landed_msg_seq": landed.msg_seq,
    }
    if previous.reported_at is not None:
        seconds = (now - previous.reported_at).total_seconds()
        if seconds > 0:
            metadata["messages_per_second"] = round(
                (status.messages - previous.messages) / seconds, 3
            )
    if status.committed_at is not None:
        metadata["seconds_since_commit"] = round(
            (now - utc(status.committed_at)).total_seconds(), 3
        )
    return metadata


def lag_behind(catalog: Catalog, applied: LogPosition, landed: LogPosition) -> Lag:
    """How many landed messages follow `applied`, counted from the sealed batches' anchors
    (reading at most LAG_BATCHES_READ of them: beyond, the count is a floor)."""
    if applied >= landed:
        return Lag(0, True)
    if applied.batch_seq == landed.batch_seq:
        return Lag(landed.msg_seq - applied.msg_seq, True)
    messages = landed.msg_seq + 1  # the landed position's own batch, up to it
    between = range(max(applied.batch_seq, 1), landed.batch_seq)
    read = between[:LAG_BATCHES_READ]
    exact = len(read) == len(between)
    for seq in read:
        anchor = catalog.anchor(batch_key(seq))
        if anchor is None:  # not sealed yet: an anomaly, the count is a floor
            exact = False
            continue
        done = applied.msg_seq + 1 if seq == applied.batch_seq else 0
        messages += max(anchor.messages - done, 0)
    return Lag(messages, exact)


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _time(text: str | None) -> datetime | None:
    return utc_from(text) if text else None


def utc_from(text: str) -> datetime:
    return utc(datetime.fromisoformat(text))
