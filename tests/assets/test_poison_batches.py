"""Poison batches through the real assets: a batch holding messages at and over the resource bounds
completes every step, each poison ends as its dead letter or as a correct model row, and the next
normal batch still folds and reaches the model.

Many ids: two updates within the ids and split-size bounds whose items add up to more than one Arrow
chunk (lake/spark/arrow.py), one over the ids bound. Large numbers: prices that 32-bit columns and a
double could not hold. Every other hostile class of docs/bounds.md beside them: a DOCTYPE naming a
FIFO, RELAX NG blow-ups (attributes, children), a selector outside the grammar, a body over the
size bound (moved aside at intake), and namespace-declaration floods (on a master's and on an
update's root).
"""

from __future__ import annotations

import dataclasses
import os

import pytest

from sis_platform.domain.limits import DEFAULT_LIMITS
from sis_platform.lake.spark.arrow import MAX_BATCH_BYTES
from sis_platform.lake.tables import (
    DEAD_LETTERS,
    EVENTS,
    MESSAGE_ITEMS,
    MODEL_FAILURES,
    SELECTIONS,
)
from sis_platform.log.landing.rows import MovedAside
from tests.assets.test_process_batch import _land
from tests.domain.sportsdata_fixtures import ASCOT_1430, GO_SOFT, event, master, update
from tests.harness import Harness, received

pytestmark = [pytest.mark.spark, pytest.mark.dagster, pytest.mark.cost(340)]

INT64_MAX = 2**63 - 1
# Masters named by the updates within the ids bound, and the size of the one attribute value
# each sets in them: the two updates' items add up to more than one Arrow chunk, each update's
# within the split-size bound.
MANY = DEFAULT_LIMITS.max_ids
NAME_CHARS = MAX_BATCH_BYTES // MANY // 2 + 32 * 1024
# An update naming this many ids measured 126 KB and split into gigabytes of items.
TOO_MANY = 20_000

BIG_PRICES = (
    '<market id="WIN" type="win" status="open" places="2">'
    '<selection id="1" number="1" name="One" status="runner">'
    f'<price num="{2**31}" den="1"/></selection>'
    f'<selection id="2" number="{INT64_MAX}" name="Two" status="runner">'
    f'<price num="{INT64_MAX}" den="1"/></selection>'
    f'<selection id="3" number="3" name="Three" status="runner">'
    f'<price num="{INT64_MAX}" den="{INT64_MAX - 1}"/></selection>'
    "</market>"
)
NEW_PRICE = "<replace sel=\"/event/market[@id='WIN']/selection[@id='1']/price/@num\">4</replace>"


def _many_ids() -> list[str]:
    return [f"MANY-{i:03d}" for i in range(MANY)]


XPATH_MASTER = "XPATH-1"


def _hostile(h: Harness, fifo: str) -> dict[str, object]:
    """A message of each other hostile class, by what it ends as (the xpath one's master first)."""
    declarations = " " + " ".join(f'xmlns:n{i}="urn:n:{i}"' for i in range(150_000))
    attributes = " ".join(f'a{i}=""' for i in range(24_000))
    oversize = received(
        update(ASCOT_1430, f'<replace sel="/event/@name">{"x" * 4_200_000}</replace>')
    )
    return {
        "not-well-formed": received(
            f'<!DOCTYPE x [<!ENTITY % e SYSTEM "{fifo}"> %e;]>'.encode()
            + update(ASCOT_1430, GO_SOFT)
        ),
        "too-complex attributes": received(
            update(ASCOT_1430, f'<add sel="/event"><x {attributes}/></add>')
        ),
        "too-complex children": received(
            update(ASCOT_1430, '<add sel="/event"><x>' + "<y/>" * 200_000 + "</x></add>")
        ),
        "too-complex namespaces master": received(master(event("NS-1"), extra=declarations)),
        "too-complex namespaces update": received(
            update(ASCOT_1430, GO_SOFT * 40, extra=declarations)
        ),
        "too-large": MovedAside(
            dataclasses.replace(oversize, body=b""), h.zone.writer.move_aside(oversize.body)
        ),
        "master": received(master(event(XPATH_MASTER, markets=""))),
        "invalid-attribute-value": received(
            update(XPATH_MASTER, '<replace sel="//market/@status">x</replace>')
        ),
    }


