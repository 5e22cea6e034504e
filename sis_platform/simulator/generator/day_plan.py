"""Planning one racing day up front: its meetings and races, and the time and kind of every
base message about them, sorted into the day's timeline (`plan_day`).

Every draw comes from one RNG seeded by the feed's seed and the day's index, in a fixed order,
so a day's plan depends on nothing else.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Final, NamedTuple

from sis_platform.simulator.generator.events import (
    GREYHOUND_MARKET_ORDER,
    HORSE_MARKET_ORDER,
    MARKET_IDS,
    Action,
    ActionKind,
    Day,
    Meeting,
    Race,
    build_event,
    iso_utc,
)
from sis_platform.simulator.generator.message import DAY_MESSAGES
from sis_platform.simulator.names import (
    ALL_WEATHER_CODES,
    GOING_ALL_WEATHER,
    GOING_GREYHOUND,
    GOING_TURF,
    GREYHOUND_COURSES,
    HORSE_COURSES,
    Course,
)


class _Card(NamedTuple):
    """The kind of one meeting of the day."""

    horse: bool  # horse racing, else greyhounds
    session: str  # "morning", "afternoon" or "evening"


# A realistic full day of meetings.
_FULL_DAY: Final[tuple[_Card, ...]] = (
    *(_Card(True, "afternoon"),) * 4,
    *(_Card(True, "evening"),) * 2,
    *(_Card(False, "morning"),) * 3,
    *(_Card(False, "afternoon"),) * 4,
    *(_Card(False, "evening"),) * 4,
)
_LAST_RACE_MINUTE: Final = 22 * 60 + 45


def uk_utc_offset_hours(day: date) -> int:
    """Hours UK and Irish local time is ahead of UTC on `day` (BST/IST from the last Sunday
    of March to the last Sunday of October). Written out rather than read from the system's
    tz database so output does not depend on the machine. Racing never runs at 01:00 UTC, when
    the clocks change, so one offset holds for the whole racing day."""

    def last_sunday(month: int) -> date:
        last = date(day.year, month, 31)
        return last - timedelta(days=(last.weekday() + 1) % 7)

    return 1 if last_sunday(3) <= day < last_sunday(10) else 0


def _first_race_minute(rng: random.Random, horse: bool, session: str) -> int:
    if horse:
        if session == "afternoon":
            return 12 * 60 + 15 + 5 * rng.randint(0, 19)
        return 16 * 60 + 30 + 5 * rng.randint(0, 18)
    if session == "morning":
        return 10 * 60 + 45 + rng.randint(0, 45)
    if session == "afternoon":
        return 13 * 60 + rng.randint(0, 90)
    return 18 * 60 + rng.randint(0, 75)


@dataclass(slots=True)
class _Plan:
    """A day being planned: the races, meetings and actions drawn so far."""

    rng: random.Random
    day: date
    max_bytes: int
    day_epoch: int  # midnight UTC, epoch seconds
    offset: int  # hours local time is ahead of UTC
    races: list[Race] = field(default_factory=list)
    meetings: list[Meeting] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)

    def add(self, t: int, kind: ActionKind, races: tuple[int, ...]) -> None:
        """Plan a message at `t`; ties in time keep the order they were planned in."""
        self.actions.append(Action(t, len(self.actions), kind, races))


def plan_day(seed: int, day_index: int, day: date, budget: int, max_bytes: int) -> Day:
    """Plan one racing day of exactly `budget` base messages (fewer only if even one race's
    fixed messages do not fit, in which case the day is cut short in time order: a prefix of
    a valid feed is valid)."""
    rng = random.Random(f"sis-feed/{seed}/day/{day_index}")
    day_epoch = int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp())
    plan = _Plan(rng, day, max_bytes, day_epoch, uk_utc_offset_hours(day))

    # Fewer, shorter races for small budgets; about 70 messages a race on a full day.
    per_race = 20 + 50 * min(1.0, budget / DAY_MESSAGES)
    _plan_meetings(plan, max(1, round(budget / per_race)))
    for index in range(len(plan.races)):
        _plan_race_messages(plan, index)
    for meeting in plan.meetings:
        _plan_meeting_messages(plan, meeting)
    _plan_price_moves(plan, budget - len(plan.actions))

    actions = plan.actions
    actions.sort()
    del actions[budget:]
    for action in actions:
        if action.kind not in (ActionKind.NEW, ActionKind.GOING) and len(action.races) == 1:
            plan.races[action.races[0]].remaining += 1
    return Day(day, plan.races, actions)


def _plan_meetings(plan: _Plan, target_races: int) -> None:
    """Draw the day's meetings, a realistic mix of horse and greyhound cards, until there are
    `target_races` races or no course is left."""
    rng = plan.rng
    specs = list(_FULL_DAY)
    rng.shuffle(specs)
    horse_courses = list(HORSE_COURSES)
    greyhound_courses = list(GREYHOUND_COURSES)
    rng.shuffle(horse_courses)
    rng.shuffle(greyhound_courses)

    spec_index = 0
    while len(plan.races) < target_races and (horse_courses or greyhound_courses):
        if spec_index < len(specs):
            horse, session = specs[spec_index]
        else:  # a very busy day: more cards, from whichever courses are left
            horse = not greyhound_courses
            session = ("morning", "afternoon", "evening")[spec_index % 3]
            if horse and session == "morning":
                session = "afternoon"
        spec_index += 1
        pool = horse_courses if horse else greyhound_courses
        if not pool:
            continue
        _plan_meeting(plan, pool.pop(), horse, session, target_races - len(plan.races))


def _plan_meeting(plan: _Plan, course: Course, horse: bool, session: str, max_races: int) -> None:
    """One meeting of at most `max_races` races: its races, and the master `new` messages that
    publish its card."""
    rng = plan.rng
    if horse:
        scale = GOING_ALL_WEATHER if course.code in ALL_WEATHER_CODES else GOING_TURF
        weights = (1, 2, 4, 3, 2, 1)[: len(scale)]
        going_index = rng.choices(range(len(scale)), weights=weights)[0]
        n_races = rng.choice((6, 7, 7, 7, 8))
    else:
        scale = GOING_GREYHOUND
        going_index = 2
        n_races = rng.randint(10, 14)
    n_races = min(n_races, max_races)
    meeting = Meeting(course, horse, scale, going_index)

    # Off times (local minutes), and when the card is published: hours before the first
    # race, as one multi-id master `new` for some meetings, race by race otherwise.
    minute = _first_race_minute(rng, horse, session)
    minutes: list[int] = []
    while len(minutes) < n_races and minute <= _LAST_RACE_MINUTE:
        minutes.append(minute)
        minute += rng.choice((30, 30, 35)) if horse else rng.randint(15, 18)
    offset_seconds = plan.offset * 3600
    first_off = plan.day_epoch + minutes[0] * 60 - offset_seconds
    card_at = first_off - (rng.randint(150, 300) if horse else rng.randint(45, 120)) * 60
    card_iso = iso_utc(card_at)
    tz = f"+{plan.offset:02d}:00"
    ymd = plan.day.strftime("%Y%m%d")
    races = plan.races
    new_at = card_at
    for minute in minutes:
        hhmm = f"{minute // 60:02d}{minute % 60:02d}"
        start = f"{plan.day.isoformat()}T{hhmm[:2]}:{hhmm[2:]}:00{tz}"
        event, places = build_event(rng, meeting, f"{course.code}-{ymd}-{hhmm}", start, card_iso)
        late = rng.randint(0, 150) if horse else rng.randint(0, 40)
        off_at = plan.day_epoch + minute * 60 - offset_seconds + late
        meeting.races.append(len(races))
        races.append(Race(event, meeting, horse, places, new_at, off_at))
        new_at += rng.randint(2, 15)
    plan.meetings.append(meeting)

    multi_card = (
        len(meeting.races) > 1
        and rng.random() < 0.3
        and sum(len(races[i].event.xml()) for i in meeting.races) < plan.max_bytes // 4
    )
    if multi_card:
        for index in meeting.races:
            races[index].new_at = card_at
        plan.add(card_at, ActionKind.NEW, tuple(meeting.races))
    else:
        for index in meeting.races:
            plan.add(races[index].new_at, ActionKind.NEW, (index,))


def _plan_race_messages(plan: _Plan, index: int) -> None:
    """A race's fixed messages: active, non-runners (a greyhound reserve), a suspension, a late
    market, the occasional refresh, the off, the result and finished."""
    rng = plan.rng
    race = plan.races[index]
    one = (index,)
    new_at, off = race.new_at, race.off_at
    lead = rng.randint(40, 75) if race.horse else rng.randint(12, 25)
    active_at = max(new_at + 120, off - lead * 60)
    plan.add(active_at, ActionKind.ACTIVE, one)
    if race.horse:
        nonrunners = rng.choices((0, 1, 2, 3), weights=(55, 30, 12, 3))[0]
        n_runners = len(race.event.markets["WIN"].selections)
        for _ in range(min(nonrunners, n_runners - 4)):
            plan.add(rng.randint(new_at + 60, off - 300), ActionKind.NONRUNNER, one)
    elif rng.random() < 0.12:
        withdrawn_at = rng.randint(new_at + 60, off - 300)
        plan.add(withdrawn_at, ActionKind.NONRUNNER, one)
        if rng.random() < 0.6 and withdrawn_at + 60 < off - 120:
            plan.add(rng.randint(withdrawn_at + 60, off - 120), ActionKind.RESERVE, one)
    if rng.random() < 0.3 and active_at + 30 < off - 300:
        suspended_at = rng.randint(active_at + 30, off - 300)
        plan.add(suspended_at, ActionKind.SUSPEND, one)
        plan.add(min(suspended_at + rng.randint(30, 180), off - 60), ActionKind.OPEN, one)
    order = HORSE_MARKET_ORDER if race.horse else GREYHOUND_MARKET_ORDER
    missing = [m for m in order if MARKET_IDS[m] not in race.event.markets]
    if missing and rng.random() < 0.06 and active_at + 30 < off - 300:
        plan.add(rng.randint(active_at + 30, off - 300), ActionKind.ADD_MARKET, one)
    if rng.random() < 0.03:
        plan.add(rng.randint(new_at + 60, off - 120), ActionKind.REFRESH, one)
    plan.add(off, ActionKind.OFF, one)
    result_at = off + (rng.randint(70, 480) if race.horse else rng.randint(25, 45))
    result_at += rng.randint(20, 90)
    plan.add(result_at, ActionKind.RESULT, one)
    plan.add(result_at + rng.randint(120, 600), ActionKind.FINISHED, one)


def _plan_meeting_messages(plan: _Plan, meeting: Meeting) -> None:
    """Meeting-level multi-id messages: going changes for every race still to run, and the
    occasional refresh of the next few races in one message."""
    rng, races = plan.rng, plan.races
    card_at = races[meeting.races[0]].new_at
    last_off = races[meeting.races[-1]].off_at

    def still_to_run(t: int) -> tuple[int, ...]:
        return tuple(
            i for i in meeting.races if races[i].new_at <= t - 1 and races[i].off_at >= t + 60
        )

    changes = rng.choices((0, 1, 2), weights=(50, 35, 15) if meeting.horse else (80, 20, 0))
    for _ in range(changes[0]):
        if card_at + 600 >= last_off - 1800:
            break
        t = rng.randint(card_at + 600, last_off - 1800)
        ids = still_to_run(t)
        if ids:
            plan.add(t, ActionKind.GOING, ids)
    if rng.random() < 0.15 and card_at + 600 < last_off - 600:
        t = rng.randint(card_at + 600, last_off - 600)
        ids = still_to_run(t)[: rng.randint(2, 3)]
        if len(ids) >= 2:
            plan.add(t, ActionKind.REFRESH, ids)


def _plan_price_moves(plan: _Plan, spare: int) -> None:
    """Price moves fill the rest of the budget (`spare` messages), more for horse races,
    denser towards the off."""
    if spare <= 0:
        return
    rng, races = plan.rng, plan.races
    activity = [(1.5 if r.horse else 1.0) * rng.uniform(0.5, 1.5) for r in races]
    total = sum(activity)
    quotas = [spare * a / total for a in activity]
    counts = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(races)), key=lambda i: counts[i] - quotas[i])
    for i in by_remainder[: spare - sum(counts)]:
        counts[i] += 1
    for index, (race, count) in enumerate(zip(races, counts, strict=True)):
        lo, hi = race.new_at + 30, race.off_at - 1
        for _ in range(count):
            plan.add(hi - int((hi - lo) * rng.random() ** 2), ActionKind.PRICE, (index,))
