"""sis-live's service on a PostgreSQL serving store (a throwaway cluster, tests/pg.py) while the
feed keeps arriving, the server stopped (`pg_ctl stop -m fast`) and started again: landing and
queue commits go on during the outage, which is logged; the store is retried with backoff and,
once back, catches up to equal the reference over the landed log, every message applied once."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest

from sis_platform.live.config import LiveConfig
from sis_platform.live.service import LiveService
from sis_platform.log.landing import START_POSITION
from sis_platform.serving import ServingWriter, open_writer
from sis_platform.simulator.generator import generate_feed
from tests.live.feed import INVALID
from tests.live.running import BOUND_SECONDS, Place, drained, running
from tests.live.store_view import assert_rows_match_reference
from tests.pg import PASSWORD_VARIABLE, PgCluster, cluster
from tests.reference import reference_for

pytestmark = pytest.mark.cost(40)

CONFIG = LiveConfig(
    group_max_messages=20,
    batch_max_messages=70,
    batch_max_seconds=3600.0,
    idle_wait_seconds=0.2,
    retry_first_seconds=0.05,
    retry_last_seconds=0.5,
)


@pytest.fixture(scope="module")
def pg() -> Iterator[PgCluster]:
    # Its own cluster: the test stops and starts the server, which no other test may share.
    with cluster() as running_cluster:
        yield running_cluster


def _caught_up_with(total: int):
    def done(service: LiveService) -> bool:
        return drained(service) and service.landed_messages >= total

    return done


def test_postgresql_stopped_while_the_feed_arrives_loses_nothing_and_catches_up(
    tmp_path, pg: PgCluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(PASSWORD_VARIABLE, pg.password)
    url = pg.url(pg.new_database())
    place = Place(tmp_path / "data")
    feed = list(generate_feed(41, 300, invalid=INVALID, duplicates=0.02))
    attempts = 0  # stores opened or tried by the service

    def opener() -> ServingWriter:
        nonlocal attempts
        attempts += 1
        return open_writer(url)  # raises ServingUnavailable while the server is down

    caplog.set_level(logging.WARNING, logger="sis_platform.live")
    place.put(feed[:100])
    with running(place, CONFIG, opener) as service:
        assert service.wait_until(_caught_up_with(100), BOUND_SECONDS)
        applied = service.applier.applied
        assert applied == place.zone.catalog.last_position()

        pg.stop()
        try:
            place.put(feed[100:200])
            # Intake goes on: the messages leave the queue and land while the store is down.
            assert service.wait_until(
                lambda s: s.landed_messages >= 200 and s.source.depth() == 0,  # type: ignore[attr-defined]
                BOUND_SECONDS,
            )
            assert place.zone.catalog.last_position() > applied
            assert place.queue.depth() == 0
            # ... and the store is retried with backoff meanwhile.
            tried = attempts
            assert service.wait_until(lambda s: attempts >= tried + 2, BOUND_SECONDS)
            assert not service.applier.available
            assert service.applier.applied != service.landed_to
        finally:
            pg.start()
        place.put(feed[200:])
        assert service.wait_until(_caught_up_with(len(feed)), BOUND_SECONDS)

    outage = [r for r in caplog.records if "serving store unavailable" in r.getMessage()]
    assert len(outage) == 1, [r.getMessage() for r in caplog.records]  # logged once
    assert any("serving store available again" in r.getMessage() for r in caplog.records)

    log = [
        m.message for m in place.zone.catalog.landed_after(START_POSITION, CONFIG.message_limits)
    ]
    # Nothing lost, nothing landed twice (the queue never failed).
    assert Counter(m.message_id for m in log) == Counter(m.message_id for m in feed)
    with open_writer(url) as store:
        status = store.status()
    assert status.position == place.zone.catalog.last_position()
    assert status.messages == len(log)  # every landed message applied once
    with psycopg.connect(url, password=pg.password) as conn:
        assert_rows_match_reference(conn, reference_for(log))
