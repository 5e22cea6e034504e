"""The event model of a racing day as the generator plans it: meetings, races and their
markets, the planned actions (what each base message will do, and when), and the random
names and prices an event is built from."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from datetime import date
from enum import IntEnum
from typing import Final, NamedTuple

from sis_platform.simulator.model import (
    LADDER,
    LADDER_INDEX,
    PLACE_RUNG,
    Event,
    Market,
    Price,
    Selection,
)
from sis_platform.simulator.names import (
    GREYHOUND_DISTANCES,
    GREYHOUND_GRADES,
    GREYHOUND_PREFIXES,
    GREYHOUND_SUFFIXES,
    HORSE_NAME_FIRST,
    HORSE_NAME_SECOND,
    HORSE_RACE_SPONSORS,
    HORSE_RACE_TYPES,
    INITIALS,
    SURNAMES,
    Course,
)


class ActionKind(IntEnum):
    """What one planned base message does."""

    NEW = 0
    REFRESH = 1
    ACTIVE = 2
    PRICE = 3
    NONRUNNER = 4
    RESERVE = 5
    SUSPEND = 6
    OPEN = 7
    ADD_MARKET = 8
    OFF = 9
    RESULT = 10
    FINISHED = 11
    GOING = 12


class Action(NamedTuple):
    """One planned base message. A day's actions sort by time, then by the order they were
    planned in (`seq`, unique within the day)."""

    at: int  # UTC epoch seconds
    seq: int
    kind: ActionKind
    races: tuple[int, ...]  # indexes of the races it is about, in the day's list


MARKET_IDS: Final[dict[str, str]] = {
    "win": "WIN",
    "place": "PLACE",
    "each-way": "EW",
    "forecast": "FC",
}
HORSE_MARKET_ORDER: Final = ("win", "each-way", "place", "forecast")
GREYHOUND_MARKET_ORDER: Final = ("win", "forecast", "place")


@dataclass(slots=True)
class Meeting:
    """One meeting (a course's card for the day) and the indexes of its races."""

    course: Course
    horse: bool
    going_scale: tuple[str, ...]
    going_index: int
    races: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Race:
    """One race: the simulator's model of its master, and where it stands in the feed."""

    event: Event
    meeting: Meeting
    horse: bool
    places: int
    new_at: int
    off_at: int  # actual off (the scheduled one is the event's start)
    created: bool = False
    stale: bool = False
    # Convertible (single-id, non-new) messages of this race still to come in the plan.
    remaining: int = 0
    # When > 0: the countdown-th next convertible message becomes a master refresh.
    refresh_countdown: int = 0


@dataclass(slots=True)
class Day:
    """One planned racing day: its races, its actions in time order, and how far the feed has
    got through them (`cursor`; `created` lists the races whose master has been sent)."""

    day: date
    races: list[Race]
    actions: list[Action]
    cursor: int = 0
    created: list[int] = field(default_factory=list)


class BuiltEvent(NamedTuple):
    event: Event
    places: int  # the number of places paid in place and each-way markets


def iso_utc(t: int) -> str:
    """Epoch seconds as the feed writes a UTC time."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def horse_name(rng: random.Random) -> str:
    return f"{rng.choice(HORSE_NAME_FIRST)} {rng.choice(HORSE_NAME_SECOND)}"


def greyhound_name(rng: random.Random) -> str:
    return f"{rng.choice(GREYHOUND_PREFIXES)} {rng.choice(GREYHOUND_SUFFIXES)}"


def person(rng: random.Random) -> str:
    return f"{rng.choice(INITIALS)} {rng.choice(SURNAMES)}"


def market_for(
    market_type: str, status: str, places: int, runners: list[Selection], rungs: list[int]
) -> Market:
    """A market over the race's runners. Jockey and trainer are only carried in the win market;
    place odds are a quarter of the win odds; forecast selections have no fixed price."""
    market = Market(
        MARKET_IDS[market_type],
        market_type,
        status,
        places if market_type in ("place", "each-way") else None,
    )
    for runner, rung in zip(runners, rungs, strict=True):
        copy = runner.copy()
        if market_type != "win":
            copy.jockey = None
            copy.trainer = None
        if market_type == "forecast" or copy.price is None:
            copy.price = None
        else:
            num, den = LADDER[PLACE_RUNG[rung] if market_type == "place" else rung]
            copy.price = Price(num, den, copy.price.at)
        market.selections[copy.id] = copy
    return market


def build_event(
    rng: random.Random,
    meeting: Meeting,
    event_id: str,
    start: str,
    at: str,
) -> BuiltEvent:
    """A race's event as first published: its runners with prices from `at`, and markets
    (all suspended), drawn for the meeting's kind of racing."""
    horse = meeting.horse
    if horse:
        n = rng.choice((6, 7, 8, 8, 9, 9, 10, 10, 11, 12, 12, 13, 14, 15, 16))
        name = f"{rng.choice(HORSE_RACE_SPONSORS)} {rng.choice(HORSE_RACE_TYPES)}"
        if rng.random() < 0.4:
            name += f" (Class {rng.randint(1, 6)})"
        places = 2 if n <= 7 else 3 if n <= 15 else 4
        fav = rng.randint(LADDER_INDEX[(5, 4)], LADDER_INDEX[(4, 1)])
        steps = (0, 1, 1, 2, 2, 3)
    else:
        n = 6
        name = (
            f"{rng.choice(HORSE_RACE_SPONSORS)} {rng.choice(GREYHOUND_GRADES)} Stakes "
            f"{rng.choice(GREYHOUND_DISTANCES)}m"
        )
        places = 2
        fav = rng.randint(LADDER_INDEX[(1, 1)], LADDER_INDEX[(5, 2)])
        steps = (0, 1, 2, 2, 3, 4)
    rungs = [fav]
    for _ in range(n - 1):
        rungs.append(min(len(LADDER) - 1, rungs[-1] + rng.choice(steps)))
    rng.shuffle(rungs)

    names: set[str] = set()
    runners: list[Selection] = []
    for number in range(1, n + 1):
        runner_name = horse_name(rng) if horse else greyhound_name(rng)
        while runner_name in names:
            runner_name = horse_name(rng) if horse else greyhound_name(rng)
        names.add(runner_name)
        num, den = LADDER[rungs[number - 1]]
        runners.append(
            Selection(
                str(number),
                runner_name,
                "runner",
                number,
                person(rng) if horse else None,
                person(rng),
                Price(num, den, at),
            )
        )

    if horse:
        types = ["win"]
        if rng.random() < 0.8:
            types.append("each-way")
        if rng.random() < 0.5:
            types.append("place")
        if rng.random() < 0.5:
            types.append("forecast")
    else:
        types = ["win"]
        if rng.random() < 0.85:
            types.append("forecast")
        if rng.random() < 0.3:
            types.append("place")
    course = meeting.course
    event = Event(
        event_id,
        "horse-racing" if horse else "greyhounds",
        course.country,
        course.name,
        name,
        start,
        "dormant",
        meeting.going_scale[meeting.going_index],
    )
    for market_type in types:
        market = market_for(market_type, "suspended", places, runners, rungs)
        event.markets[market.id] = market
    return BuiltEvent(event, places)
