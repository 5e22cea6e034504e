from __future__ import annotations

import pytest
import rnc2rng
from lxml import etree

from sis_platform.domain.schema import (
    RNC_PATH,
    RNG_PATH,
    envelope_schema,
    event_schema,
    validate_envelope,
    validate_event,
)
from tests.domain.sportsdata_fixtures import WIN_MARKET, event, master, update


def xml(text: str | bytes) -> etree._Element:
    return etree.fromstring(text.encode() if isinstance(text, str) else text)


def test_checked_in_rng_is_the_rnc2rng_conversion_of_the_rnc():
    # The same conversion as the `rnc2rng in.rnc out.rng` command, which adds a final newline.
    with RNC_PATH.open(encoding="utf-8") as f:
        converted = rnc2rng.dumps(rnc2rng.load(f)) + "\n"
    assert RNG_PATH.read_text(encoding="utf-8") == converted, (
        f"sportsdata.rng is stale: run rnc2rng {RNC_PATH} {RNG_PATH}"
    )


def test_schemas_are_compiled_once_and_cached():
    assert envelope_schema() is envelope_schema()
    assert event_schema() is event_schema()


def test_master_message_with_events_is_valid():
    assert validate_envelope(xml(master(event(), event("ASC-20261121-1500")))) is None


def test_update_message_with_rfc5261_operations_is_valid():
    body = update(
        "A B",
        '<replace sel="/event/@going">soft</replace>',
        '<add sel="/event/market" pos="before">'
        '<market id="PLACE" type="place" status="open"/></add>',
        '<add sel="/event" type="@going">firm</add>',
        '<add sel="/event/market" pos="prepend">'
        '<!-- any content --><x:y xmlns:x="urn:x" x:a="1">t</x:y></add>',
        '<remove sel="/event/market[1]" ws="both"/>',
        '<remove sel="/event/@going"/>',
    )
    assert validate_envelope(xml(body)) is None


def test_standalone_event_is_valid_against_the_event_start():
    assert validate_event(xml(event())) is None


def test_event_without_markets_or_going_is_valid():
    assert validate_event(xml(event(markets="", going=None))) is None


def test_event_start_rejects_an_envelope_and_envelope_start_rejects_an_event():
    assert "sportsdata" in (validate_envelope(xml(event())) or "")
    assert validate_event(xml(master(event()))) is not None


def test_event_inside_an_envelope_is_validated_in_place():
    root = xml(master(event()))
    assert validate_event(root[0]) is None


@pytest.mark.parametrize(
    ("broken", "attribute"),
    [
        (event(extra=' colour="red"'), "colour"),
        (
            event(markets=WIN_MARKET.replace('status="open"', 'status="open" colour="red"')),
            "colour",
        ),
        (
            event(markets=WIN_MARKET.replace('name="Red Rum"', 'name="Red Rum" colour="red"')),
            "colour",
        ),
        (event(markets=WIN_MARKET.replace('den="2"', 'den="2" colour="red"')), "colour"),
        (event(extra=' xml:lang="en"'), "lang"),
    ],
    ids=["event", "market", "selection", "price", "xml-lang"],
)
def test_unknown_attribute_is_rejected_and_named(broken, attribute):
    error = validate_event(xml(broken))
    assert error is not None
    assert attribute in error


