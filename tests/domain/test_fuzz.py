"""Property-based fuzzing of the message pipeline: parse, validate, split, fold and interpret.

Realistic messages from the feed simulator are mutated the way a broken upstream or an attacker
would (bytes flipped, cut, repeated; hostile XML spliced in: a DOCTYPE naming a FIFO, undeclared
entities, deep nesting, attribute floods, long id lists, XPath selectors that nest functions,
numbers past 64 bits, xs:integer lexical forms) and each one is run through the reference
pipeline on top of a day's worth of real masters, with tight resource bounds. Every message must
reach an end state (applied, filtered or dead-lettered with a reason; one result per listed id),
every applied version must be a valid master within the bounds that the interpretation reads
without error, and nothing may open a file because of a message's content.

CI runs a fixed, derandomized set of examples (a few thousand). A longer, randomized run:
`SIS_FUZZ_EXAMPLES=200000 SIS_FUZZ_RANDOM=1 .venv/bin/python -m pytest tests/domain/test_fuzz.py`
(docs/testing.md).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree

from sis_platform.domain.interpret import interpret
from sis_platform.domain.items import Item, split_message
from sis_platform.domain.limits import Limits
from sis_platform.domain.messages import parse_message
from sis_platform.domain.pipeline import LoggedMessage, MessageResult, ReferencePipeline
from sis_platform.domain.reasons import Outcome, Reason
from sis_platform.domain.schema import validate_event
from sis_platform.simulator.generator import generate_feed

# Tight bounds, so that mutations cross them often; the realistic seeds stay well within.
LIMITS = Limits(
    max_message_bytes=256 * 1024,
    max_elements=2_000,
    max_depth=16,
    max_attributes=24,
    max_children=400,
    max_ids=40,
    max_patch_operations=100,
    max_selector_length=256,
    max_selector_steps=12,
    item_budget_seconds=5.0,
)
EXAMPLES = int(os.environ.get("SIS_FUZZ_EXAMPLES", "1500"))
RANDOMIZED = os.environ.get("SIS_FUZZ_RANDOM") == "1"
INT64_MAX = 2**63 - 1

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not RANDOMIZED,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@cache
def _base() -> tuple[ReferencePipeline, tuple[bytes, ...]]:
    """The state after a realistic prefix of the feed, and the messages the fuzzer mutates."""
    feed = list(generate_feed(seed=11, messages=600))
    pipeline = ReferencePipeline(limits=LIMITS)
    pipeline.process(LoggedMessage(m.message_id, m.body) for m in feed[:400])
    seeds = tuple(
        m.body for m in feed[400:] if m.kind in ("update", "master-new", "master-refresh")
    )
    return pipeline, seeds


@pytest.fixture(scope="module")
def fifo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A FIFO that would block whoever opened it for reading (no writer ever comes)."""
    path = tmp_path_factory.mktemp("fuzz") / "trap.fifo"
    os.mkfifo(path)
    return path


def _nobody_reads(fifo: Path) -> bool:
    # Opening a FIFO for writing without blocking fails with ENXIO while no reader has it open.
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as error:
        return error.errno == errno.ENXIO
    os.close(fd)
    return False