def test_a_poison_batch_completes_and_the_next_batch_still_reaches_the_model(tmp_path, spark):
    from pyspark.sql import functions as F

    h = Harness(tmp_path / "data")
    ids = _many_ids()
    within = [
        received(update(" ".join(ids), f'<replace sel="/event/@name">{c * NAME_CHARS}</replace>'))
        for c in "NM"
    ]
    over = received(update(" ".join(f"OVER-{i:05d}" for i in range(TOO_MANY)), GO_SOFT))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # what a DOCTYPE's external entity would block on, were it ever opened
    hostile = _hostile(h, str(fifo))
    poison, normal = _land(
        h,
        [
            received(master(*(event(m, markets="") for m in ids))),
            received(master(event(ASCOT_1430, markets=BIG_PRICES))),
            *within,
            over,
            *hostile.values(),
        ],
        [
            received(update(f"{ids[0]} {ASCOT_1430}", GO_SOFT)),
            received(update(ASCOT_1430, NEW_PRICE)),
        ],
    )

    first = h.run(poison)  # every step succeeds (Harness.run asserts it)
    lake = h.lake(spark)

    # Many ids: the updates within the bounds split into one item per master, more bytes than
    # one Arrow chunk holds, and every master applied both.
    items = lake.read(MESSAGE_ITEMS).where(F.col("message_id").isin([m.message_id for m in within]))
    count, payload = items.agg(F.count("*"), F.sum(F.length("payload"))).first()
    assert count == 2 * MANY and payload > MAX_BATCH_BYTES
    long_names = lake.read(EVENTS).where(F.col("name") == "M" * NAME_CHARS)
    assert sorted(r["master_id"] for r in long_names.select("master_id").collect()) == ids
    # ... and the one over the bound is dead-lettered as a whole message, never split.
    [letter] = lake.read(DEAD_LETTERS).where(F.col("message_id") == over.message_id).collect()
    assert letter["reason"] == "too-complex" and letter["master_id"] is None
    assert f"{TOO_MANY} ids, over the limit of {MANY} (SIS_MAX_IDS)" in letter["detail"]

    # Every other hostile class ends as its dead letter, each with its reason.
    message_ids = {_message_id(m): end.split()[0] for end, m in hostile.items() if end != "master"}
    letters = lake.read(DEAD_LETTERS).where(F.col("message_id").isin(list(message_ids)))
    assert {r["message_id"]: r["reason"] for r in letters.collect()} == message_ids
    namespaces = [
        r["detail"]
        for r in letters.collect()
        if r["message_id"] in {_message_id(hostile[k]) for k in hostile if "namespaces" in k}
    ]
    assert len(namespaces) == 2 and all("(SIS_MAX_NAMESPACES)" in d for d in namespaces)

    # Large numbers: beyond 32 bits and up to the 64-bit bound, held exactly.
    prices = {
        r["selection_id"]: (r["number"], r["price_num"], r["price_den"], str(r["price_decimal"]))
        for r in lake.read(SELECTIONS).where(F.col("master_id") == ASCOT_1430).collect()
    }
    assert prices == {
        "1": (1, 2**31, 1, "2147483649.000000"),
        "2": (INT64_MAX, INT64_MAX, 1, "9223372036854775808.000000"),
        "3": (3, INT64_MAX, INT64_MAX - 1, "2.000000"),
    }
    assert lake.read(MODEL_FAILURES).count() == 0
    model = first.asset_materializations_for_node("interpreted_model")
    assert {m.metadata["masters_failed"].value for m in model} == {0}
    assert {m.metadata["masters_refreshed"].value for m in model} == {MANY + 2}

    # The next batch folds and reaches the model.
    h.run(normal)
    events = {r["master_id"]: r for r in lake.read(EVENTS).collect()}
    assert events[ids[0]]["going"] == "soft" and events[ids[0]]["version"] == 4
    assert events[ASCOT_1430]["going"] == "soft"
    [one] = (
        lake.read(SELECTIONS)
        .where((F.col("master_id") == ASCOT_1430) & (F.col("selection_id") == "1"))
        .collect()
    )
    assert (one["price_num"], str(one["price_decimal"])) == (4, "5.000000")


def _message_id(message: object) -> str:
    if isinstance(message, MovedAside):
        return message.message.message_id
    return message.message_id  # type: ignore[attr-defined]
