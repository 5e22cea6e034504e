"""The Dagster UI in a real browser (Debian's chromium, headless, driven by Playwright) against
the platform started as `scripts/run.sh` starts it: the asset graph draws every asset, the
feed's `raw_messages` partitions appear, a batch run succeeds, each asset's checks are listed
with their status, a backfill of two existing batches launched from the UI succeeds and
converges (the serving store and the lake equal the reference fold) without leaving a null
fold step as the fold's latest metadata, a batch of the feed that arrives while the backfill's
runs are queued runs ahead of them, and SIGTERM leaves no process running.

Screenshots of each stage go to test-artifacts/ui/ (git-ignored); their paths are printed."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from sis_platform.assets.run_tags import run_batches
from sis_platform.lake.tables import Table
from sis_platform.sensors.batch_runs import FEED_PRIORITY
from sis_platform.serving import StoreNotReady
from sis_platform.simulator.generator import generate_feed
from tests.e2e.sis_run import REPO, RunningPlatform, assert_sigterm_stops_everything
from tests.e2e.sis_run import running_platform as start_platform
from tests.harness import Harness
from tests.live.store_view import assert_store_matches_reference
from tests.modes import harness, serving_db
from tests.reference import assert_lake_matches_reference, reference_for

pytestmark = [
    pytest.mark.dagster,
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.cost(660),
]

CHROMIUM = Path("/usr/bin/chromium")  # Debian's package (scripts/chromium.sh install)
SHOTS = REPO / "test-artifacts" / "ui"
JOB_PAGE = "/locations/sis_platform.definitions/jobs/process_batch"
# Two batches of 20: sis-live seals a batch at SIS_BATCH_MAX_MESSAGES, so the 40 messages the
# simulator publishes at once land as batches 1 and 2 within seconds (a short tail, if any, is
# sealed by age). Each batch is one run, and every run starts its own Spark driver.
MESSAGES = 40
# Published while the backfill's runs are queued: one more batch of the feed.
LATE_MESSAGES = 20
SETTINGS = {"SIS_BATCH_MAX_MESSAGES": "20", "SIS_LIVE_BATCH_SECONDS": "30"}
# Runs start a Spark driver each, one at a time (deploy/dagster.yaml): generous bounds, for a
# 2-core machine that the rest of the suite loads too.
RUNS_SECONDS = 1200
UI_SECONDS = 60
# A check's status in the asset's list of checks.
CHECK_STATUS = re.compile(
    r"^(Succeeded|Failed|Warning|Not evaluated|Skipped|Execution failed|In progress)$"
)


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[RunningPlatform]:
    with start_platform(tmp_path, sim_messages=MESSAGES, settings=SETTINGS) as running:
        yield running


@pytest.fixture
def page(platform: RunningPlatform) -> Iterator[Any]:
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/chromium.sh install (as root)")
    from playwright.sync_api import expect, sync_playwright

    # Assertions wait as long as actions: a page of the UI can take seconds to answer on a
    # loaded machine (Playwright's own default for assertions is 5 s).
    expect.set_options(timeout=UI_SECONDS * 1000)
    SHOTS.mkdir(parents=True, exist_ok=True)
    for stale in SHOTS.glob("*.png"):  # a folder of this run's screenshots only
        stale.unlink()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            page = browser.new_page(viewport={"width": 2000, "height": 1200}, base_url=platform.url)
            page.set_default_timeout(UI_SECONDS * 1000)
            # The UI's first visit offers a newsletter sign-up over the page: skip it wherever
            # it shows up.
            skip = page.get_by_role("button", name="Skip")
            page.add_locator_handler(skip, lambda button: button.click())
            yield page
        finally:
            browser.close()


def shoot(page: Any, name: str) -> None:
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def until_shown(page: Any, path: str, locate: Callable[[Any], Any], timeout: float) -> None:
    """Open `path` and reload it until what `locate` finds on the page is visible: for state the
    page does not poll for itself (new partitions, a backfill's end). Bounded by `timeout`."""
    from playwright.sync_api import expect

    deadline = time.monotonic() + timeout
    page.goto(path)
    while True:
        try:
            expect(locate(page)).to_be_visible(timeout=15_000)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                shoot(page, "timeout")
                raise
        page.reload()


def expand_all_groups(page: Any) -> None:
    """Expand every group of the lineage graph through its context menu (right click on the
    graph's background). The newsletter prompt's handler closes the menu when the prompt shows
    up meanwhile: then open it again."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    item = page.get_by_role("menuitem").filter(has_text="Expand all groups")
    for _ in range(5):
        page.mouse.click(900, 980, button="right")
        try:
            item.click(timeout=10_000)
            return
        except PlaywrightTimeout:
            continue
    shoot(page, "timeout")
    raise AssertionError("the lineage graph's menu offers no 'Expand all groups'")


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    # Bounded polling of run records in the instance: the daemon offers no event to subscribe
    # to from outside its process.
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(2.0)


class PolarsLake:
    """The lake's tables read by polars (docs/readers.md), in the shape the reference comparison
    reads from Spark: `read(table).collect()` gives the rows as mappings."""

    def __init__(self, base_path: str) -> None:
        self.base_path = base_path

    def read(self, table: Table) -> Any:
        import polars as pl

        rows = pl.read_delta(f"{self.base_path}/{table.name}").to_dicts()

        class Rows:
            def collect(self) -> list[dict[str, Any]]:
                return rows

        return Rows()


def batch_runs(instance: dg.DagsterInstance, **tags: str) -> list[dg.RunRecord]:
    return list(instance.get_run_records(dg.RunsFilter(job_name="process_batch", tags=tags)))


def every_batch_processed(h: Harness, instance: dg.DagsterInstance) -> bool:
    """Every landed batch has a successful run, none failed, and the serving store holds the
    whole landed log."""
    keys = h.zone.catalog.keys()
    records = batch_runs(instance)
    failed = [r for r in records if r.dagster_run.status == dg.DagsterRunStatus.FAILURE]
    assert not failed, f"run {failed[0].dagster_run.run_id} failed"
    done = [
        batches
        for r in records
        if r.dagster_run.status == dg.DagsterRunStatus.SUCCESS
        and (batches := run_batches(r.dagster_run.tags)) is not None
    ]
    try:
        store = h.open_reader()
    except StoreNotReady:  # sis-live has not created it yet
        return False
    try:
        caught_up = store.position() == h.zone.catalog.last_position()
    finally:
        store.close()
    every_batch_run = all(any(b.covers(key) for b in done) for key in keys)
    return len(keys) >= 2 and every_batch_run and caught_up


def test_ui_shows_the_platform_and_a_backfill_from_it_converges(platform, page, monkeypatch):
    from playwright.sync_api import expect

    h = harness(platform.data, "live", SETTINGS)
    defs = h.defs.resolve_asset_graph()
    assets = sorted(key.to_user_string() for key in defs.get_all_asset_keys())
    checks = sorted(defs.asset_check_keys, key=lambda k: (k.asset_key.to_user_string(), k.name))

    # Lineage: every asset of the definitions is a node of the graph, its groups expanded.
    page.goto("/asset-groups")
    expect(page.get_by_text("Global asset lineage")).to_be_visible()
    graph = page.locator("svg").filter(has_text="message_log").first
    expect(graph).to_be_visible()
    expand_all_groups(page)
    # The expanded graph is taller than the page, and nodes outside the view are not drawn:
    # zoomed out until every group fits.
    zoom_out = page.get_by_role("button", name="zoom_out")
    for _ in range(5):
        zoom_out.click()
    for name in assets:
        expect(page.locator("svg").get_by_text(name, exact=True).first).to_be_visible()
    shoot(page, "01-lineage")

    # The feed's batches appear as raw_messages partitions once the daemon's sensor registers
    # what sis-live sealed.
    until_shown(
        page,
        "/assets/raw_messages?view=partitions",
        lambda p: p.get_by_text("0000000002", exact=True).first,
        RUNS_SECONDS,
    )
    shoot(page, "02-raw-messages-partitions")

    # The runs are awaited in the instance with the browser on a blank page: an open page of
    # the UI polls the webserver, which costs the machine a third of a core meanwhile.
    monkeypatch.setenv("DAGSTER_HOME", str(platform.home))
    instance = dg.DagsterInstance.get()
    page.goto("about:blank")
    wait_for(lambda: every_batch_processed(h, instance), RUNS_SECONDS, "every batch's run")
    first_two = sorted(h.zone.catalog.keys())[:2]

    # The batch runs succeeded, as the runs page shows.
    page.goto("/runs")
    rows = page.locator("[class*='RunsFeedRow_rowGrid']")  # the runs list's rows
    row = rows.filter(has_text="process_batch").filter(has_text="Success")
    expect(row.first).to_be_visible()
    shoot(page, "03-runs")

    # Every check is listed on its asset's page with a status (the list's words; the detail
    # pane says Passed for a check that succeeded), and the hash chain's has passed.
    for key in checks:
        page.goto(f"/assets/{key.asset_key.to_user_string()}?view=checks&checkDetail={key.name}")
        # The list shortens long names in the middle; the selected check's pane shows it whole.
        expect(page.get_by_text(key.name, exact=True).filter(visible=True).first).to_be_visible()
        page.get_by_role("textbox", name="Filter checks").fill(key.name)
        expect(page.get_by_text(CHECK_STATUS).filter(visible=True).first).to_be_visible()
    shoot(page, "04-checks")
    until_shown(
        page,
        "/assets/raw_messages?view=checks&checkDetail=hash_chain_intact",
        lambda p: p.get_by_text("Passed", exact=True).first,
        UI_SECONDS * 2,
    )
    shoot(page, "05-hash-chain-check")

    # A backfill of two existing batches from the job's page: process_batch for each.
    page.goto(JOB_PAGE)
    page.get_by_role("button", name=re.compile("Materialize all")).click()
    dialog = page.locator(".dagster-dialog")
    dialog.get_by_text("Select a partition or create one").click()
    for key in first_two:
        page.get_by_role("menuitem", name=key).click()
    page.keyboard.press("Escape")  # closes the partition picker, not the dialog
    expect(dialog.get_by_text("2 partitions")).to_be_visible()
    shoot(page, "06-backfill-dialog")
    dialog.get_by_role("button", name="Launch backfill").click()
    toast = page.get_by_text(re.compile(r"Created backfill \w+"))
    expect(toast).to_be_visible()
    backfill_id = re.search(r"Created backfill (\w+)", toast.inner_text()).group(1)
    page.goto("about:blank")  # while its runs are awaited in the instance

    def backfill_runs() -> list[dg.RunRecord]:
        return batch_runs(instance, **{"dagster/backfill": backfill_id})

    # The feed goes on meanwhile: its next batch must not wait behind the whole backfill.
    landed = set(h.zone.catalog.keys())
    with h.resources["queue"].open().producer() as producer:
        for m in generate_feed(seed=3, messages=LATE_MESSAGES):
            producer.put(m.body, message_id=m.message_id)
    wait_for(
        lambda: bool(set(h.zone.catalog.keys()) - landed), RUNS_SECONDS, "the late batch to land"
    )
    (late_batch,) = set(h.zone.catalog.keys()) - landed

    def late_runs() -> list[dg.RunRecord]:
        return batch_runs(instance, **{"dagster/partition": late_batch})

    wait_for(lambda: bool(late_runs()), RUNS_SECONDS, f"batch {late_batch}'s run to be requested")
    started = [r for r in backfill_runs() if r.start_time is not None]
    assert len(started) < len(first_two), (
        "the test's premise failed: every backfill run had started before the late batch's "
        "run was requested, so the queue's order cannot be seen"
    )

    def backfill_done() -> bool:
        runs = backfill_runs()
        return len(runs) == len(first_two) and all(r.dagster_run.is_finished for r in runs)

    wait_for(backfill_done, RUNS_SECONDS, f"backfill {backfill_id}'s runs")
    runs = backfill_runs()
    assert sorted(r.dagster_run.tags["dagster/partition"] for r in runs) == first_two
    assert {r.dagster_run.status for r in runs} == {dg.DagsterRunStatus.SUCCESS}
    # The run queue started the feed's run (at its priority) before the backfill's last run.
    wait_for(
        lambda: all(r.start_time is not None for r in late_runs()),
        RUNS_SECONDS,
        f"batch {late_batch}'s run to start",
    )
    (late_run,) = late_runs()
    assert late_run.dagster_run.tags.items() >= FEED_PRIORITY.items()
    assert late_run.start_time < max(r.start_time for r in runs), (
        f"batch {late_batch}'s run waited behind every run of backfill {backfill_id}"
    )
    # The backfill's page says so: its two partitions targeted, none in progress, two
    # succeeded, none failed.
    until_shown(
        page,
        f"/runs/b/{backfill_id}",
        lambda p: p.get_by_text("100% completed").first,
        UI_SECONDS * 2,
    )
    row = page.get_by_role("row").filter(has_text="process_batch_partition_set")
    expect(row.get_by_role("cell")).to_have_text([re.compile("process_batch"), "2", "0", "2", "0"])
    shoot(page, "07-backfill")
    wait_for(lambda: every_batch_processed(h, instance), RUNS_SECONDS, "the feed's runs")

    # Converged: the serving store and the lake's tables equal the reference fold of the log.
    ref = reference_for(h.logged_messages())
    assert_store_matches_reference(serving_db(h), ref)
    assert_lake_matches_reference(PolarsLake(h.resources["lake"].base_path), ref)

    # The fold's latest materialization says which step the masters are at: a backfill that
    # folded nothing new must not leave a null step as the fold's latest metadata.
    event = instance.get_latest_materialization_event(dg.AssetKey("master_documents"))
    assert event is not None and event.asset_materialization is not None
    fold_step = event.asset_materialization.metadata.get("fold_step")
    assert fold_step is not None and fold_step.value is not None, (
        event.asset_materialization.metadata
    )
    page.goto("/assets/master_documents")
    expect(page.get_by_text("fold_step").first).to_be_visible()
    shoot(page, "08-master-documents")

    assert_sigterm_stops_everything(platform)
