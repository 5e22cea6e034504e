"""Small hand-written Sportsdata messages for the domain tests."""

from __future__ import annotations

ASCOT_1430 = "ASC-20261121-1430"
ASCOT_1500 = "ASC-20261121-1500"
ROMFORD_1912 = "ROM-20261121-1912"

WIN_MARKET = (
    '<market id="WIN" type="win" status="open">'
    '<selection id="3" number="3" name="Blue Moon" status="runner" jockey="A. Rider">'
    '<price num="5" den="2"/>'
    "</selection>"
    '<selection id="7" number="7" name="Red Rum" status="runner">'
    '<price num="7" den="1" at="2026-11-21T13:00:00Z"/>'
    "</selection>"
    "</market>"
)


def event(
    master_id: str = ASCOT_1430,
    *,
    sport: str = "horse-racing",
    country: str = "GB",
    course: str = "Ascot",
    name: str | None = None,
    start: str = "2026-11-21T14:30:00Z",
    status: str = "dormant",
    going: str | None = "good",
    extra: str = "",
    markets: str = WIN_MARKET,
) -> str:
    going_attribute = "" if going is None else f' going="{going}"'
    return (
        f'<event id="{master_id}" sport="{sport}" country="{country}" course="{course}"'
        f' name="{name or master_id}" start="{start}" status="{status}"{going_attribute}{extra}>'
        f"{markets}</event>"
    )


def master(
    *events: str,
    ids: str | None = None,
    type: str = "new",
    sent: str | None = "2026-11-21T12:00:00Z",
    extra: str = "",
) -> bytes:
    """A master message; `ids` defaults to the events' ids in order."""
    if ids is None:
        ids = " ".join(e.split('id="', 1)[1].split('"', 1)[0] for e in events)
    sent_attribute = "" if sent is None else f' sent="{sent}"'
    return (
        f'<sportsdata category="master" type="{type}" id="{ids}"{sent_attribute}{extra}>'
        + "".join(events)
        + "</sportsdata>"
    ).encode()


def update(ids: str, *operations: str, extra: str = "") -> bytes:
    return (
        f'<sportsdata category="update" id="{ids}"{extra}>' + "".join(operations) + "</sportsdata>"
    ).encode()


GO_SOFT = '<replace sel="/event/@going">soft</replace>'
PRICE_7_TO_9 = "<replace sel=\"/event/market[@id='WIN']/selection[@id='7']/price/@num\">9</replace>"
MISSING_NODE = "<replace sel=\"/event/market[@id='PLACE']/@status\">closed</replace>"