def _hostile(fifo: Path) -> list[bytes]:
    """Fragments spliced into messages: each aims at one resource or one parser corner."""
    deep = b"<a>" * 200 + b"</a>" * 200
    nested_count = "count(" * 30 + "//*" + ")" * 30
    return [
        f'<!DOCTYPE sportsdata [<!ENTITY % p SYSTEM "{fifo}"> %p;]>'.encode(),
        f'<!DOCTYPE sportsdata SYSTEM "file://{fifo}">'.encode(),
        b'<!DOCTYPE s [<!ENTITY e "' + b"x" * 100 + b'"><!ENTITY f "&e;&e;&e;&e;">]>',
        b"&undeclared;",
        b"&#0;",
        b"<![CDATA[" + b"]]" * 10 + b"]]>",
        b"<?pi data?><!-- comment -->",
        deep,
        b"<x " + b" ".join(b'a%d="1"' % i for i in range(200)) + b"/>",
        b"<x>" + b"<y/>" * 3_000 + b"</x>",
        f'<replace sel="/event[{nested_count} &gt; 0]/@going">soft</replace>'.encode(),
        b'<replace sel="//*[string-length(.) &gt; 0]//@*">x</replace>',
        b'<replace sel="/event/@going|/event/@going|/event/@going">x</replace>',
        b'<remove sel="/event/market[1e308]"/>',
        b'<replace sel="$v">x</replace>',
        b'<replace sel="/event/market/selection/price/@num">99999999999999999999</replace>',
        b'<replace sel="/event/market/selection/price/@num">+007</replace>',
        b'<replace sel="/event/market/selection/price/@den"> 4 </replace>',
        b'<add sel="/event" type="@going">heavy</add>',
        b'<add sel="/event/market" pos="prepend"><selection id="z" name="Z" status="runner">'
        b'<price num="9223372036854775807" den="1"/></selection></add>',
        b'xmlns:evil="urn:x"',
        "\u202e\ufeff\U0001f3c7".encode(),
        b"\xff\xfe\x00<",
    ]


def _ids(n: int) -> bytes:
    return " ".join(f"FZ-{i:05d}" for i in range(n)).encode()


def _mutations(fifo: Path) -> st.SearchStrategy[Callable[[bytes], bytes]]:
    hostile = _hostile(fifo)

    def at(draw_pos: float, body: bytes) -> int:
        return int(draw_pos * len(body))

    flip = st.tuples(st.floats(0, 1), st.integers(0, 255)).map(
        lambda a: lambda b: b[: at(a[0], b)] + bytes([a[1]]) + b[at(a[0], b) + 1 :]
    )
    cut = st.tuples(st.floats(0, 1), st.integers(1, 64)).map(
        lambda a: lambda b: b[: at(a[0], b)] + b[at(a[0], b) + a[1] :]
    )
    repeat = st.tuples(st.floats(0, 1), st.integers(1, 200), st.integers(2, 50)).map(
        lambda a: (
            lambda b: (
                b[: at(a[0], b)] + b[at(a[0], b) : at(a[0], b) + a[1]] * a[2] + b[at(a[0], b) :]
            )
        )
    )
    splice = st.tuples(st.floats(0, 1), st.sampled_from(hostile)).map(
        lambda a: lambda b: b[: at(a[0], b)] + a[1] + b[at(a[0], b) :]
    )
    # Structure-aware: into the first tag (attributes), or just inside the root (operations).
    into_root = st.sampled_from(hostile).map(lambda h: lambda b: b.replace(b">", b">" + h, 1))
    attribute_flood = st.integers(1, 400).map(
        lambda n: (
            lambda b: b.replace(
                b"<sportsdata ",
                b"<sportsdata " + b" ".join(b'z%d="v"' % i for i in range(n)) + b" ",
                1,
            )
        )
    )
    long_ids = st.integers(1, 500).map(
        lambda n: lambda b: b.replace(b' id="', b' id="' + _ids(n) + b" ", 1)
    )
    truncate = st.floats(0, 1).map(lambda p: lambda b: b[: at(p, b)])
    return st.one_of(flip, cut, repeat, splice, into_root, attribute_flood, long_ids, truncate)


def _element_count(body: bytes) -> int | None:
    """Elements in a well-formed body, counted independently of the platform's parser."""
    try:
        parser = etree.XMLParser(
            resolve_entities=False, no_network=True, load_dtd=False, huge_tree=True
        )
        root = etree.fromstring(body, parser)
    except (etree.XMLSyntaxError, ValueError):
        return None
    return sum(1 for _ in root.iter())


def _check_version_document(master_id: str, document: bytes) -> None:
    root = etree.fromstring(document)
    assert root.tag == "event" and root.get("id") == master_id
    assert validate_event(root) is None
    elements = list(root.iter())
    assert len(elements) <= LIMITS.max_elements
    assert all(len(e.attrib) <= LIMITS.max_attributes for e in elements)
    model = interpret(master_id, document)
    for selection in model.selections:
        for value in (selection.number, selection.price_num, selection.price_den):
            assert value is None or 0 < value <= INT64_MAX
    for market in model.markets:
        assert market.places is None or 0 < market.places <= INT64_MAX


