"""The shipped Grafana dashboard (deploy/grafana/sis-live.json) over real data, without Grafana:
a real `sis-live` on the embedded queue, fed by the simulator's messages and one poison message,
scraped every second by a real Prometheus (tests/prometheus.py); every target of every panel,
with Grafana's variables substituted as Grafana would, evaluated through /api/v1/query_range
draws at least one line; and Prometheus's own graph page, in headless Chromium, draws each
panel with series in it (sis_platform/testing/dashboard.py, which scripts/dashboard_snapshot.py
runs against a deployment's Prometheus)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sis_platform.serving import LakeProgress, open_writer
from sis_platform.simulator.generator import generate_feed
from sis_platform.testing.dashboard import Window, evaluate, panels, snapshot, substitute
from tests.live.processes import start_live, stop
from tests.live.running import Place
from tests.live.test_metrics import NOT_XML
from tests.ports import free_port
from tests.prometheus import SCRAPE_SECONDS, prometheus

# The panels with no data in a healthy run until the lake commits its first fold step.
EMPTY_BEFORE_THE_LAKE = {
    "Lake lag (oldest unfolded message, sealed batches waiting)",
    "Lake dead letters per second and last fold step",
}


def test_grafana_variables_are_substituted_as_grafana_does() -> None:
    window = Window(start=1000.0, end=1900.0, step=2.0, scrape_seconds=15.0)
    expr = "rate(x[$__rate_interval]) + rate(y[${__interval}]) + z[$__range] + [[__range_s]]"
    assert substitute(expr, window) == "rate(x[60s]) + rate(y[2s]) + z[900s] + 900"
    assert substitute('up{instance=~"$instance"}', window, {"instance": ".*"}) == (
        'up{instance=~".*"}'
    )
    with pytest.raises(ValueError, match="'instance'"):
        substitute('up{instance=~"$instance"}', window)


def test_the_step_follows_the_range_and_never_goes_under_the_scrape_interval() -> None:
    assert Window.last(900, 1.0, end=10_000.0).step == 1.0
    assert Window.last(6 * 3600, 15.0, end=100_000.0).step == 22.0  # 21,600 s over 1,000 points
    assert Window.last(900, 15.0, end=10_000.0).step == 15.0
    aligned = Window.last(900, 15.0, end=10_007.5)  # ends on a multiple of the step
    assert (aligned.start, aligned.end) == (9_105.0, 10_005.0)


@pytest.mark.prometheus
@pytest.mark.browser
@pytest.mark.cost(40)
@pytest.mark.timeout(600)
def test_every_dashboard_query_draws_real_data(tmp_path: Path) -> None:
    dashboard = panels()
    assert len(dashboard) >= 14
    place = Place(tmp_path / "data")
    port = free_port()
    log = tmp_path / "sis-live.log"
    started = time.time()
    live = start_live(place.root, log, SIS_METRICS_ADDRESS=f"127.0.0.1:{port}")
    try:
        with prometheus(tmp_path / "prometheus", {"sis-live": f"127.0.0.1:{port}"}) as server:
            server.wait_for(lambda: server.equals("sis_live_lease_holding", 1), "holding")
            feed = list(generate_feed(11, 40))
            place.put(feed)
            # A dead letter for "Dead letters by reason" (its reason's series appears with it).
            with place.queue.producer() as producer:
                producer.put(NOT_XML, message_id="poison-1")
            # A range's last step may lie up to a step (a scrape here) before now: what the
            # panels are to show must have been scraped a step ago. Scraped before the put (at
            # 0) and after (at the total), the counters and histograms have a rate.
            ago = f"offset {SCRAPE_SECONDS}s"
            applied = f'sis_live_messages_total{{stage="applied"}} {ago}'
            total = len(feed) + 1
            server.wait_for(lambda: server.equals(applied, total), f"{applied} == {total}")
            # Before the lake's first fold step the lake's panels, and only they, are empty:
            # sis-live exports the sis_lake_* series once the lake has recorded its progress
            # (docs/operations.md, "The lake's metrics").
            before = evaluate(
                server.url, Window.last(time.time() - started, SCRAPE_SECONDS), dashboard
            )
            assert {e.panel.title for e in before if not e.drawn} == EMPTY_BEFORE_THE_LAKE
            # They read the row the lake's fold records in the serving store after a run (no
            # lake runs here): written through the store's own API, sis-live (the lease holder)
            # exports it.
            with open_writer(place.url) as store:
                store.record_lake_progress(LakeProgress(3, 0, datetime.now(UTC), 5))
            # rate() and increase() need two samples within their range: the lake's series
            # appear last, so once they are scraped twice every other series has been too.
            scraped = f"count_over_time(sis_lake_dead_letters_total[10m] {ago})"
            server.wait_for(lambda: (server.value(scraped) or 0) >= 2, f"{scraped} >= 2")

            window = Window.last(time.time() - started + 60, SCRAPE_SECONDS)
            evaluated = evaluate(server.url, window, dashboard)
            assert len(evaluated) == sum(len(p.targets) for p in dashboard)
            undrawn = [
                f"{e.panel.title} [{e.target.ref}]: {e.expr} -> {e.series!r:.300}"
                for e in evaluated
                if not e.drawn
            ]
            # With the lake's record every panel has data.
            assert undrawn == [], "\n".join(undrawn)

            shots = snapshot(server.url, tmp_path / "dashboard", window, dashboard)
            assert [s.panel.title for s in shots] == [p.title for p in dashboard]
            for shot in shots:
                # Each graph of the page drew the series its query returned.
                assert len(shot.series) == len(shot.panel.targets), shot
                assert all(n > 0 for n in shot.series), shot
                assert shot.png.stat().st_size > 10_000, shot
            index = (tmp_path / "dashboard" / "index.html").read_text()
            assert all(s.png.name in index for s in shots)
        assert live.poll() is None, log.read_text(errors="replace")[-3000:]
    finally:
        stop(live)
