"""Behaviour of the JMS 1.1 message selector engine (JMS 1.1 section 3.8.1)."""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from enum import StrEnum

import pytest

from sis_platform.standards.selector import InvalidSelector, Selector

SPORTSDATA = "sport = 'horse-racing' AND country IN ('GB','IE')"


def evaluate(text: str, properties: Mapping[str, object] | None = None) -> bool | None:
    return Selector.compile(text).evaluate(properties or {})


def item(**properties: object) -> dict[str, object]:
    """Properties as the platform decorates a Sportsdata item."""
    base: dict[str, object] = {
        "JMSMessageID": "ID:sis-1",
        "JMSTimestamp": 1_700_000_000_000,
        "JMSRedelivered": False,
        "JMSXDeliveryCount": 1,
        "category": "update",
        "masterId": "E123",
        "sport": "horse-racing",
        "country": "GB",
    }
    base.update(properties)
    return base


# --- the platform's use case


def test_sportsdata_selector_selects_horse_racing_in_gb_and_ie() -> None:
    selector = Selector.compile(SPORTSDATA)
    assert selector.matches(item(country="GB"))
    assert selector.matches(item(country="IE"))


def test_sportsdata_selector_filters_other_sports_and_countries() -> None:
    selector = Selector.compile(SPORTSDATA)
    assert not selector.matches(item(sport="greyhounds"))
    assert selector.evaluate(item(country="FR")) is False


def test_sportsdata_item_without_country_is_unknown_and_not_selected() -> None:
    selector = Selector.compile(SPORTSDATA)
    properties = item()
    del properties["country"]
    assert selector.evaluate(properties) is None
    assert selector.matches(properties) is False


def test_redelivery_headers_are_selectable() -> None:
    selector = Selector.compile("NOT JMSRedelivered AND JMSXDeliveryCount < 2")
    assert selector.matches(item())
    assert not selector.matches(item(JMSRedelivered=True, JMSXDeliveryCount=2))


def test_one_compiled_selector_evaluates_many_items() -> None:
    selector = Selector.compile("category = 'update' AND masterId LIKE 'E%'")
    results = [selector.matches(item(masterId=f"{prefix}{n}")) for prefix in "EM" for n in range(3)]
    assert results == [True, True, True, False, False, False]


# --- NULL and three-valued logic (3.8.1.2)


def test_missing_property_makes_comparison_unknown() -> None:
    assert evaluate("price > 10") is None
    assert evaluate("price > 10", {"price": None}) is None
    assert Selector.compile("price > 10").matches({}) is False


def test_not_of_unknown_stays_unknown() -> None:
    assert evaluate("NOT (price > 10)") is None
    assert evaluate("price <> 10") is None


@pytest.mark.parametrize(
    ("text", "truth"),
    [
        ("missing = 1 AND 1 = 2", False),
        ("missing = 1 AND 1 = 1", None),
        ("missing = 1 OR 1 = 1", True),
        ("missing = 1 OR 1 = 2", None),
        ("(missing = 1 OR 1 = 2) AND 1 = 1 AND 2 = 2", None),
        ("1 = 2 OR 2 = 3 OR missing = 1 OR 3 = 3", True),
    ],
)
def test_and_or_follow_sql_three_valued_logic(text: str, truth: bool | None) -> None:
    assert evaluate(text) is truth


def test_is_null_is_true_for_missing_and_none_valued_property() -> None:
    assert evaluate("a IS NULL") is True
    assert evaluate("a IS NULL", {"a": None}) is True
    assert evaluate("a IS NOT NULL", {"a": 0}) is True
    assert evaluate("a IS NULL", {"a": ""}) is False


def test_parenthesised_condition_is_null_observes_unknown() -> None:
    assert evaluate("(a > 1) IS NULL") is True
    assert evaluate("(a > 1) IS NULL", {"a": 2}) is False


