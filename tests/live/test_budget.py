"""Poison in sis-live ends as it ends in the lake (sis_platform/live/budget.py): an item that
overruns SIS_ITEM_BUDGET_SECONDS (a hang) gets sis-live killed by its watchdog and, after the
restart, is dead-lettered `too-complex` while the other masters of the same and later groups
are applied; a process dying on one master or message (a crash) is restarted until
SIS_QUARANTINE_AFTER deaths, then that master's items or that message are held back
`quarantined`; a fold or classification that raises is quarantined without any death.

sis-live runs in a subprocess (its watchdog SIGKILLs the process it runs in); the test restarts
it as its supervisor would, with the failure still injected (SIS_INJECT_*_FAILURE), so the item
is proved never to be worked on again. The store is then compared with the reference pipeline
over the landed log, told the same facts (ReferenceWithFailures).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sis_platform.domain.fold import (
    ItemKey,
    ItemResult,
    MasterFoldResult,
    MasterState,
    fold_master,
    fold_skipping,
)
from sis_platform.domain.items import Item
from sis_platform.domain.pipeline import (
    DeadLetter,
    LoggedMessage,
    ReferencePipeline,
    classify_message,
    classify_stretch,
    fold_stretch,
    whole_message_dead_letter,
)
from sis_platform.domain.reasons import Outcome, Reason
from sis_platform.live.budget import CLASSIFY, FACTS_FILE, FOLD, Failures
from sis_platform.log.landing import START_POSITION
from sis_platform.runtime.guard import TIMEOUT, InFlightFolder, InFlightRecord
from sis_platform.serving import ServingWriter, open_writer
from tests.domain.sportsdata_fixtures import (
    ASCOT_1430,
    ASCOT_1500,
    GO_SOFT,
    ROMFORD_1912,
    WIN_MARKET,
    event,
    master,
    update,
)
from tests.live.processes import SIGKILLED, finish, start_live
from tests.live.running import BOUND_SECONDS, CONFIG, Place
from tests.live.store_view import assert_store_matches_reference

pytestmark = [pytest.mark.faults, pytest.mark.cost(40)]

POISON = "msg-poison"  # an update of ASCOT_1500: the message (and item) that fails
BUDGET = "0.5"
OVER_BUDGET = "took longer than the per-item budget of 0.5 s (SIS_ITEM_BUDGET_SECONDS)"

# Groups of two: (the masters), (the poison update of 1500, an update of 1430), (a refresh of
# 1500 and an update of it): the poison's group and the one after it.
FEED = [
    ("m-1430", master(event(ASCOT_1430))),
    ("m-1500", master(event(ASCOT_1500))),
    (POISON, update(ASCOT_1500, GO_SOFT)),
    ("u-1430", update(ASCOT_1430, GO_SOFT)),
    ("r-1500", master(event(ASCOT_1500), type="refresh")),
    ("u-1500", update(ASCOT_1500, GO_SOFT)),
]


@dataclass(frozen=True)
class Expected:
    """What earlier failures decided, as the lake would hold them."""

    timed_out: Mapping[ItemKey, str] = field(default_factory=dict)
    held: Mapping[str, tuple[Reason, str]] = field(default_factory=dict)  # message -> why
    quarantined: Mapping[str, str] = field(default_factory=dict)  # master -> detail


class ReferenceWithFailures(ReferencePipeline):
    """The reference pipeline told what the lake knows of failures: timed-out items skipped
    (`fold_skipping`), messages held back whole, quarantined masters' items held back
    (`expected`, which the caller may change between two `process` calls)."""

    def __init__(self, expected: Expected) -> None:
        super().__init__()
        self.expected = expected

    def process(self, messages: list[LoggedMessage]) -> None:  # type: ignore[override]
        classified = classify_stretch(messages, self._copies, classify=self._classify)
        self.record(fold_stretch(classified, self.masters.get, fold=self._fold))

    def _classify(self, message: LoggedMessage) -> list[Item] | DeadLetter:
        held = self.expected.held.get(message.message_id)
        if held is not None:
            return whole_message_dead_letter(message, *held)
        return classify_message(message)

    def _fold(self, master_id: str, state: MasterState | None, items: list[Item]):
        detail = self.expected.quarantined.get(master_id)
        if detail is not None:
            results = [
                ItemResult(
                    i.message_id,
                    i.position,
                    master_id,
                    Outcome.DEAD_LETTERED,
                    None,
                    Reason.QUARANTINED,
                    detail,
                    None,
                )
                for i in items
            ]
            current = state or MasterState(master_id, 0, None)
            return MasterFoldResult(state=current, results=results)

        def part(current: MasterState, some: list[Item]) -> MasterFoldResult:
            return fold_master(master_id, current, some, patches=self._patches)

        return fold_skipping(master_id, state, items, self.expected.timed_out, part)


def _put(place: Place, feed: list[tuple[str, bytes]] = FEED) -> None:
    with place.queue.producer() as producer:
        for message_id, body in feed:
            producer.put(body, message_id=message_id)


def _variables(injected: dict[str, str]) -> dict[str, str]:
    return {
        "SIS_LIVE_GROUP_MAX_MESSAGES": "2",
        "SIS_ITEM_BUDGET_SECONDS": BUDGET,
        "SIS_QUARANTINE_AFTER": "2",
        **injected,
    }


def _killed_run(place: Place, log: Path, variables: dict[str, str]) -> None:
    """One sis-live run that must end SIGKILLed (by its watchdog, or by the injected crash)."""
    code = finish(start_live(place.root, log, **variables), BOUND_SECONDS, log)
    assert code == SIGKILLED, log.read_text(errors="replace")[-4000:]


def _drained(place: Place, store: ServingWriter, feed: list[tuple[str, bytes]] = FEED) -> bool:
    """The whole feed is landed, off the queue and applied to the store."""
    logged = place.zone.catalog.landed_after(START_POSITION, CONFIG.message_limits)
    if {m.message.message_id for m in logged} != {message_id for message_id, _ in feed}:
        return False
    return place.queue.depth() == 0 and store.position() == place.zone.catalog.last_position()


def _run_until_drained(
    place: Place, log: Path, variables: dict[str, str], feed: list[tuple[str, bytes]] = FEED
) -> None:
    """One sis-live run until the whole feed is landed and applied, then stopped (exit 0)."""
    proc = start_live(place.root, log, **variables)
    store = open_writer(place.url)  # its schema is created by whichever opens it first
    try:
        deadline = time.monotonic() + BOUND_SECONDS
        seq = 0
        while not _drained(place, store, feed):
            assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-4000:]
            # Woken by sis-live's commit; the timeout covers a group that adds no change row.
            seq = store.wait_for_changes(seq, timeout=0.5)
    finally:
        store.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    assert finish(proc, BOUND_SECONDS, log) == 0, log.read_text(errors="replace")[-4000:]


def _assert_store_is_reference(
    place: Place, expected: Expected, *, committed_before: str | None = None
) -> None:
    """The store equals the reference told `expected`. With `committed_before` (a message id),
    the log before that message was committed with nothing known of failures (the groups
    before the failing one), so the reference folds that prefix without them: a quarantine
    holds back a master's items from the failing group on, not the ones already applied."""
    logged = [
        m.message for m in place.zone.catalog.landed_after(START_POSITION, CONFIG.message_limits)
    ]
    reference = ReferenceWithFailures(Expected() if committed_before else expected)
    if committed_before is not None:
        cut = [m.message_id for m in logged].index(committed_before)
        reference.process(logged[:cut])
        logged = logged[cut:]
        reference.expected = expected
    reference.process(logged)
    assert_store_matches_reference(place.db, reference)


