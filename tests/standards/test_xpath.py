"""The RFC 5261 selector grammar: what parses to what, what is refused, and the bounds."""

from __future__ import annotations

import pytest
from lxml import etree

from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.simulator.generator import generate_feed
from sis_platform.standards.xpath import (
    AttributeEquals,
    AttributeStep,
    ChildEquals,
    ElementStep,
    LocationPath,
    NamespaceStep,
    NodeStep,
    Position,
    QName,
    SelectorSyntaxError,
    SelectorTooComplex,
    SelfEquals,
    TextEquals,
    parse_selector,
    render_last,
    render_steps,
)

PRICE_NUM = "/event/market[@id='WIN']/selection[@id='7']/price/@num"


def name(local: str, prefix: str = "") -> QName:
    return QName(prefix, local)


def test_a_feed_selector_parses_to_its_steps_predicates_and_attribute() -> None:
    assert parse_selector(PRICE_NUM) == LocationPath(
        PRICE_NUM,
        None,
        (
            ElementStep(name("event")),
            ElementStep(name("market"), (AttributeEquals(name("id"), "WIN"),)),
            ElementStep(name("selection"), (AttributeEquals(name("id"), "7"),)),
            ElementStep(name("price")),
        ),
        AttributeStep(name("num")),
    )


@pytest.mark.parametrize(
    ("sel", "steps", "last"),
    [
        ("doc", (ElementStep(name("doc")),), None),
        ("*/a", (ElementStep(name("*")), ElementStep(name("a"))), None),
        ("p:doc/@q:a", (ElementStep(name("doc", "p")),), AttributeStep(name("a", "q"))),
        ("doc/a[3]", (ElementStep(name("doc")), ElementStep(name("a"), (Position(3),))), None),
        (
            'doc/a[k="v"][.=\'w\'][text()="t"]',
            (
                ElementStep(name("doc")),
                ElementStep(
                    name("a"),
                    (ChildEquals(name("k"), "v"), SelfEquals("w"), TextEquals("t")),
                ),
            ),
            None,
        ),
        ("doc/namespace::p", (ElementStep(name("doc")),), NamespaceStep("p")),
        ("doc/text()[2]", (ElementStep(name("doc")),), NodeStep("text", None, 2)),
        ("comment()", (), NodeStep("comment")),
        (
            "doc/processing-instruction('t')",
            (ElementStep(name("doc")),),
            NodeStep("processing-instruction", "t"),
        ),
        (
            "doc/processing-instruction()",
            (ElementStep(name("doc")),),
            NodeStep("processing-instruction"),
        ),
        ("mx.unam-x/a_b", (ElementStep(name("mx.unam-x")), ElementStep(name("a_b"))), None),
        (
            " / doc [ @a = 'x y' ] / @b ",
            (ElementStep(name("doc"), (AttributeEquals(name("a"), "x y"),)),),
            AttributeStep(name("b")),
        ),
    ],
    ids=[
        "element",
        "wildcard",
        "prefixes",
        "position",
        "value-tests",
        "namespace",
        "text",
        "comment-of-the-root-node",
        "pi-target",
        "pi-any",
        "name-characters",
        "whitespace",
    ],
)
def test_every_form_of_the_grammar_parses(
    sel: str, steps: tuple[ElementStep, ...], last: object
) -> None:
    parsed = parse_selector(sel)
    assert (parsed.id_values, parsed.steps, parsed.last) == (None, steps, last)


def test_every_selector_of_a_simulated_feed_parses_and_renders_back_to_itself() -> None:
    selectors = {
        operation.get("sel")
        for message in generate_feed(3, 1500)
        if b'category="update"' in message.body
        for operation in etree.fromstring(message.body)
    }
    assert len(selectors) > 50
    for sel in selectors:
        parsed = parse_selector(sel)
        rendered = render_steps(parsed.steps)
        if isinstance(parsed.last, AttributeStep):
            rendered += "/" + render_last(parsed.last)
        assert rendered == sel


def test_relative_and_absolute_selectors_parse_to_the_same_path() -> None:
    # RFC 5261 section 4.1: both are evaluated from the document root node.
    relative, absolute = parse_selector("doc/a/@b"), parse_selector("/doc/a/@b")
    assert (relative.steps, relative.last) == (absolute.steps, absolute.last)


def test_id_start_parses_its_ids_and_the_steps_after_it() -> None:
    parsed = parse_selector("id('k l')/a/@b")
    assert parsed.id_values == ("k", "l")
    assert parsed.steps == (ElementStep(name("a")),)
    assert parsed.last == AttributeStep(name("b"))


def test_rendering_gives_an_absolute_expression_with_the_default_prefix_on_element_names() -> None:
    parsed = parse_selector("doc/a[@n=\"it's\"][k='v'][2]/*/@x")
    assert render_steps(parsed.steps) == "/doc/a[@n=\"it's\"][k='v'][2]/*"
    assert render_steps(parsed.steps, "d") == "/d:doc/d:a[@n=\"it's\"][d:k='v'][2]/*"
    assert isinstance(parsed.last, AttributeStep)
    assert render_last(parsed.last) == "@x"


def test_rendered_selectors_select_what_libxml2_selects_for_the_original() -> None:
    doc = etree.fromstring(
        "<doc><a n='1'>x<k>v</k></a><a n='2'>y<!--c--><?t d?></a><b>z</b></doc>"
    ).getroottree()
    for sel in [
        "/doc/a[@n='2']",
        "/doc/a[k='v']/@n",
        "/doc/*[2]/text()[1]",
        "/doc/b[.='z']",
        "/doc/a[text()='y']/comment()",
        "/doc/a[2]/processing-instruction('t')",
    ]:
        parsed = parse_selector(sel)
        expression = render_steps(parsed.steps)
        if isinstance(parsed.last, AttributeStep | NodeStep):
            expression += "/" + render_last(parsed.last)
        assert doc.xpath(expression) == doc.xpath(sel), sel