def test_in_and_not_in_with_null_identifier_are_unknown() -> None:
    assert evaluate("a IN ('x')") is None
    assert evaluate("a NOT IN ('x')") is None


def test_comparing_two_missing_properties_is_unknown_not_equal() -> None:
    assert evaluate("a = b") is None


# --- syntax: precedence, keywords, identifiers, literals (3.8.1.1)


def test_not_binds_looser_than_comparison() -> None:
    assert evaluate("NOT price = 200", {"price": 100}) is True
    assert evaluate("NOT fruit IN ('apple')", {"fruit": "pear"}) is True


def test_and_binds_tighter_than_or() -> None:
    assert evaluate("TRUE OR TRUE AND FALSE") is True
    assert evaluate("(TRUE OR TRUE) AND FALSE") is False


def test_arithmetic_precedence_and_unary_minus() -> None:
    assert evaluate("1 + 2 * 3 = 7") is True
    assert evaluate("(1 + 2) * 3 = 9") is True
    assert evaluate("-a * 2 = -6", {"a": 3}) is True
    assert evaluate("- -a = a", {"a": 3}) is True
    assert evaluate("10 - 2 - 3 = 5") is True


def test_keywords_are_case_insensitive_and_identifiers_case_sensitive() -> None:
    properties = {"Sport": "golf"}
    assert evaluate("Sport = 'golf' aNd NoT sport iS nOt NuLl", properties) is True
    assert evaluate("sport = 'golf'", properties) is None
    assert evaluate("true And FALSE or TrUe") is True


@pytest.mark.parametrize("word", ["NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE",
                                  "IN", "IS", "ESCAPE", "escape", "Between"])  # fmt: skip
def test_reserved_words_are_not_identifiers(word: str) -> None:
    with pytest.raises(InvalidSelector):
        Selector.compile(f"{word} = 'x'")


@pytest.mark.parametrize("name", ["_x", "$x", "x$1", "prop_name", "été", "Ωmega", "x\u0301"])
def test_java_identifier_characters_are_accepted(name: str) -> None:
    assert evaluate(f"{name} = 1", {name: 1}) is True


def test_quoted_identifier_names_any_property() -> None:
    # Provider extension (Artemis, Qpid).
    assert evaluate('"a.b-c" = 1', {"a.b-c": 1}) is True
    assert evaluate('"say ""hi""" = 1', {'say "hi"': 1}) is True


def test_string_literal_doubles_its_quote() -> None:
    assert evaluate("s = 'it''s'", {"s": "it's"}) is True
    assert evaluate("s = ''", {"s": ""}) is True


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        ("57", 57),
        ("+62", 62),
        ("-957", -957),
        ("7.", 7.0),
        ("95.7", 95.7),
        (".5", 0.5),
        ("7E3", 7000.0),
        ("-57.9E2", -5790.0),
        ("1e-3", 0.001),
        ("0x1F", 31),
        ("0X1f", 31),
        ("017", 15),
        ("0b101", 5),
        ("1_000_000", 1000000),
        ("42L", 42),
        ("2d", 2.0),
        ("0.5f", 0.5),
        ("0x1p3", 8.0),
        ("0x1.8p1", 3.0),
        ("9223372036854775807", 9223372036854775807),
        ("-9223372036854775808", -9223372036854775808),
        ("0xFFFFFFFFFFFFFFFF", -1),
        ("0x8000000000000000", -9223372036854775808),
        ("4.9E-324", 4.9e-324),
        ("1.7976931348623157E308", 1.7976931348623157e308),
    ],
)
def test_numeric_literals_follow_java_syntax(literal: str, value: object) -> None:
    assert evaluate(f"x = {literal}", {"x": value}) is True


def test_float_suffixed_literal_has_float_precision() -> None:
    # Java: 0.1f widens to 0.10000000149011612, which is not 0.1 (a double).
    assert evaluate("0.1f = 0.1") is False
    assert evaluate("0.1d = 0.1") is True