def _assert_1500_quarantined(place: Place, detail: str) -> None:
    """ASCOT_1500 quarantined at the poison's group with `detail`: every item of it from then
    on held back, the master as it was before (not stale: nothing was folded), the other master
    going on, and the store equal to the reference told so."""
    assert _dead_letters(place) == [
        (POISON, ASCOT_1500, "quarantined", detail),
        ("r-1500", ASCOT_1500, "quarantined", detail),
        ("u-1500", ASCOT_1500, "quarantined", detail),
    ]
    assert _masters(place) == {ASCOT_1430: (2, False), ASCOT_1500: (1, False)}
    _assert_store_is_reference(
        place, Expected(quarantined={ASCOT_1500: detail}), committed_before=POISON
    )


def _dead_letters(place: Place) -> list[tuple[str, str | None, str, str]]:
    store = open_writer(place.url)
    try:
        return [(d.message_id, d.master_id, d.reason, d.detail) for d in store.dead_letters()]
    finally:
        store.close()


def _masters(place: Place) -> dict[str, tuple[int, bool]]:
    """Each master's (version, stale) in the store."""
    conn = sqlite3.connect(f"file:{place.db}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT master_id, version, stale FROM masters").fetchall()
    finally:
        conn.close()
    return {m: (int(v), bool(s)) for m, v, s in rows}