@pytest.mark.parametrize(
    "broken",
    [
        event(sport="curling"),
        event(status="running"),
        event(country="gb"),
        event(country="GBR"),
        event(start="21/11/2026 14:30"),
        event(start="2026-11-21"),
        event("no spaces allowed"),
        event("x" * 65),
        event(course=""),
        event(markets=WIN_MARKET.replace('type="win"', 'type="lottery"')),
        event(markets=WIN_MARKET.replace('status="open"', 'status="ajar"')),
        event(markets=WIN_MARKET.replace('type="win"', 'type="win" places="0"')),
        event(markets=WIN_MARKET.replace('status="runner" jockey', 'status="faller" jockey')),
        event(markets=WIN_MARKET.replace('number="3"', 'number="-3"')),
        event(markets=WIN_MARKET.replace('num="5"', 'num="0"')),
        event(markets=WIN_MARKET.replace('den="2"', 'den="two"')),
        event(markets=WIN_MARKET.replace('den="2"', "")),
        event(markets=WIN_MARKET.replace('at="2026-11-21T13:00:00Z"', 'at="soon"')),
        event(markets=WIN_MARKET.replace("<price ", "<price><odds/></price><price ")),
        event(
            markets=WIN_MARKET.replace(
                '<price num="5" den="2"/>', "<price num='5' den='2'>5/2</price>"
            )
        ),
        event(markets='<selection id="1" name="x" status="runner"/>'),
        event(markets=WIN_MARKET + "text between"),
        event(extra=' xmlns="urn:other"'),
    ],
)
def test_event_vocabulary_is_closed(broken):
    assert validate_event(xml(broken)) is not None


def test_every_listed_sport_and_a_two_letter_country_are_valid():
    for sport in [
        "horse-racing",
        "greyhounds",
        "football",
        "tennis",
        "golf",
        "cricket",
        "rugby-union",
        "rugby-league",
        "darts",
        "snooker",
    ]:
        assert validate_event(xml(event(sport=sport, country="IE"))) is None, sport


@pytest.mark.parametrize(
    "body",
    [
        update("A", '<replace sel="/event/@going" pos="after">soft</replace>'),
        update("A", '<add sel="/event" pos="inside"><market/></add>'),
        update("A", '<remove sel="/event/@going" ws="around"/>'),
        update("A", '<remove sel="/event/market">content</remove>'),
        update("A", "<replace>soft</replace>"),
        update("A", '<delete sel="/event/@going"/>'),
        update("A"),
        update("A", "text"),
        master(ids="A"),
        update("A", '<replace sel="/event/@going">soft</replace>', event("A")),
        master(event("A")).replace(b"<event", b"<replace sel='/x'/><event"),
    ],
    ids=[
        "replace-with-pos",
        "bad-pos",
        "bad-ws",
        "remove-with-content",
        "no-sel",
        "unknown-operation",
        "no-operation",
        "text-only",
        "master-without-events",
        "event-in-update",
        "operation-in-master",
    ],
)
def test_envelope_schema_rejects(body):
    assert validate_envelope(xml(body)) is not None


def test_first_error_names_the_offending_node():
    error = validate_event(xml(event(markets=WIN_MARKET.replace('num="5"', 'num="0"'))))
    assert error is not None
    assert "price" in error
    assert error.startswith("line 1:")


# --- integers fit a signed 64-bit long ---------------------------------------------------------

LONG_MAX = "9223372036854775807"


def counted(value: str) -> str:
    return event(
        markets=f'<market id="W" type="win" status="open" places="{value}">'
        f'<selection id="1" number="{value}" name="x" status="runner">'
        f'<price num="{value}" den="{value}"/></selection></market>'
    )


@pytest.mark.parametrize("value", ["1", "+5", " +007 ", LONG_MAX, "000" + LONG_MAX])
def test_a_positive_integer_up_to_the_largest_long_is_valid(value):
    assert validate_event(xml(counted(value))) is None


@pytest.mark.parametrize("value", ["0", "-1", "9223372036854775808", "1" + "0" * 30])
def test_a_count_outside_one_to_the_largest_long_is_invalid(value):
    assert validate_event(xml(counted(value))) is not None


@pytest.mark.parametrize("attribute", ["places", "number", "num", "den"])
def test_each_integer_attribute_is_bounded(attribute):
    document = counted("1").replace(f'{attribute}="1"', f'{attribute}="9223372036854775808"')
    assert validate_event(xml(document)) is not None
    assert validate_event(xml(document.replace("9223372036854775808", LONG_MAX))) is None