@pytest.mark.parametrize(
    "text",
    [
        "x = 9223372036854775808",
        "x = -9223372036854775809",
        "x = 0x1FFFFFFFFFFFFFFFF",
        "x = 1e309",
        "x = 1e-400",
        "x = 3.5e38f",
        "x = 09",
        "x = 1_",
        "x = 1uncorrect",
        "x = 0x",
    ],
)
def test_out_of_range_or_malformed_literals_are_invalid(text: str) -> None:
    with pytest.raises(InvalidSelector):
        Selector.compile(text)


# --- comparison and types


def test_comparing_unlike_types_is_false_not_unknown() -> None:
    # 3.8.1.1: "If the comparison of non-like type values is attempted, the value of the
    # operation is false."
    assert evaluate("x = 'GB'", {"x": 1}) is False
    assert evaluate("x <> 'GB'", {"x": 1}) is False
    assert evaluate("x > 1", {"x": "2"}) is False
    assert evaluate("x = TRUE", {"x": "true"}) is False


def test_python_bool_is_a_boolean_not_a_number() -> None:
    assert evaluate("x = 1", {"x": True}) is False
    assert evaluate("x = TRUE", {"x": 1}) is False
    assert evaluate("x + 1 = 2", {"x": True}) is None
    assert evaluate("x = TRUE", {"x": True}) is True


def test_strings_compare_by_characters_only_with_equality() -> None:
    assert evaluate("a = b", {"a": "x", "b": "x"}) is True
    assert evaluate("a <> b", {"a": "x", "b": "y"}) is True
    assert evaluate("a < b", {"a": "x", "b": "y"}) is False  # no string order in JMS


def test_exact_and_approximate_numbers_compare_after_promotion() -> None:
    assert evaluate("x = 123", {"x": 123.0}) is True
    assert evaluate("x > 1.5", {"x": 2}) is True
    # Java promotes the long to double, where 2**53 + 1 rounds to 2**53.
    assert evaluate("x = 9007199254740993", {"x": 9007199254740992.0}) is True


def test_str_subclass_values_are_strings() -> None:
    class Category(StrEnum):
        UPDATE = "update"

    assert evaluate("c = 'update'", {"c": Category.UPDATE}) is True
    assert evaluate("c IN ('update')", {"c": Category.UPDATE}) is True
    assert evaluate("c LIKE 'up%'", {"c": Category.UPDATE}) is True


def test_non_boolean_property_as_condition_is_unknown() -> None:
    assert evaluate("flag", {"flag": "true"}) is None
    assert evaluate("flag", {"flag": 1}) is None
    assert evaluate("flag", {"flag": True}) is True
    assert evaluate("NOT flag", {"flag": False}) is True


# --- arithmetic


def test_division_is_double_even_for_two_integers() -> None:
    # Decision shared with ActiveMQ, Artemis and Qpid Broker-J (qpid-cpp divides as integers).
    assert evaluate("17 / 4 = 4.25") is True
    assert evaluate("rank / version = 61.5", {"rank": 123, "version": 2}) is True


def test_division_by_zero_gives_ieee_results() -> None:
    assert evaluate("x / 0 > 1e308", {"x": 1}) is True
    assert evaluate("x / 0 < -1e308", {"x": -1}) is True
    assert evaluate("x / 0 = x / 0", {"x": 0}) is False  # NaN equals nothing


def test_remainder_takes_the_sign_of_the_dividend() -> None:
    assert evaluate("-7 % 3 = -1") is True
    assert evaluate("7 % -3 = 1") is True
    assert evaluate("7.5 % 2 = 1.5") is True


def test_exact_remainder_by_zero_is_unknown() -> None:
    assert evaluate("x % 0 = 0", {"x": 7}) is None


def test_exact_arithmetic_wraps_like_java_long() -> None:
    assert evaluate("9223372036854775807 + 1 = -9223372036854775808") is True
    assert evaluate("x * 2 = -2", {"x": 9223372036854775807}) is True