def _markers(place: Place, kind: str) -> list[InFlightRecord]:
    return InFlightFolder(str(place.root / "live" / "inflight" / kind)).records()


def _failures(place: Place) -> Failures:
    return Failures.from_json((place.root / "live" / "inflight" / FACTS_FILE).read_text())


def test_a_fold_item_over_its_budget_kills_sis_live_and_is_dead_lettered_at_the_restart(
    tmp_path,
):
    place = Place(tmp_path / "data")
    _put(place)
    log = tmp_path / "sis-live.log"
    variables = _variables({"SIS_INJECT_FOLD_FAILURE": f"{POISON}:hang"})

    _killed_run(place, log, variables)
    [marker] = _markers(place, FOLD)  # the watchdog named the master and the item
    assert (marker.key, marker.state, marker.message_id, marker.position) == (
        ASCOT_1500,
        TIMEOUT,
        POISON,
        0,
    )

    _run_until_drained(place, log, variables)  # still injected: the item is never folded again
    assert _markers(place, FOLD) == []
    assert _failures(place).timed_out_items == {(POISON, 0): OVER_BUDGET}
    assert _dead_letters(place) == [(POISON, ASCOT_1500, "too-complex", OVER_BUDGET)]
    # The poison's group's other master is applied; 1500 was left stale (it missed an update)
    # until the refresh of the next group, and the update after it applied.
    assert _masters(place) == {ASCOT_1430: (2, False), ASCOT_1500: (3, False)}
    _assert_store_is_reference(place, Expected(timed_out={(POISON, 0): OVER_BUDGET}))


def test_a_classification_over_its_budget_dead_letters_the_message_too_complex(tmp_path):
    place = Place(tmp_path / "data")
    _put(place)
    log = tmp_path / "sis-live.log"
    variables = _variables({"SIS_INJECT_CLASSIFY_FAILURE": f"{POISON}:hang"})

    _killed_run(place, log, variables)
    [marker] = _markers(place, CLASSIFY)
    assert (marker.key, marker.state) == (POISON, TIMEOUT)

    _run_until_drained(place, log, variables)
    assert _dead_letters(place) == [(POISON, None, "too-complex", OVER_BUDGET)]
    assert _masters(place) == {ASCOT_1430: (2, False), ASCOT_1500: (3, False)}
    _assert_store_is_reference(place, Expected(held={POISON: (Reason.TOO_COMPLEX, OVER_BUDGET)}))


def test_sis_live_dying_on_a_master_quarantines_it_after_the_threshold_and_goes_on(tmp_path):
    place = Place(tmp_path / "data")
    _put(place)
    log = tmp_path / "sis-live.log"
    variables = _variables({"SIS_INJECT_FOLD_FAILURE": f"{POISON}:crash"})

    for _ in range(2):  # SIS_QUARANTINE_AFTER deaths on the same master, not more
        _killed_run(place, log, variables)
    _run_until_drained(place, log, variables)

    _assert_1500_quarantined(place, "fold failed 2 times: sis-live died folding it")


def test_sis_live_dying_classifying_a_message_holds_it_back_after_the_threshold(tmp_path):
    place = Place(tmp_path / "data")
    _put(place)
    log = tmp_path / "sis-live.log"
    variables = _variables({"SIS_INJECT_CLASSIFY_FAILURE": f"{POISON}:crash"})

    for _ in range(2):
        _killed_run(place, log, variables)
    _run_until_drained(place, log, variables)

    detail = "its Python worker died classifying it 2 times"
    assert _dead_letters(place) == [(POISON, None, "quarantined", detail)]
    assert _masters(place) == {ASCOT_1430: (2, False), ASCOT_1500: (3, False)}
    _assert_store_is_reference(place, Expected(held={POISON: (Reason.QUARANTINED, detail)}))