def _run(body: bytes) -> None:
    base, _ = _base()
    pipeline = ReferencePipeline(limits=LIMITS)
    pipeline.masters = dict(base.masters)
    message_id = "ID:" + os.urandom(24).hex()
    pipeline.process([LoggedMessage(message_id, body)])

    assert pipeline.results, "no end state"
    if isinstance(pipeline.results[0], MessageResult):
        (result,) = pipeline.results
        assert result.outcome is Outcome.DEAD_LETTERED
        assert isinstance(result.reason, Reason) and result.detail
        if len(body) > LIMITS.max_message_bytes:
            assert result.reason is Reason.TOO_LARGE
        elements = _element_count(body)
        if elements is not None and elements > LIMITS.max_elements:
            assert result.reason in (Reason.TOO_COMPLEX, Reason.TOO_LARGE)
        return
    # A valid message: one end state per listed id, in id order.
    positions = [r.position for r in pipeline.results]
    assert positions == list(range(len(positions)))
    assert len(positions) <= LIMITS.max_ids
    for r in pipeline.results:
        assert r.message_id == message_id
        assert r.outcome in (Outcome.APPLIED, Outcome.FILTERED, Outcome.DEAD_LETTERED)
        if r.outcome is Outcome.DEAD_LETTERED:
            assert isinstance(r.reason, Reason) and r.detail is not None
    for version in pipeline.versions:
        previous = base.masters.get(version.master_id)
        assert version.version == (previous.version if previous else 0) + 1
        _check_version_document(version.master_id, version.document)


def test_the_realistic_seeds_are_valid_and_applied():
    # The fuzzer starts from real messages: they must fold cleanly, or the mutations prove
    # nothing about valid input.
    _, seeds = _base()
    assert len(seeds) > 100
    for body in seeds[:50]:
        _run(body)


@FUZZ
@given(data=st.data())
def test_every_mutated_message_reaches_an_end_state_within_the_bounds(data, fifo):
    _, seeds = _base()
    body = data.draw(st.sampled_from(seeds), label="seed")
    for mutate in data.draw(st.lists(_mutations(fifo), min_size=1, max_size=4), label="ops"):
        body = mutate(body)
    _run(body)
    assert _nobody_reads(fifo), "a message made the parser open a file"


@FUZZ
@given(
    n_ids=st.integers(1, 3 * LIMITS.max_ids),
    operations=st.integers(1, 150),
    attributes=st.integers(0, 60),
    depth=st.integers(1, 30),
)
def test_generated_updates_at_and_over_every_bound_end_in_an_end_state(
    n_ids, operations, attributes, depth
):
    # Shapes at the bounds rather than random bytes: long id lists, many operations, attribute
    # floods and deep content inside an `add`.
    base, _ = _base()
    # Known masters first, then ids nobody has sent (their items are orphan updates).
    known = sorted(base.masters)
    ids = (known + [f"FZ-{i:05d}" for i in range(n_ids)])[:n_ids]
    content = b"<x" + b"".join(b' a%d="1"' % i for i in range(attributes)) + b">"
    content += b"<y>" * depth + b"</y>" * depth + b"</x>"
    ops = b"".join(
        b'<add sel="/event/market[1]" pos="prepend">' + content + b"</add>"
        if i % 2
        else b'<replace sel="/event/@going">soft</replace>'
        for i in range(operations)
    )
    body = (
        b'<sportsdata category="update" id="'
        + " ".join(ids).encode()
        + b'">'
        + ops
        + b"</sportsdata>"
    )
    _run(body)


def test_splitting_produces_items_linear_in_the_message():
    # An update naming many masters shares one payload (the operations), whatever its id count.
    base, _ = _base()
    ids = sorted(base.masters)[: LIMITS.max_ids]
    body = (
        b'<sportsdata category="update" id="' + " ".join(ids).encode() + b'">'
        b'<replace sel="/event/@going">soft</replace></sportsdata>'
    )
    items: list[Item] = split_message("ID:" + "0" * 48, parse_message(body, limits=LIMITS))
    assert len(items) == len(ids)
    assert len({id(item.payload) for item in items}) == 1
    assert len(items[0].payload) < len(body)