def test_arithmetic_on_a_string_is_unknown() -> None:
    # 3.8.1.1: "a string cannot be used in an arithmetic expression".
    assert evaluate("NumberOfOrders + 1 > 1", {"NumberOfOrders": "2"}) is None


def test_string_concatenation_with_plus() -> None:
    # ActiveMQ/Artemis extension; two strings only.
    assert evaluate("name + '!' = 'James!'", {"name": "James"}) is True
    assert evaluate("name + '!' = 'James!'", {"name": 7}) is None


# --- BETWEEN, IN, LIKE


def test_between_includes_both_bounds() -> None:
    assert evaluate("age BETWEEN 15 AND 19", {"age": 15}) is True
    assert evaluate("age BETWEEN 15 AND 19", {"age": 19.0}) is True
    assert evaluate("age BETWEEN 15 AND 19", {"age": 20}) is False
    assert evaluate("age NOT BETWEEN 15 AND 19", {"age": 20}) is True


def test_between_with_a_missing_bound_decides_when_the_other_bound_fails() -> None:
    # BETWEEN is >= AND <= (3.8.1.1): FALSE AND UNKNOWN is FALSE.
    assert evaluate("5 BETWEEN lo AND 3") is False
    assert evaluate("5 BETWEEN lo AND 7") is None


def test_not_between_on_a_value_of_another_type_is_false() -> None:
    # NOT BETWEEN is "x < a OR x > b" (3.8.1.1); comparisons of unlike types are false.
    assert evaluate("x BETWEEN 1 AND 10", {"x": "foo"}) is False
    assert evaluate("x NOT BETWEEN 1 AND 10", {"x": "foo"}) is False


def test_in_matches_any_listed_string() -> None:
    assert evaluate("Country IN ('UK', 'US', 'France')", {"Country": "UK"}) is True
    assert evaluate("Country IN ('UK', 'US', 'France')", {"Country": "Peru"}) is False
    assert evaluate("Country NOT IN ('UK', 'US', 'France')", {"Country": "Peru"}) is True


def test_not_in_on_a_value_of_another_type_is_false() -> None:
    # A type mismatch never selects (Qpid, QPID-6717): neither IN nor NOT IN is true.
    assert evaluate("x IN ('1', '2')", {"x": 1}) is False
    assert evaluate("x NOT IN ('1', '2')", {"x": 1}) is False


@pytest.mark.parametrize(
    ("pattern", "value", "truth"),
    [
        ("12%3", "123", True),
        ("12%3", "12993", True),
        ("12%3", "1234", False),
        ("l_se", "lose", True),
        ("l_se", "loose", False),
        ("%", "", True),
        ("a%", "abc", True),
        ("%c", "abc", True),
        ("%b%", "abc", True),
        ("a%c", "ac", True),
        ("a%c", "abbc", True),
        ("a%c", "a", False),
        ("ab%ab", "ab", False),
        ("a_%_c", "abxbc", True),
        ("a.c", "abc", False),  # regular-expression characters are literal
        ("[abc]", "[abc]", True),
        ("a%", "a\nb", True),  # % spans line breaks
        ("A%", "abc", False),  # case-sensitive
    ],
)
def test_like_wildcards(pattern: str, value: str, truth: bool) -> None:
    assert evaluate(f"s LIKE '{pattern}'", {"s": value}) is truth
    assert evaluate(f"s NOT LIKE '{pattern}'", {"s": value}) is (not truth)


def test_like_with_escape_matches_literal_underscore() -> None:
    selector = Selector.compile(r"underscored LIKE '\_%' ESCAPE '\'")
    assert selector.matches({"underscored": "_foo"})
    assert not selector.matches({"underscored": "bar"})