def test_a_fold_that_raises_quarantines_its_master_after_the_threshold_without_a_death(
    tmp_path,
):
    place = Place(tmp_path / "data")
    _put(place)
    log = tmp_path / "sis-live.log"
    _run_until_drained(place, log, _variables({"SIS_INJECT_FOLD_FAILURE": f"{POISON}:raise"}))

    detail = _dead_letters(place)[0][3]
    assert detail.startswith("fold failed 2 times: ZeroDivisionError: injected failure on ")
    _assert_1500_quarantined(place, detail)


def test_a_classification_that_raises_dead_letters_the_message_quarantined_at_once(tmp_path):
    place = Place(tmp_path / "data")
    _put(place)
    log = tmp_path / "sis-live.log"
    _run_until_drained(place, log, _variables({"SIS_INJECT_CLASSIFY_FAILURE": f"{POISON}:raise"}))

    [(message_id, master_id, reason, detail)] = _dead_letters(place)
    assert (message_id, master_id, reason) == (POISON, None, "quarantined")
    assert detail.startswith("classification raised ZeroDivisionError: ")
    assert not (place.root / "live" / "inflight" / FACTS_FILE).exists()  # no death, no fact
    _assert_store_is_reference(place, Expected(held={POISON: (Reason.QUARANTINED, detail)}))


def _hostile_feed(fifo: Path) -> list[tuple[str, bytes]]:
    """A message of each hostile class (docs/bounds.md), between a master and a valid master
    and update of another event after them; with what each ends as."""
    declarations = " " + " ".join(f'xmlns:n{i}="urn:n:{i}"' for i in range(150_000))
    attributes = " ".join(f'a{i}=""' for i in range(24_000))
    price = "<replace sel=\"/event/market[@id='WIN']/selection[@id='7']/price/@num\">{}</replace>"
    return [
        ("m-1430", master(event(ASCOT_1430))),
        ("fifo", f'<!DOCTYPE x [<!ENTITY % e SYSTEM "{fifo}"> %e;]>'.encode() + GO_SOFT_1430),
        ("attributes", update(ASCOT_1430, f'<add sel="/event"><x {attributes}/></add>')),
        ("children", update(ASCOT_1430, '<add sel="/event"><x>' + "<y/>" * 200_000 + "</x></add>")),
        ("ids", update(" ".join(f"ID{i}" for i in range(20_000)), GO_SOFT)),
        (
            "oversize",
            update(ASCOT_1430, f'<replace sel="/event/@name">{"x" * 4_200_000}</replace>'),
        ),
        ("ns-master", master(event(ROMFORD_1912), extra=declarations)),
        ("ns-update", update(ASCOT_1430, GO_SOFT * 40, extra=declarations)),
        (
            "big-master",
            master(event("BIG-1", markets=WIN_MARKET.replace('num="7"', f'num="{2**63}"'))),
        ),
        ("price", update(ASCOT_1430, price.format(2**63))),
        ("xpath", update(ASCOT_1430, '<replace sel="//market/@status">x</replace>')),
        ("m-1500", master(event(ASCOT_1500))),
        ("u-1500", update(ASCOT_1500, GO_SOFT)),
    ]


GO_SOFT_1430 = update(ASCOT_1430, GO_SOFT)


@pytest.mark.timeout(600)
def test_every_hostile_class_ends_dead_lettered_and_a_later_master_is_applied(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # what a DOCTYPE's external entity would block on, were it ever opened
    feed = _hostile_feed(fifo)
    place = Place(tmp_path / "data")
    _put(place, feed)
    _run_until_drained(place, tmp_path / "sis-live.log", {}, feed)

    ends = {message_id: reason for message_id, _, reason, _ in _dead_letters(place)}
    assert ends == {
        "fifo": "not-well-formed",
        "attributes": "too-complex",
        "children": "too-complex",
        "ids": "too-complex",
        "oversize": "too-large",
        "ns-master": "too-complex",
        "ns-update": "too-complex",
        "big-master": "schema-invalid",
        "price": "invalid-result",
        "xpath": "master-stale",
    }
    details = {message_id: detail for message_id, _, _, detail in _dead_letters(place)}
    assert "(SIS_MAX_NAMESPACES)" in details["ns-master"]
    assert "(SIS_MAX_NAMESPACES)" in details["ns-update"]
    # The event after the hostile messages is applied, master and update; 1430's bad price
    # left it stale, as a failed patch does.
    assert _masters(place) == {ASCOT_1430: (1, True), ASCOT_1500: (2, False)}
    _assert_store_is_reference(place, Expected())
