"""sis-live's metrics and its HTTP endpoint (sis_platform/live/metrics.py, endpoint.py): every
message is counted through its stages and outcomes as the store records them, the latency
histogram holds one observation per applied message, /healthz and /readyz follow the heartbeat
and the lease, label values stay within fixed sets, and a hostile client cannot hold the
endpoint; the lake's progress, lag and dead letters are exported from the lake's record in the
store."""

from __future__ import annotations

import socket
import sqlite3
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sis_platform.intake.lease import ConsumerLease
from sis_platform.live.endpoint import MetricsEndpoint
from sis_platform.live.metrics import OUTCOMES, LiveMetrics, reason_label
from sis_platform.live.service import LiveService
from sis_platform.log.landing.backlog import backlog_after
from sis_platform.runtime.heartbeat import Heartbeat
from sis_platform.serving import LakeProgress, open_writer
from sis_platform.serving.records import GroupCommit, OutcomeRow
from sis_platform.simulator.generator import generate_feed
from tests.live.running import BOUND_SECONDS, CONFIG, Place, drained, running

STALL = 60.0
NOT_XML = b"<event id='1'"  # dead-lettered `not-well-formed`


def get(url: str, accept: str | None = None) -> tuple[int, str, str]:
    """(status, content type, body) of a GET."""
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


@contextmanager
def serving(service: LiveService, metrics: LiveMetrics, **bounds: float) -> Iterator[str]:
    """The endpoint of `service` on a free loopback port: its base URL."""
    metrics.watch(lambda: service.state(STALL))
    endpoint = MetricsEndpoint(
        "127.0.0.1", 0, metrics.registry, lambda: service.health(STALL), **bounds
    )
    endpoint.start()
    try:
        yield endpoint.url
    finally:
        endpoint.close()


def stored_outcomes(place: Place) -> dict[tuple[str, str], int]:
    conn = sqlite3.connect(place.db)
    try:
        rows = conn.execute(
            "SELECT outcome, coalesce(reason, ''), count(*) FROM message_outcomes "
            "GROUP BY outcome, reason"
        ).fetchall()
    finally:
        conn.close()
    return {(OUTCOMES[o], r): n for o, r, n in rows}


@pytest.mark.timeout(300)
def test_every_message_is_counted_through_its_stages_and_outcomes_as_the_store_records(
    tmp_path: Path,
) -> None:
    place = Place(tmp_path)
    feed = list(generate_feed(7, 60))
    place.put(feed)
    with place.queue.producer() as producer:
        producer.put(NOT_XML, message_id="poison-1")
    metrics = LiveMetrics()
    heartbeat = Heartbeat(tmp_path / "run" / "beat", every=0.0)
    with running(place, heartbeat=heartbeat, metrics=metrics) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
        sample = metrics.registry.get_sample_value
        total = len(feed) + 1
        for stage in ("got", "landed", "applied"):
            assert sample("sis_live_messages_total", {"stage": stage}) == total, stage
        assert sample("sis_live_put_to_visible_seconds_count") == total
        assert sample("sis_live_put_to_visible_seconds_sum") > 0
        groups = sample("sis_live_group_messages_count")
        assert groups and sample("sis_live_group_messages_sum") == total
        for stage in ("get", "land", "fold", "queue_commit"):
            assert sample("sis_live_stage_seconds_count", {"stage": stage}) == groups, stage
        assert sample("sis_live_stage_seconds_count", {"stage": "commit"}) >= 1
        recorded = stored_outcomes(place)
        assert recorded[("dead_lettered", "not-well-formed")] == 1
        for (outcome, reason), n in recorded.items():
            labels = {"outcome": outcome, "reason": reason}
            assert sample("sis_live_outcomes_total", labels) == n, labels
        with serving(service, metrics) as base:
            status, kind, text = get(f"{base}/metrics")
            assert status == 200 and kind.startswith("text/plain")
            assert f'sis_live_messages_total{{stage="applied"}} {float(total)}' in text
            assert "sis_live_lease_holding 1.0" in text
            assert "sis_live_lease_fencing_token 1.0" in text
            assert "sis_live_behind_seconds 0.0" in text
            assert "sis_live_source_connected 1.0" in text
            assert "process_resident_memory_bytes" in text
            landed = service.landed_to
            assert f"sis_live_landed_batch {float(landed.batch_seq)}" in text
            assert f"sis_live_applied_message {float(landed.msg_seq)}" in text
            status, kind, text = get(f"{base}/metrics", "application/openmetrics-text")
            assert kind.startswith("application/openmetrics-text")
            assert text.endswith("# EOF\n")
            assert get(f"{base}/healthz")[:1] == (200,)
            status, _, reason = get(f"{base}/readyz")
            assert (status, "consuming and caught up" in reason) == (200, True)
            assert get(f"{base}/nothing")[0] == 404