def test_like_escape_character_elsewhere_stands_for_itself() -> None:
    # ActiveMQ/Artemis: it escapes only '%', '_' or itself.
    assert evaluate("s LIKE 'a!b' ESCAPE '!'", {"s": "a!b"}) is True
    assert evaluate("s LIKE 'a!!b' ESCAPE '!'", {"s": "a!b"}) is True
    assert evaluate("s LIKE '100!%' ESCAPE '!'", {"s": "100%"}) is True
    assert evaluate("s LIKE '100!%' ESCAPE '!'", {"s": "1000"}) is False


def test_like_escape_percent_escapes_only_before_a_wildcard() -> None:
    assert evaluate("s LIKE '%_%' ESCAPE '%'", {"s": "_foo"}) is True
    assert evaluate("s LIKE '%_%' ESCAPE '%'", {"s": "foo"}) is False


def test_like_on_a_non_string_is_unknown() -> None:
    assert evaluate("x LIKE '1%'", {"x": 123}) is None
    assert evaluate("x NOT LIKE '1%'", {"x": 123}) is None


def test_in_list_may_mix_types_and_expressions() -> None:
    # Qpid extension: an item of another type simply does not match.
    assert evaluate("x IN ('a', 1, TRUE, (1 - 17))", {"x": -16}) is True
    assert evaluate("x IN ('a', y)", {"x": "b", "y": "b"}) is True
    assert evaluate("x IN ('a', y)", {"x": "b"}) is None


# --- headers


def test_header_fields_are_read_from_the_mapping() -> None:
    headers: dict[str, object] = {
        "JMSMessageID": "ID:m-1",
        "JMSTimestamp": 1_700_000_000_002,
        "JMSPriority": 4,
        "JMSCorrelationID": "cid-2",
        "JMSType": "car",
    }
    selector = Selector.compile(
        "JMSMessageID = 'ID:m-1' AND JMSTimestamp > 1700000000000 AND JMSPriority BETWEEN 4 AND 9"
        " AND JMSCorrelationID LIKE 'cid-%' AND JMSType IN ('car', 'van')"
    )
    assert selector.matches(headers)


def test_null_valued_headers_are_null() -> None:
    assert evaluate("JMSCorrelationID IS NULL", {"JMSCorrelationID": None}) is True


def test_delivery_mode_reads_as_its_name_also_from_the_jms_number() -> None:
    selector = Selector.compile("JMSDeliveryMode = 'PERSISTENT'")
    assert selector.matches({"JMSDeliveryMode": "PERSISTENT"})
    assert selector.matches({"JMSDeliveryMode": 2})
    assert selector.evaluate({"JMSDeliveryMode": 1}) is False
    assert evaluate("JMSDeliveryMode IN ('NON_PERSISTENT')", {"JMSDeliveryMode": 1}) is True


# --- compile-time errors


def test_empty_or_blank_selector_selects_everything() -> None:
    for text in ("", "   ", "\n\t"):
        assert Selector.compile(text).matches({})


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("hello world", 6),
        ("a = 1 AMD b = 2", 6),
        ("color = 'red", 8),
        ("a ^ b", 2),
        ("(a = 1", 6),
        ("a IN ()", 6),
        ("a LIKE 5", 7),
        ("a LIKE 'x' ESCAPE 'ab'", 18),
        ("NULL = 0", 0),
        ("a = 1 = 2", 6),
        ("f(1)", 1),
        ("a != 1", 2),
    ],
)
def test_invalid_selector_reports_the_position(text: str, position: int) -> None:
    with pytest.raises(InvalidSelector) as raised:
        Selector.compile(text)
    assert raised.value.position == position
    assert raised.value.selector == text
    assert f"at position {position}" in str(raised.value)
    # The message shows the selector with a caret under the position.
    lines = str(raised.value).splitlines()
    assert lines[2].index("^") - 2 == position


