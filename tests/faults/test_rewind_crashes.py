"""Crash anywhere, a fold step that rewinds (invariants 2 and 3): batches already folded are
classified again after a fix, and the step that rewinds their masters is killed in its deletes
and between its deletes and its refold. After the restart the lake equals the reference."""

from __future__ import annotations

import pytest

from sis_platform.domain.limits import Limits
from sis_platform.lake.tables import DEAD_LETTERS, FOLD_STEPS
from sis_platform.simulator.generator import generate_feed
from tests.faults.accounting import assert_log_accounts_for_every_message, logged_messages
from tests.faults.driver import platform_env, run, tick_until_empty
from tests.faults.processes import SIGKILLED, drive
from tests.faults.sequences import B1, B2, REWIND_SEQUENCE
from tests.reference import assert_lake_matches_reference, reference_for

pytestmark = [pytest.mark.faults, pytest.mark.spark, pytest.mark.dagster, pytest.mark.cost(280)]


@pytest.mark.timeout(1800)
def test_fold_killed_while_rewinding_converges_to_the_reference(tmp_path, request):
    from sis_platform.lake.spark.items import log_items
    from sis_platform.resources import config

    data, home = tmp_path / "data", tmp_path / "dagster"
    feed = list(generate_feed(seed=23, messages=80, invalid={}, duplicates=0.0))
    # Before the "fix", the five largest messages are over the size limit: dead-lettered
    # too-large, and the updates of any master among them orphaned.
    limit = sorted(len(m.body) for m in feed)[-5] - 1
    before = {**platform_env(data), "SIS_MAX_MESSAGE_BYTES": str(limit)}
    fixed = platform_env(data)
    resources = config.resources(fixed)
    with resources["queue"].open().producer() as producer:
        for m in feed:
            producer.put(m.body, message_id=m.message_id)
    tick_until_empty(home, before)
    zone = resources["landing"].zone()
    assert zone.catalog.keys() == [B1, B2]

    spark = request.getfixturevalue("spark")
    for key in (B1, B2):
        run(home, before, key)
    lake = resources["lake"].lake(spark)
    assert lake.read(DEAD_LETTERS).where("reason = 'too-large'").count() == 5
    # The backfill with the fix deployed: both batches classified again.
    for key in (B1, B2):
        log_items(
            lake,
            key,
            limits=Limits(max_message_bytes=10 * limit),
            redelivery_limit=5,
            run_id=None,
            landing_root=str(zone.catalog.root),
        )

    for point, runs in REWIND_SEQUENCE:
        code = drive(tmp_path, "run", *runs, crash_at=point)
        assert code == SIGKILLED, f"the run(s) {runs} finished without reaching {point}"
    run(home, fixed, f"{B2}:fold_masters")

    assert_lake_matches_reference(lake, reference_for(logged_messages(zone.catalog)))
    assert_log_accounts_for_every_message(lake, zone)
    assert lake.read(DEAD_LETTERS).where("reason = 'too-large'").count() == 0
    assert [r["fold_step"] for r in lake.read(FOLD_STEPS).orderBy("fold_step").collect()] == [
        1,
        2,
        3,
    ]
