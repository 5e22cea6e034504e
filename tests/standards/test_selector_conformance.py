"""Every JMS 1.1 selector vector transcribed from peer implementations (jms-selectors.json).

Each case runs. A case whose `expected` we deliberately do not follow is listed in DEVIATIONS
with the reason, and OUR_OUTCOME says what we assert for it instead: "invalid" (rejected at
compile time) or the three-valued result of `evaluate()` (True, False, None for UNKNOWN).
"""

from __future__ import annotations

from typing import Any

import pytest

from sis_platform.standards.selector import InvalidSelector, Selector
from tests.vectors import load_conformance

VECTORS = load_conformance("jms-selectors.json")
CASES: list[dict[str, Any]] = VECTORS["cases"]

_DIVISION = (
    "'/' divides in double precision also for two exact operands, as ActiveMQ, Artemis and "
    "Qpid Broker-J do (and the ActiveMQ broker behind the stomp source); qpid-cpp's integer "
    "division (17/4 = 4) is the outlier"
)
_ESCAPE_PERCENT = (
    "ESCAPE '%' is accepted with ActiveMQ/Artemis semantics (the escape character escapes only "
    "a following '%', '_' or itself), which cases sel-0111 and sel-0113..0116 rely on; "
    "qpid-cpp rejects it. A is NULL here, so the selector is UNKNOWN"
)
_STRING_ORDERING = (
    "JMS 1.1 3.8.1.1 restricts string comparison to = and <>: a string literal with < or > "
    "is rejected at compile time, as ActiveMQ and Artemis do; qpid-cpp evaluates it as false"
)
_BETWEEN_TYPES = (
    "JMS 1.1 3.8.1.1 defines BETWEEN on arithmetic expressions (>= AND <=): a string or "
    "boolean literal operand is rejected at compile time, as ActiveMQ does; qpid-cpp evaluates "
    "it (and its NOT BETWEEN then selects a type mismatch, which the spec's "
    "'x < a OR x > b' never does)"
)

DEVIATIONS: dict[str, str] = {
    "sel-0621": _DIVISION,
    "sel-0569": _ESCAPE_PERCENT,
    "sel-0643": _STRING_ORDERING,
    "sel-0644": _STRING_ORDERING,
    "sel-0646": _STRING_ORDERING,
    "sel-0666": _BETWEEN_TYPES,
    "sel-0667": _BETWEEN_TYPES,
    "sel-0668": _BETWEEN_TYPES,
    "sel-0669": _BETWEEN_TYPES,
    "sel-0670": _BETWEEN_TYPES,
    "sel-0671": _BETWEEN_TYPES,
    "sel-0672": _BETWEEN_TYPES,
    "sel-0673": _BETWEEN_TYPES,
}

OUR_OUTCOME: dict[str, object] = {
    "sel-0621": False,  # 17/4 = 4.25, not 4
    "sel-0569": None,
    "sel-0643": "invalid",
    "sel-0644": "invalid",
    "sel-0646": "invalid",
    "sel-0666": "invalid",
    "sel-0667": "invalid",
    "sel-0668": "invalid",
    "sel-0669": "invalid",
    "sel-0670": "invalid",
    "sel-0671": "invalid",
    "sel-0672": "invalid",
    "sel-0673": "invalid",
}

_TRUTH = {"true": True, "false": False, "unknown": None}
_EXACT = {"byte", "short", "int", "long"}
_APPROXIMATE = {"float", "double"}


def _message(case: dict[str, Any]) -> dict[str, object]:
    """The case's properties and headers as the plain Python values the platform passes."""
    message: dict[str, object] = {}
    for name, typed in case["properties"].items():
        kind, value = typed["type"], typed["value"]
        if kind in _EXACT:
            message[name] = int(value)
        elif kind in _APPROXIMATE:
            message[name] = float(value)
        elif kind == "boolean":
            message[name] = bool(value)
        elif kind == "string":
            message[name] = str(value)
        else:
            raise AssertionError(f"{case['id']}: unknown property type {kind}")
    message.update(case["headers"])
    return message


def _outcome(selector_text: str, message: dict[str, object]) -> object:
    try:
        selector = Selector.compile(selector_text)
    except InvalidSelector:
        return "invalid"
    return selector.evaluate(message)


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_conformance_case(case: dict[str, Any]) -> None:
    message = _message(case)
    if case["id"] in DEVIATIONS:
        assert _outcome(case["selector"], message) == OUR_OUTCOME[case["id"]]
        return
    if case["expected"] == "invalid":
        with pytest.raises(InvalidSelector):
            Selector.compile(case["selector"])
        return
    selector = Selector.compile(case["selector"])
    assert selector.matches(message) is case["expected"]
    if "truth" in case:
        assert selector.evaluate(message) is _TRUTH[case["truth"]]


def test_vector_file_has_every_case() -> None:
    assert len(CASES) == 812
    assert len({case["id"] for case in CASES}) == len(CASES)


def test_deviations_name_real_cases_and_really_deviate() -> None:
    by_id = {case["id"]: case for case in CASES}
    assert DEVIATIONS.keys() == OUR_OUTCOME.keys()
    for case_id, ours in OUR_OUTCOME.items():
        case = by_id[case_id]
        matches = ours is True
        assert ours != case["expected"] and (ours == "invalid" or matches != case["expected"])


def test_deviations_are_only_extensions_or_cases_peers_disagree_on() -> None:
    # A plain JMS 1.1 case that every peer agrees on is never a deviation.
    by_id = {case["id"]: case for case in CASES}
    for case_id in DEVIATIONS:
        assert by_id[case_id].get("extension") or by_id[case_id].get("uncertain"), case_id