def test_invalid_selector_message_shows_a_window_of_a_long_selector() -> None:
    text = "a = 1 AND " * 20 + "b = = 2"
    with pytest.raises(InvalidSelector) as raised:
        Selector.compile(text)
    _, shown, caret = str(raised.value).splitlines()
    assert len(shown) < 100
    assert shown[caret.index("^")] == "="


def test_invalid_selector_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        Selector.compile("3 +")


@pytest.mark.parametrize(
    "text",
    ["3", "1 + 2", "TRUE AND 3 + 5", "'yes'", "NOT 5", "a = 1 OR 'x'", "a + b"],
)
def test_selector_that_is_not_boolean_is_invalid(text: str) -> None:
    with pytest.raises(InvalidSelector):
        Selector.compile(text)


@pytest.mark.parametrize(
    "text",
    [
        "TRUE > 0",
        "'abc' < 'abd'",
        "(a = 1) >= b",
        "TRUE = 0",
        "'x' = FALSE",
        "(a = 1) = 'x'",
        "'hello kitty' BETWEEN 30 AND 40",
        "TRUE + 1 = 2",
        "'x' * 2 = 'xx'",
        "'x' + 1 = 'x1'",
        "5 LIKE '5'",
    ],
)
def test_type_errors_visible_at_compile_time_are_invalid(text: str) -> None:
    with pytest.raises(InvalidSelector):
        Selector.compile(text)


def test_string_literal_may_be_compared_for_equality_with_a_number() -> None:
    # A non-like comparison, false at evaluation (3.8.1.1), as qpid-cpp and ActiveMQ accept it.
    assert evaluate("'hello' = 19.0") is False


def test_deeply_nested_selector_is_invalid_not_a_crash() -> None:
    with pytest.raises(InvalidSelector):
        Selector.compile("(" * 2000 + "a = 1" + ")" * 2000)


def nested(shape: str, levels: int) -> str:
    """A selector `levels` deep in one kind of nesting."""
    if shape == "parentheses":
        return "(" * levels + "a = 1" + ")" * levels
    if shape == "NOT":
        return "NOT " * levels + "a = 1"
    if shape == "signs":
        return "- " * levels + "a = 1"
    return " + ".join(["a"] * (levels + 1)) + " = 1"  # a left-deep chain of operators


SHAPES = ["parentheses", "NOT", "signs", "operators"]


@pytest.mark.parametrize("shape", SHAPES)
def test_nesting_past_the_bound_is_invalid_whatever_its_kind(shape: str) -> None:
    with pytest.raises(InvalidSelector, match="nested deeper than 50 levels"):
        Selector.compile(nested(shape, 51))


@pytest.mark.parametrize("shape", SHAPES)
def test_nesting_at_the_bound_compiles_and_evaluates_on_a_deep_stack(shape: str) -> None:
    # Compiling and evaluating cost a few frames per level: bounded, they fit under Python's
    # recursion limit even where the caller is already hundreds of frames deep.
    def deep(frames: int) -> bool | None:
        if frames:
            return deep(frames - 1)
        return Selector.compile(nested(shape, 50)).evaluate({"a": 1})

    assert deep(300) in (True, False)


def test_compile_rejects_a_non_string() -> None:
    with pytest.raises(TypeError):
        Selector.compile(None)  # type: ignore[arg-type]


# --- the Selector object


def test_selector_keeps_its_text_and_compares_by_it() -> None:
    selector = Selector.compile(SPORTSDATA)
    assert selector.text == SPORTSDATA
    assert selector == Selector.compile(SPORTSDATA)
    assert hash(selector) == hash(Selector.compile(SPORTSDATA))
    assert selector != Selector.compile("sport = 'golf'")
    assert SPORTSDATA in repr(selector)


def test_selector_pickles_as_its_text_and_recompiles() -> None:
    # Closures do not pickle; Spark workers and multiprocess executors get the text.
    restored = pickle.loads(pickle.dumps(Selector.compile(SPORTSDATA)))
    assert restored == Selector.compile(SPORTSDATA)
    assert restored.matches(item())
