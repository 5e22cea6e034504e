"""JMS LIKE matching (JMS 1.1 section 3.8.1.1) on values of any length, against any pattern.

The values a selector's LIKE reads are message content (an event's course, up to the 4 MiB a
body may have), so adversarial patterns run over 4 MiB values here: each one would backtrack for
hours in a regular expression. The timeouts only guard against such a hang. The conformance
vectors (test_selector_conformance.py) and test_selector.py cover the semantics; the
differential test below compares the matcher with a plain dynamic-programming reference.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sis_platform.standards.like import LikePattern, like_matcher
from sis_platform.standards.selector import Selector

FOUR_MIB = 4 * 1024 * 1024


def like(pattern: str, value: str, escape: str | None = None) -> bool | None:
    clause = f" ESCAPE '{escape}'" if escape else ""
    return Selector.compile(f"course LIKE '{pattern}'{clause}").evaluate({"course": value})


def reference(pattern: str, value: str, escape: str | None) -> bool:
    """LIKE by dynamic programming over the pattern: the set of value positions reachable
    after each item (quadratic, obviously right)."""
    items: list[str | None] = []  # a literal character, "%" for any sequence, None for any one
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == escape and i + 1 < len(pattern) and pattern[i + 1] in ("%", "_", escape):
            items.append("\\" + pattern[i + 1])  # escaped: a literal, marked
            i += 2
            continue
        items.append("%" if c == "%" else None if c == "_" else "\\" + c)
        i += 1
    reachable = {0}
    for item in items:
        if item == "%":
            reachable = set(range(min(reachable), len(value) + 1)) if reachable else set()
        elif item is None:
            reachable = {p + 1 for p in reachable if p < len(value)}
        else:
            reachable = {p + 1 for p in reachable if p < len(value) and value[p] == item[1]}
    return len(value) in reachable


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("pattern", "value", "truth"),
    [
        ("%a%a%a%b", "a" * FOUR_MIB, False),
        ("%a%a%a%b", "a" * FOUR_MIB + "b", True),
        ("%Park%Downs%", "Park " * (FOUR_MIB // 5), False),
        ("%Park%Downs%", "Park " * (FOUR_MIB // 5) + "Downs", True),
        ("%_%_%_%_b", "a" * FOUR_MIB, False),
        ("%a_a_a_a_b%", "a" * FOUR_MIB, False),
        ("%a_b%", "ab" * (FOUR_MIB // 2), False),  # every run found, never aligned
        ("%a_b_a_b_c%", "ab" * (FOUR_MIB // 2), False),
        ("%a_b_a_b_c%", "ab" * (FOUR_MIB // 2) + "acbcc", False),
        ("%a_b_a_b_c%", "ab" * (FOUR_MIB // 2) + "a!b!a!b!c", True),
        ("%" + "a_" * 500 + "b%", "a" * FOUR_MIB, False),
        ("%" + "a_" * 500 + "b%", "ab" * (FOUR_MIB // 2), False),
        ("_" * 1000 + "%" + "_" * 1000, "x" * FOUR_MIB, True),
        ("%" + "_%" * 500 + "b", "a" * FOUR_MIB, False),
    ],
)
def test_like_on_a_4_mib_value_with_adversarial_patterns_finishes(
    pattern: str, value: str, truth: bool
) -> None:
    assert like(pattern, value) is truth


@pytest.mark.timeout(120)
def test_like_with_many_middle_segments_on_a_4_mib_value_finishes() -> None:
    pattern = "%" + "%".join(f"k{i}_z" for i in range(200)) + "%"
    near_misses = "".join(f"k{i}xy" for i in range(200)) * (FOUR_MIB // 1500)
    assert like(pattern, near_misses) is False
    assert like(pattern, near_misses + "".join(f"k{i}xz" for i in range(200))) is True


@pytest.mark.parametrize(
    ("pattern", "value", "truth"),
    [
        ("a_c", "abc", True),
        ("a_c", "ac", False),
        ("%b_d%", "abd", False),
        ("%b_d%", "abxdz", True),
        ("_%_", "a", False),
        ("_%_", "ab", True),
        ("ab%ba", "aba", False),  # the two ends may not overlap
        ("ab%ba", "abba", True),
        ("%ab%ab%", "abab", True),
        ("%ab%ab%", "aba", False),
        ("%aa%aa%", "aaa", False),
        ("%aa%aa%", "aaaa", True),
        ("%a_a%", "aaa", True),
        ("%a_a%b", "aaab", True),
        ("%a_a%b", "aab", False),
    ],
)
def test_segments_between_wildcards(pattern: str, value: str, truth: bool) -> None:
    assert like(pattern, value) is truth
    assert LikePattern.parse(pattern).matches(value) is truth


def test_escaped_wildcards_inside_middle_segments_are_literal() -> None:
    assert like("%!%_!_%", "x%y_z", escape="!") is True
    assert like("%!%_!_%", "x%yyz", escape="!") is False
    assert like("%!%%", "100%", escape="!") is True
    assert like("%!%%", "100", escape="!") is False


_ALPHABET = "ab%_!"


@settings(max_examples=1500, deadline=None)
@given(
    pattern=st.text(_ALPHABET, max_size=10),
    value=st.text("ab%_!", max_size=14),
    escape=st.sampled_from([None, "!", "%", "_", "a"]),
)
def test_matcher_agrees_with_the_reference(pattern: str, value: str, escape: str | None) -> None:
    expected = reference(pattern, value, escape)
    assert like_matcher(pattern, escape)(value) is expected
    assert LikePattern.parse(pattern, escape).matches(value) is expected
