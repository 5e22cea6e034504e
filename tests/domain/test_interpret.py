from __future__ import annotations

from decimal import Decimal

import pytest

from sis_platform.domain.interpret import interpret, xs_integer
from tests.domain.sportsdata_fixtures import ASCOT_1430, event


@pytest.mark.parametrize(
    ("lexical", "value"),
    [
        ("5", 5),
        ("+5", 5),
        ("-5", -5),
        ("007", 7),
        (" +007 ", 7),
        ("\t\r\n42\n", 42),
        ("0", 0),
        ("-0", 0),
        ("+0", 0),
        ("9223372036854775807", 2**63 - 1),
        ("-9223372036854775808", -(2**63)),
        ("0009223372036854775807", 2**63 - 1),
        ("0" * 5000 + "7", 7),  # schema-valid: past int()'s 4,300-digit limit on digits
        ("-" + "0" * 5000, 0),
    ],
)
def test_every_xs_integer_lexical_form_is_read(lexical, value):
    assert xs_integer(lexical) == value


@pytest.mark.parametrize(
    "lexical",
    [
        None,
        "",
        " ",
        "+",
        "-",
        "+-5",
        "--5",
        "5 5",
        "1_000",
        "5.0",
        "1e3",
        "0x10",
        "\u0663",  # ARABIC-INDIC DIGIT THREE: int() reads it, XML Schema does not
        "\u00a05",  # a no-break space is not XML whitespace
        "9223372036854775808",  # beyond a signed 64-bit long
        "-9223372036854775809",
        "1" * 5000,
    ],
)
def test_anything_else_is_none(lexical):
    assert xs_integer(lexical) is None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("lexical", ["0" * 4_000_000 + "x", "0" * 4_000_000 + "7 x"])
def test_megabytes_of_zeros_are_read_in_one_pass(lexical):
    assert xs_integer(lexical) is None


def test_a_price_with_signed_zero_padded_numbers_is_interpreted():
    market = (
        '<market id="WIN" type="win" status="open" places=" 3 ">'
        '<selection id="7" number="+07" name="Red Rum" status="runner">'
        '<price num="+5" den=" 002 "/>'
        "</selection></market>"
    )
    model = interpret(ASCOT_1430, event(markets=market).encode())
    assert model.markets[0].places == 3
    (selection,) = model.selections
    assert (selection.number, selection.price_num, selection.price_den) == (7, 5, 2)
    assert selection.price_decimal == Decimal("3.500000")
