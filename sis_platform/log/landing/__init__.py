"""The landing zone: immutable, durable batches of raw messages, the platform's source of truth.

Intake gets messages under syncpoint, writes them here and only then commits the queue's unit
of work (docs/design.md invariant 1, "No loss"). Every file is written to a temporary name,
fsync'd, claimed with a hard link (which fails rather than overwrite) and its folder fsync'd, so
after a crash a file either exists whole or not at all. Everything downstream is a pure function
of these files, which is what makes partitions re-materializable without touching the queue.

Batches are numbered 1, 2, 3, ... with no gaps; the batch key is that number zero-padded to ten
digits, so that keys sort in landing order (they are Dagster partition keys). A batch has one of
two forms:
- one file `batches/<key>.parquet`, landed whole by `ZoneWriter.land` (the sensor's intake);
- a folder `batches/<key>/` of parts `part-<nnnnn>.parquet`, one per group a resident consumer
  lands (`GroupWriter`), sealed when the batch reaches a bound; until sealed it is open and not
  yet a landed batch (`Catalog.keys`).
Both hold the same rows: the same LANDING_SCHEMA, `msg_seq` running across a batch's parts.

With a consumer lease (`sis_platform.intake.lease`), landing takes a `Fence`: every claim happens
under the lease lock and only while the caller's fencing token is current, so a holder that lost the
lease lands nothing (`FencedOff`). The token and holder are recorded in each file's Parquet
key-value metadata (`sis:fence_token`, `sis:lease_holder`).

Each message carries a hash chain link over every logged field (sis_platform/log/chain.py),
starting from the last link of the previous batch (32 zero bytes for the first batch). A batch's
head is anchored in its file's metadata (`sis:chain_head`, `sis:chain_first_prev`,
`sis:messages`, `sis:chain_format`; in a part: the running values of its batch so far) and, under
the same fence, in an append-only anchor file `anchors/<key>.json` (why there: logchain.py),
written right after a one-file batch's claim, or when a batch in parts is sealed.

A body over the per-message bound (SIS_MAX_MESSAGE_BYTES) never enters a batch: `move_aside`
writes it durably to `overflow/<sha256>.body` (content-addressed, mode 0600) and the batch holds
a row with an empty body, the real size and digest, and that file's path (`body_location`).

`LogPosition` names a message's place in the log; `Catalog.landed_after` reads the log back
from one, for a fold that resumes where it stopped.

Once sealed, a batch in parts is merged into the one-file form (`merge`: the same rows, links
and signed anchor), and its parts folder removed after a grace.

Modules: `rows` (records, schema, building and writing linked rows), `layout` (`ZoneLayout`:
where things are), `signing` (`AnchorSigner`), `catalog` (`Catalog`: what is landed, read
back), `writer` (`ZoneWriter`: landing a batch as one file, overflow, recovery), `groups`
(`GroupWriter`, sealing), `upkeep` (`Upkeep`: merge and expiry), `reading` (`landed_after`),
`merge` (`Merger`, `merge_zone`), `expiry` (`Expirer`), `zone` (`LandingZone`: the parts
wired over one root). No Dagster or Spark import:
intake uses this in the sensor's process and `sis-live` in its own.
"""

from sis_platform.log.chain import GENESIS_LINK, chain_link
from sis_platform.log.landing.catalog import Catalog, Tail
from sis_platform.log.landing.groups import GroupWriter
from sis_platform.log.landing.reading import LandedMessage
from sis_platform.log.landing.rows import (
    BATCH_KEY_RE,
    CHAIN_FIRST_PREV_KEY,
    CHAIN_FORMAT_KEY,
    CHAIN_HEAD_KEY,
    CLOSED_BY_KEY,
    FENCE_TOKEN_KEY,
    LANDING_SCHEMA,
    LEASE_HOLDER_KEY,
    MESSAGES_KEY,
    START_POSITION,
    ClosedBy,
    LandedBatch,
    LandedGroup,
    LogPosition,
    MovedAside,
    OpenBatch,
    OverflowBody,
    batch_key,
    batch_seq_of,
    landing_bytes_bound,
)
from sis_platform.log.landing.upkeep import Upkeep
from sis_platform.log.landing.writer import LandingFull, ZoneWriter
from sis_platform.log.landing.zone import LandingZone

__all__ = [
    "BATCH_KEY_RE",
    "CHAIN_FIRST_PREV_KEY",
    "CHAIN_FORMAT_KEY",
    "CHAIN_HEAD_KEY",
    "CLOSED_BY_KEY",
    "FENCE_TOKEN_KEY",
    "GENESIS_LINK",
    "LANDING_SCHEMA",
    "LEASE_HOLDER_KEY",
    "MESSAGES_KEY",
    "START_POSITION",
    "Catalog",
    "ClosedBy",
    "GroupWriter",
    "LandedBatch",
    "LandedGroup",
    "LandedMessage",
    "LandingFull",
    "LandingZone",
    "LogPosition",
    "MovedAside",
    "OpenBatch",
    "OverflowBody",
    "Tail",
    "Upkeep",
    "ZoneWriter",
    "batch_key",
    "batch_seq_of",
    "chain_link",
    "landing_bytes_bound",
]