def scraped(base: str) -> tuple[dict[str, float], dict[str, str]]:
    """Every sample of /metrics by name (unlabelled ones), and each family's type."""
    status, _, text = get(f"{base}/metrics")
    assert status == 200
    families = list(text_string_to_metric_families(text))
    samples = {s.name: s.value for f in families for s in f.samples if not s.labels}
    return samples, {f.name: f.type for f in families}


@pytest.mark.timeout(300)
def test_the_lakes_progress_lag_and_dead_letters_are_exported_from_its_record_in_the_store(
    tmp_path: Path,
) -> None:
    place = Place(tmp_path)
    place.put(list(generate_feed(7, 60)))
    metrics = LiveMetrics(process=False)
    config = replace(CONFIG, batch_max_messages=20, heartbeat_seconds=0.0)
    with running(place, config, metrics=metrics) as service, serving(service, metrics) as base:
        assert service.wait_until(drained, BOUND_SECONDS)
        samples, _ = scraped(base)
        assert not [n for n in samples if n.startswith("sis_lake_")]  # nothing recorded yet
        landed, open_batch = service.landed_to, place.zone.catalog.tail().open
        newest = landed.batch_seq - (1 if open_batch is not None else 0)
        assert newest >= 3

        def exported(step: int) -> bool:
            lake = service.state(STALL).lake
            return lake is not None and lake.progress.fold_step == step

        committed = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
        with open_writer(place.url) as store:  # as the lake's fold records it
            store.record_lake_progress(LakeProgress(4, 2, committed, 3))
        assert service.wait_until(lambda s: exported(4), BOUND_SECONDS)
        # The measure of the lake_lag_within_bounds check.
        oldest = backlog_after(place.zone.catalog, 2).oldest_landed_at
        assert oldest is not None
        before = datetime.now(UTC)
        samples, types = scraped(base)
        after = datetime.now(UTC)
        assert samples["sis_lake_last_fold_step"] == 4
        assert samples["sis_lake_last_folded_batch"] == 2
        assert samples["sis_lake_last_fold_step_timestamp_seconds"] == committed.timestamp()
        assert samples["sis_lake_lag_batches"] == newest - 2
        waited = samples["sis_lake_lag_seconds"]
        assert (before - oldest).total_seconds() <= waited <= (after - oldest).total_seconds()
        assert samples["sis_lake_dead_letters_total"] == 3
        assert types["sis_lake_dead_letters"] == "counter"
        assert types["sis_lake_lag_seconds"] == "gauge"

        with open_writer(place.url) as store:  # the lake has folded every sealed batch
            store.record_lake_progress(LakeProgress(5, newest, committed, 7))
        assert service.wait_until(lambda s: exported(5), BOUND_SECONDS)
        samples, _ = scraped(base)
        assert samples["sis_lake_lag_batches"] == 0
        assert samples["sis_lake_dead_letters_total"] == 7
        if open_batch is None:
            assert samples["sis_lake_lag_seconds"] == 0
        else:  # the open batch's messages wait for its seal
            opened = (before - open_batch.opened_at).total_seconds()
            assert samples["sis_lake_lag_seconds"] >= opened


@pytest.mark.timeout(300)
def test_readyz_says_standing_by_once_another_deployment_takes_the_lease(tmp_path: Path) -> None:
    place = Place(tmp_path)
    place.put(list(generate_feed(3, 20)))
    metrics = LiveMetrics(process=False)
    heartbeat = Heartbeat(tmp_path / "run" / "beat", every=0.0)
    with running(place, heartbeat=heartbeat, metrics=metrics) as service:
        assert service.wait_until(drained, BOUND_SECONDS)
        with serving(service, metrics) as base:
            assert get(f"{base}/readyz")[0] == 200
            # Another deployment whose clock is past the lease's expiry takes it over.
            later = datetime.now(UTC) + timedelta(seconds=120)
            other = ConsumerLease(
                place.zone.catalog.root, "dr@elsewhere:1", 60.0, clock=lambda: later
            )
            assert other.holds(other.acquire())
            assert service.wait_until(lambda s: not s.holding, BOUND_SECONDS)
            # The beat after losing it says so (the loop beats on its way to standing by).
            assert service.wait_until(lambda s: s.health(STALL).reason.count("standing by"), 60)
            status, _, reason = get(f"{base}/readyz")
            assert status == 503 and "standing by for the lease" in reason
            assert get(f"{base}/healthz")[0] == 200  # alive: restarting it would not help
            text = get(f"{base}/metrics")[2]
            assert "sis_live_lease_losses_total 1.0" in text
            assert "sis_live_lease_holding 0.0" in text
            assert "sis_live_ready 0.0" in text


