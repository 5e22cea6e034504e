"""sis-live as Prometheus sees it: a real `sis-live` process on the embedded queue, serving
/metrics on a loopback port, scraped by a real Prometheus server (tests/prometheus.py) while
messages are fed; the server's API then shows every message counted, the latency histogram
holding them, the lake's progress recorded in the store exported, and the lease lost when
another deployment takes it. /healthz turns 503 when the
loop stops going round (a hang injected in a classification, sis_platform/runtime/faults.py),
while the endpoint's own thread goes on answering. The server loads the shipped alert rules
(deploy/prometheus/alerts.yml), and each case sees its alert taken up."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sis_platform.intake.lease import ConsumerLease
from sis_platform.serving import LakeProgress, open_writer
from sis_platform.simulator.generator import generate_feed
from tests.live.processes import start_live, stop
from tests.live.running import Place
from tests.live.test_metrics import NOT_XML, get
from tests.ports import free_port
from tests.prometheus import prometheus

ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"

pytestmark = [pytest.mark.prometheus, pytest.mark.cost(60)]


def _status(url: str) -> int | None:
    """The status a GET of `url` answers; None while nothing accepts there yet."""
    try:
        return get(url)[0]
    except OSError:
        return None


@pytest.mark.timeout(600)
def test_prometheus_scrapes_every_message_counted_and_the_lease_lost(tmp_path: Path) -> None:
    place = Place(tmp_path / "data")
    port = free_port()
    log = tmp_path / "sis-live.log"
    live = start_live(place.root, log, SIS_METRICS_ADDRESS=f"127.0.0.1:{port}")
    try:
        targets = {"sis-live": f"127.0.0.1:{port}"}
        with prometheus(tmp_path / "prometheus", targets, (ALERTS,)) as server:
            server.wait_for(lambda: server.equals("sis_live_lease_holding", 1), "holding")
            assert server.value('up{job="sis-live"}') == 1
            assert server.value("sis_live_lease_fencing_token") == 1
            feed = list(generate_feed(11, 40))
            place.put(feed)
            with place.queue.producer() as producer:
                producer.put(NOT_XML, message_id="poison-1")
            total = len(feed) + 1
            applied = 'sis_live_messages_total{stage="applied"}'
            server.wait_for(lambda: server.equals(applied, total), f"{applied} == {total}")
            assert server.value('sis_live_messages_total{stage="landed"}') == total
            assert server.value("sis_live_put_to_visible_seconds_count") == total
            dead = 'sis_live_outcomes_total{outcome="dead_lettered",reason="not-well-formed"}'
            assert server.value(dead) == 1
            p99 = server.value("histogram_quantile(0.99, sis_live_put_to_visible_seconds_bucket)")
            assert p99 is not None and math.isfinite(p99) and p99 > 0
            rss = server.value('process_resident_memory_bytes{job="sis-live"}')
            assert rss is not None and rss > 0
            server.wait_for(lambda: server.equals("sis_live_ready", 1), "ready")
            # The lake records its progress in the store (as the fold does after a run): the
            # lease holder exports it on its next turn, and the messages it has not folded wait.
            assert server.value("sis_lake_last_fold_step") is None  # nothing recorded yet
            committed = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
            with open_writer(place.url) as store:
                store.record_lake_progress(LakeProgress(3, 0, committed, 5))
            step = "sis_lake_last_fold_step"
            server.wait_for(lambda: server.equals(step, 3), "the lake's progress exported")
            assert server.value("sis_lake_dead_letters_total") == 5
            assert server.value("sis_lake_last_fold_step_timestamp_seconds") == (
                committed.timestamp()
            )
            waited = server.value("sis_lake_lag_seconds")
            assert waited is not None and waited > 0

            # Another deployment whose clock is past the lease's expiry takes it over.
            later = datetime.now(UTC) + timedelta(seconds=120)
            other = ConsumerLease(
                place.zone.catalog.root, "dr@elsewhere:1", 60.0, clock=lambda: later
            )
            assert other.holds(other.acquire())
            server.wait_for(
                lambda: server.equals("sis_live_lease_losses_total", 1), "the lease lost"
            )
            server.wait_for(lambda: server.equals("sis_live_ready", 0), "not ready")
            status, _, reason = get(f"http://127.0.0.1:{port}/readyz")
            assert status == 503 and "standing by" in reason, reason
            assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200
            assert server.value("sis_live_lease_holding") == 0
            # The shipped rule fires on it (deploy/prometheus/alerts.yml; no `for`).
            lost = 'ALERTS{alertname="SisLiveLeaseLost", alertstate="firing"}'
            server.wait_for(lambda: server.equals(lost, 1), "SisLiveLeaseLost firing")
        assert live.poll() is None, log.read_text(errors="replace")[-3000:]
    finally:
        stop(live)


@pytest.mark.timeout(600)
def test_healthz_turns_503_when_the_loop_stops_going_round(tmp_path: Path) -> None:
    place = Place(tmp_path / "data")
    feed = list(generate_feed(5, 3))
    poison = feed[0].message_id
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "sis-live.log"
    live = start_live(
        place.root,
        log,
        SIS_METRICS_ADDRESS=f"127.0.0.1:{port}",
        # The classification of `poison` hangs (faults.HANG_SECONDS, 60 s), under a budget
        # longer than the test waits: the loop stops going round, the process lives on.
        SIS_INJECT_CLASSIFY_FAILURE=f"{poison}:hang",
        SIS_ITEM_BUDGET_SECONDS="55",
        SIS_BATCH_MAX_SECONDS="5",
        SIS_LEASE_SECONDS="15",
        SIS_LIVE_STALL_SECONDS="10",
    )
    try:
        targets = {"sis-live": f"127.0.0.1:{port}"}
        with prometheus(tmp_path / "prometheus", targets, (ALERTS,)) as server:
            server.wait_for(lambda: _status(f"{base}/readyz") == 200, "ready before the hang")
            assert get(f"{base}/healthz")[0] == 200
            place.put(feed)
            server.wait_for(lambda: _status(f"{base}/healthz") == 503, "/healthz 503", 60)
            status, _, reason = get(f"{base}/healthz")
            assert status == 503 and "no progress for" in reason and "bound 10 s" in reason
            assert get(f"{base}/readyz")[0] == 503
            server.wait_for(lambda: server.equals("sis_live_alive", 0), "alive 0 scraped")
            age = server.value("sis_live_heartbeat_age_seconds")
            assert age is not None and age > 10
            # The shipped rule takes it up (pending for its minute before it fires).
            stuck = 'ALERTS{alertname="SisLiveNotProgressing"}'
            server.wait_for(lambda: server.equals(stuck, 1), "SisLiveNotProgressing pending")
        assert live.poll() is None  # alive all along: only the probe says it is stuck
    finally:
        stop(live)
