"""A deterministic simulation of the SIS Sportsdata feed for UK and Irish racing days.

`generate_feed(seed, messages)` yields exactly `messages` messages, lazily, in time order. The
same arguments give byte-identical output (message ids included: they come from a seeded RNG),
so a feed can be regenerated instead of stored.

How a feed is built, and where:
- `day_plan.py`: the regular ("base") messages come from racing days. A day is planned up
  front (meetings, races, and the time and kind of every message for every race) and sorted
  by time. Only one day's plan is held in memory; a long feed is a run of consecutive days of
  about 12,000 messages each.
- `events.py`: the day's model (meetings, races, markets) and the planned actions.
- `writer.py`: each planned action is rendered one message at a time against the simulator's
  own model of each master (`simulator/model.py`), so each selector names a node that exists
  in the master at that point.
- `simulator.py`: the stream. Invalid messages and redelivered duplicates are mixed in with
  selection sampling, so exactly the requested number of each lands at random positions.
- An invalid patch (`unlocated-node`, `invalid-result`) is never applied by the consumer, and it
  makes the master stale (docs/feed.md, "Invalid messages and items"): updates to that
  master are dead-lettered as `master-stale` until the next master message for it. The
  simulator therefore turns one of the race's next few messages into a master `refresh`
  carrying its model, after which the consumer's master and the model agree again.
- `message.py`: the message record, its kind labels, and the shared defaults.
"""

from sis_platform.simulator.generator.message import (
    DAY_MESSAGES,
    DEFAULT_MAX_BYTES,
    DEFAULT_START,
    DUPLICATE_WINDOW,
    INVALID_PREFIX,
    INVALID_REASONS,
    KIND_DUPLICATE,
    KIND_MASTER_NEW,
    KIND_MASTER_REFRESH,
    KIND_UPDATE,
    MIN_MAX_BYTES,
    STALE_MAKING_REASONS,
    SimulatedMessage,
)
from sis_platform.simulator.generator.simulator import FeedSimulator, generate_feed

__all__ = [
    "DAY_MESSAGES",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_START",
    "DUPLICATE_WINDOW",
    "INVALID_PREFIX",
    "INVALID_REASONS",
    "KIND_DUPLICATE",
    "KIND_MASTER_NEW",
    "KIND_MASTER_REFRESH",
    "KIND_UPDATE",
    "MIN_MAX_BYTES",
    "STALE_MAKING_REASONS",
    "FeedSimulator",
    "SimulatedMessage",
    "generate_feed",
]