def test_healthz_turns_503_when_the_beat_is_older_than_the_stall_bound() -> None:
    clock = [1000.0]
    heartbeat = Heartbeat(Path("/nonexistent/beat"), clock=lambda: clock[0])  # unwritable: kept
    metrics = LiveMetrics(process=False)
    endpoint = MetricsEndpoint("127.0.0.1", 0, metrics.registry, lambda: heartbeat.health(10.0))
    endpoint.start()
    base = endpoint.url
    try:
        status, _, reason = get(f"{base}/healthz")
        assert status == 503 and "no heartbeat yet" in reason
        heartbeat.beat(holding=True, caught_up=True)
        assert [get(f"{base}/{p}")[0] for p in ("healthz", "readyz")] == [200, 200]
        clock[0] += 10.5  # the loop has not gone round for longer than the bound
        status, _, reason = get(f"{base}/healthz")
        assert status == 503 and "no progress for 10.5 s (bound 10 s" in reason
        assert get(f"{base}/readyz")[0] == 503
    finally:
        endpoint.close()


def test_label_values_come_from_fixed_sets_whatever_a_message_carries() -> None:
    assert reason_label(None) == ""
    assert reason_label("orphan-update") == "orphan-update"
    assert reason_label("x" * 10_000) == "other"
    metrics = LiveMetrics(process=False)

    def row(outcome: str, reason: str | None) -> OutcomeRow:
        return OutcomeRow("m", 0, 0, -1, None, outcome, reason)

    rows = [row("dead-lettered", f"attacker-{i}") for i in range(100)]
    rows += [row("no-such-outcome", None), row("applied", None)]
    metrics.committed(GroupCommit(None, [], {}, [], [], rows), 0.001)  # type: ignore[arg-type]
    series = {
        tuple(sorted(s.labels.items()))
        for family in metrics.registry.collect()
        if family.name == "sis_live_outcomes"
        for s in family.samples
        if s.name == "sis_live_outcomes_total"
    }
    reasons = {dict(labels)["reason"] for labels in series}
    assert reasons == {"", "other"}
    sample = metrics.registry.get_sample_value
    assert sample("sis_live_outcomes_total", {"outcome": "dead_lettered", "reason": "other"}) == 100
    assert sample("sis_live_outcomes_total", {"outcome": "other", "reason": ""}) == 1


def _silent(address: tuple[str, int]) -> socket.socket:
    """A connection that never sends a byte."""
    return socket.create_connection(address, timeout=30)


def _closed_unanswered(conn: socket.socket) -> bool:
    """Whether the server closed `conn` without a byte of answer."""
    try:
        return conn.recv(1024) == b""
    except ConnectionResetError:  # closed with our request unread
        return True


def test_a_client_cannot_hold_the_endpoint_beyond_its_bounds() -> None:
    metrics = LiveMetrics(process=False)
    endpoint = MetricsEndpoint(
        "127.0.0.1",
        0,
        metrics.registry,
        lambda: Heartbeat(Path("/nonexistent")).health(10.0),
        max_connections=2,
        request_seconds=5.0,  # long enough for the third to come while both hold their slots
    )
    endpoint.start()
    address = endpoint.address
    base = endpoint.url
    try:
        held = [_silent(address), _silent(address)]
        # Each is taken by a handler thread once accepted; the next, over the bound, is closed
        # unanswered (recv sees the end of the stream, not an HTTP answer).
        third = _silent(address)
        third.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        assert _closed_unanswered(third)
        # The silent ones are cut at the connection's bound, freeing their slots.
        assert all(_closed_unanswered(c) for c in held)
        for conn in (*held, third):
            conn.close()
        # A client sees its connection cut a moment before the endpoint frees the slot.
        assert endpoint.wait_idle(5.0)
        assert get(f"{base}/metrics")[0] == 200
        # A request line over http.server's bound (65,536 bytes) is refused, not read on.
        long_line = _silent(address)
        long_line.sendall(b"GET /" + b"a" * (65_537 - 5))
        assert long_line.recv(1024).startswith(b"HTTP/1.0 414")
        long_line.close()
        assert get(f"{base}/metrics")[0] == 200
    finally:
        endpoint.close()
