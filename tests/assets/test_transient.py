"""A transient failure is retried with backoff and never dead-letters a valid message
(invariant 4, poison vs transient): here the landing storage is unavailable for a batch's run."""

from __future__ import annotations

import pytest

from sis_platform.lake.tables import DEAD_LETTERS, MESSAGE_OUTCOMES
from tests.domain.sportsdata_fixtures import ASCOT_1430, GO_SOFT, event, master, update
from tests.harness import Harness, received
from tests.reference import assert_lake_matches_reference, reference_for

pytestmark = [
    pytest.mark.spark,
    pytest.mark.dagster,
    pytest.mark.usefixtures("no_retry_backoff"),
    pytest.mark.cost(100),
]


def test_unavailable_storage_is_retried_then_fails_loudly_without_dead_letters(tmp_path, spark):
    h = Harness(tmp_path / "data")
    batch = [
        received(master(event(ASCOT_1430))),
        received(update(ASCOT_1430, GO_SOFT)),
    ]
    key = h.zone.writer.land(batch).key
    h.instance.add_dynamic_partitions("batches", [key])
    landed = h.zone.catalog.batch_path(key)
    away = landed.with_name(landed.name + ".unmounted")
    landed.rename(away)  # the landing storage is unreachable

    failed = h.defs.resolve_job_def("process_batch").execute_in_process(
        partition_key=key, instance=h.instance, raise_on_error=False
    )
    assert not failed.success
    retries = [
        e.step_key
        for e in h.instance.all_logs(failed.run_id)
        if e.dagster_event is not None and e.dagster_event.event_type_value == "STEP_UP_FOR_RETRY"
    ]
    assert retries == ["raw_messages"] * 3  # the retry policy's three (its backoff skipped)
    lake = h.lake(spark)
    for table in (DEAD_LETTERS, MESSAGE_OUTCOMES):
        assert not lake.exists(table) or lake.read(table).count() == 0

    away.rename(landed)  # storage is back; the run is retried (re-executed) and all applies
    h.run(key)
    assert_lake_matches_reference(lake, reference_for(h.logged_messages()))
    assert lake.read(DEAD_LETTERS).count() == 0