# ---------------------------------------------------------------------------------------------
# Refused: everything general XPath adds to the grammar


def nested_counts(depth: int) -> str:
    inner = "count(//*)"
    for _ in range(depth - 1):
        inner = f"count(//*[{inner}])"
    return f"/event[{inner}]/@going"


@pytest.mark.parametrize(
    "sel",
    [
        nested_counts(3),
        nested_counts(6),
        "/event[count(//*)>0]",
        "//*",
        "/event//price/@num",
        "/event/market[@id='WIN']//@num",
        "/event/market[selection[price[@num='1']]]",
        "/event/market" + "[@id='WIN' and ./selection]" * 2,
        "/event/market | /event/market | /event",
        "/event[string-length(concat(@id, @id, @id)) > 1]",
        "/event[translate(@id, 'abc', 'ABC')='X']",
        "/event[contains(name(), 'e')]",
        "/event[$x]",
        "$x",
        "/event/market[1e308]",
        "/event/market[1.5]",
        "/event/market[-1]",
        "/event/market[last()]",
        "/event/market[position()=1]",
        "/event/market[@id!='WIN']",
        "/event/market[@id>1]",
        "/event/market[@id=@name]",
        "/event/ancestor::*",
        "/event/child::market",
        "/event/attribute::id",
        "/event/..",
        "/event/./market",
        "/event/node()",
        "/event/p:*",
        "/event/@*",
        "/event/namespace::*",
        "/event/@id/text()",
        "/event/text()/a",
        "count(/event)",
        "/event[",
        "/event/market[@id='WIN",
        "/",
        "",
        "   ",
        "/event/",
        "/event/market/",
        "/event/a:b:c",
        "id(@x)",
        "/event/id('k')",
    ],
)
def test_selectors_outside_the_grammar_are_refused_before_evaluation(sel: str) -> None:
    with pytest.raises(SelectorSyntaxError):
        parse_selector(sel)


@pytest.mark.parametrize(
    ("sel", "said"),
    [
        ("//price", "'//' (the descendant axis) at offset 0"),
        ("/event[$x]", "a variable reference at offset 7"),
        ("/event | /x", "operator '|' at offset 7"),
        ("/event[count(//*)]", "function count() at offset 7"),
        ("/event/ancestor::x", "axis ancestor:: at offset 7"),
    ],
)
def test_refusals_say_what_is_outside_the_grammar_and_where(sel: str, said: str) -> None:
    with pytest.raises(SelectorSyntaxError) as raised:
        parse_selector(sel)
    assert str(raised.value) == f"{said}, outside the RFC 5261 selector subset"


# ---------------------------------------------------------------------------------------------
# Bounds (sis_platform.domain.limits)


def steps_and_predicates(count: int) -> str:
    """A selector with `count` location steps plus predicates: /event[@id='E'] then /a steps."""
    return "/event[@id='E']" + "/a" * (count - 2)


def test_a_selector_at_the_length_limit_is_accepted_and_one_longer_is_too_complex() -> None:
    limits = Limits(max_selector_length=40)
    at_limit = "/event/" + "a" * 33
    assert len(at_limit) == 40
    assert parse_selector(at_limit, limits).steps[-1] == ElementStep(name("a" * 33))
    with pytest.raises(SelectorTooComplex) as raised:
        parse_selector(at_limit + "a", limits)
    assert str(raised.value) == (
        "sel is 41 characters, over the limit of 40 (SIS_MAX_SELECTOR_LENGTH)"
    )


def test_the_length_limit_is_checked_before_the_selector_is_read() -> None:
    # Not even syntax is looked at: a long selector costs one len().
    with pytest.raises(SelectorTooComplex):
        parse_selector("(" * (DEFAULT_LIMITS.max_selector_length + 1))


def test_selectors_at_the_steps_limit_are_accepted_and_one_over_is_too_complex() -> None:
    limit = DEFAULT_LIMITS.max_selector_steps
    parsed = parse_selector(steps_and_predicates(limit))
    assert len(parsed.steps) + sum(len(s.predicates) for s in parsed.steps) == limit
    with pytest.raises(SelectorTooComplex) as raised:
        parse_selector(steps_and_predicates(limit + 1))
    assert str(raised.value) == (
        f"sel has {limit + 1} or more location steps and predicates, over the limit of {limit} "
        "(SIS_MAX_SELECTOR_STEPS)"
    )


@pytest.mark.parametrize(
    "sel",
    [
        "/event" + "[@a='1']" * 4,
        "/event/a/b/c/@d",
        "/event/a/b/text()[1]",
        "id('k')/a/b/c/@d",
    ],
    ids=["predicates", "attribute-step", "positioned-final-step", "id-start"],
)
def test_predicates_final_steps_and_the_id_start_all_count_towards_the_steps_limit(
    sel: str,
) -> None:
    assert parse_selector(sel, Limits(max_selector_steps=5))
    with pytest.raises(SelectorTooComplex):
        parse_selector(sel, Limits(max_selector_steps=4))


def test_the_feeds_largest_selectors_are_far_inside_the_default_limits() -> None:
    # limits.py: 57 characters, 5 steps and 2 predicates on the simulator's racing days.
    limits = Limits(max_selector_length=len(PRICE_NUM), max_selector_steps=7)
    assert parse_selector(PRICE_NUM, limits).last == AttributeStep(name("num"))
    assert DEFAULT_LIMITS.max_selector_length >= 10 * len(PRICE_NUM)
    assert DEFAULT_LIMITS.max_selector_steps >= 7 * 9
