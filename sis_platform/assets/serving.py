"""The serving store in the asset graph (live intake only): its asset spec and its two checks.

`serving_store` is the store sis-live keeps (docs/serving.md): downstream of the landed message
log, never materialized by a run. The reporter sensor (sis_platform/sensors/serving_reporter.py)
records its progress as runless materializations.

- `live_matches_lake` (docs/design.md invariant 7): every master the lake has folded has, in the
  store at the lake's fold position, the same version and the same document (sha256). Run by
  its own job (`check_live_matches_lake`), which a sensor requests when the lake's fold has
  advanced (at most every few minutes), or from the UI. A pass records the lake's position in
  the store (`ServingWriter.record_checked`): sis-live prunes the store's history only up to it.
- `live_store_fresh`: landed messages do not wait for the store longer than
  SIS_LIVE_MAX_LAG_SECONDS. The reporter sensor evaluates it every few seconds and reports its
  result without a run whenever it changes; executing it from the UI sees only whether the
  store is stalled now (`assess_freshness`).

Severities: a lag (the store commits, but messages landed more than SIS_LIVE_MAX_LAG_SECONDS
ago are not applied yet) is a WARN: Opportunity Management gets every change, late. A stall
(messages wait and the store has had neither a commit nor a heartbeat for that long: sis-live
is down or the store is unavailable) is an ERROR, as is any live != lake difference.

No `from __future__ import annotations`: Dagster reads the checks' context annotations at
definition time.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import functions as F

from sis_platform.assets.message_log import raw_messages
from sis_platform.assets.table_specs import OWNERS
from sis_platform.lake.delta import Lake
from sis_platform.lake.spark.fold.ledger import committed_step
from sis_platform.lake.tables import MASTER_DOCUMENTS
from sis_platform.log.landing import Catalog, LogPosition, batch_key
from sis_platform.resources.platform import DeltaLakeResource, LandingZoneResource
from sis_platform.resources.serving import ServingStoreResource, store_kind
from sis_platform.runtime.logs import concerning
from sis_platform.serving import StoreNotReady, StoreStatus

SERVING_STORE = "serving_store"
SERVING_STORE_KEY = dg.AssetKey(SERVING_STORE)
LIVE_MATCHES_LAKE = "live_matches_lake"
LIVE_STORE_FRESH = "live_store_fresh"
MISMATCHES_SHOWN = 20  # mismatched master ids listed in the check's metadata

# A master's version and the sha256 of its document (None: no document).
Version = tuple[int, str | None]
ABSENT: Version = (0, None)


def serving_store_spec(url: str) -> dg.AssetSpec:
    """The serving store's asset, its kind (sqlite or postgres) read from its URL."""
    return dg.AssetSpec(
        SERVING_STORE,
        deps=[raw_messages],
        group_name="live",
        kinds={store_kind(url)},
        owners=OWNERS,
        description="The serving store sis-live keeps from the landed message log in tens of "
        "milliseconds: current masters, the interpreted model (events, markets, selections), "
        "dead letters, message outcomes and an ordered change log. Opportunity Management "
        "reads it (docs/serving.md: SQL, sis_platform.serving.open_reader, waiting for "
        "changes). Not materialized by runs: the reporter sensor records its position, lag "
        "and throughput every few seconds while it moves. Its check live_matches_lake proves "
        "it equals the lake at the lake's fold position; live_store_fresh fails when landed "
        "messages wait for it longer than SIS_LIVE_MAX_LAG_SECONDS.",
    )


# ---------------------------------------------------------------------------------------------
# live == lake


@dataclass(frozen=True)
class LakeMasters:
    """What the lake has folded: up to which batch, and each master's (version, sha256)."""

    batch_seq: int  # the last batch of the last committed fold step (0: nothing folded)
    masters: dict[str, Version]


@dataclass(frozen=True)
class Comparison:
    """The store at the lake's fold position against the lake."""

    compared: int  # masters compared (in either side)
    mismatched: list[str]  # their ids, sorted

    @property
    def equal(self) -> bool:
        return not self.mismatched


def compare_masters(lake: Mapping[str, Version], store: Mapping[str, Version]) -> Comparison:
    """Every master either side has: equal when both have the same version and document hash
    (a master one side lacks counts as version 0 without a document)."""
    ids = set(lake) | set(store)
    mismatched = sorted(m for m in ids if lake.get(m, ABSENT) != store.get(m, ABSENT))
    return Comparison(len(ids), mismatched)


def lake_masters(lake: Lake) -> LakeMasters:
    """master_documents as of the last committed fold step (pinned: a step running meanwhile
    does not show), each master's version and its document's sha256. A tombstone (a master
    rewound out of existence) is version 0 without a document, like a master never seen."""
    committed = committed_step(lake)
    if committed.fold_step == 0:
        return LakeMasters(0, {})
    rows = (
        lake.read(MASTER_DOCUMENTS, version=committed.master_documents_version)
        .select(
            "master_id",
            "version",
            F.sha2(F.encode("document", "UTF-8"), 256).alias("sha256"),
            "stale",
            "filtered",
        )
        .collect()
    )
    masters: dict[str, Version] = {}
    for row in rows:
        exists = row["sha256"] is not None or row["stale"] or row["filtered"]
        masters[row["master_id"]] = (int(row["version"]), row["sha256"]) if exists else ABSENT
    return LakeMasters(committed.last_batch_seq, masters)


def reached(catalog: Catalog, store: LogPosition, batch_seq: int) -> bool:
    """Whether the store has applied all of batch `batch_seq` (sealed: its anchor counts it)."""
    if batch_seq == 0 or store.batch_seq > batch_seq:
        return True
    if store.batch_seq < batch_seq:
        return False
    anchor = catalog.anchor(batch_key(batch_seq))
    return anchor is not None and store.msg_seq + 1 >= anchor.messages


@dg.asset_check(
    asset=SERVING_STORE,
    name=LIVE_MATCHES_LAKE,
    additional_deps=[MASTER_DOCUMENTS.name],
    description="Live == lake (docs/design.md invariant 7): for every master the lake has "
    "folded, the serving store's version at the lake's fold position has the same version "
    "and the same document (sha256). Fails while the store has not reached the lake's "
    "position. Requested by live_matches_lake_sensor when the lake's fold advances.",
)
def live_matches_lake(
    context: dg.AssetCheckExecutionContext,
    spark: LazyPySparkResource,
    lake: DeltaLakeResource,
    landing: LandingZoneResource,
    serving: ServingStoreResource,
) -> dg.AssetCheckResult:
    folded = lake_masters(lake.lake(spark.spark_session))
    store = serving.open_writer()
    try:
        status = store.status()
        at_lake = reached(landing.catalog(), status.position, folded.batch_seq)
        versions = store.versions_at(folded.batch_seq) if at_lake else {}
        comparison = compare_masters(folded.masters, versions)
        if at_lake and comparison.equal:
            # The gate of the store's history pruning (ServingWriter.prune): sis-live reads it
            # from the store, never from Dagster.
            store.record_checked(folded.batch_seq)
    finally:
        store.close()
    metadata: dict[str, Any] = {
        "lake_batch_seq": folded.batch_seq,
        "store_position": position_text(status.position),
        "lake_masters": len(folded.masters),
    }
    if not at_lake:
        return dg.AssetCheckResult(
            passed=False,
            metadata=metadata,
            description=f"the store ({position_text(status.position)}) has not applied batch "
            f"{folded.batch_seq}, the lake's fold position, yet: nothing compared",
        )
    shown = comparison.mismatched[:MISMATCHES_SHOWN]
    # Each shown master as both sides have it: [version, document sha256] (null: none).
    sides = {
        m: {"lake": folded.masters.get(m, ABSENT), "store": versions.get(m, ABSENT)} for m in shown
    }
    context.log.info(
        f"compared {comparison.compared} master(s) at batch {folded.batch_seq}: "
        f"{len(comparison.mismatched)} differ",
        extra=concerning(batch=folded.batch_seq),
    )
    return dg.AssetCheckResult(
        passed=comparison.equal,
        metadata={
            **metadata,
            "masters_compared": comparison.compared,
            "mismatches": len(comparison.mismatched),
            "mismatched_masters": dg.MetadataValue.json(shown),
            "mismatched_versions": dg.MetadataValue.json(sides),
        },
        description=None
        if comparison.equal
        else f"{len(comparison.mismatched)} master(s) differ between the serving store and "
        f"the lake at batch {folded.batch_seq}, e.g. {comparison.mismatched[0]!r}",
    )


# ---------------------------------------------------------------------------------------------
# freshness


@dataclass(frozen=True)
class Watermark:
    """The landed position seen while the store lagged, and when: everything up to it must be
    in the store within the lag bound."""

    position: LogPosition
    since: datetime


@dataclass(frozen=True)
class Freshness:
    """One evaluation of live_store_fresh, and the watermark to keep for the next one."""

    passed: bool
    severity: dg.AssetCheckSeverity
    description: str
    watermark: Watermark | None

    @property
    def state(self) -> str:
        """What a change of is worth reporting: pass, WARN or ERROR."""
        return "pass" if self.passed else self.severity.value


def assess_freshness(
    status: StoreStatus,
    landed: LogPosition,
    now: datetime,
    max_lag_seconds: float,
    watermark: Watermark | None = None,
) -> Freshness:
    """Whether the store keeps up with the landed log (see the module docstring).

    `watermark`: the previous evaluation's. While the store lags, the landed position first
    seen lagging is kept with its time; once the store reaches it, the current landed position
    becomes the next watermark. So a message waits at most the bound plus one evaluation
    interval before the check fails. Without a previous watermark only a stall is seen. A
    halted writer, or a store beyond the landed log (a landing rolled back under it), is an
    ERROR: nothing is applied or got until it is put right."""
    beyond = beyond_landing(status, landed)
    if beyond is not None:
        return Freshness(False, dg.AssetCheckSeverity.ERROR, beyond, None)
    if status.position >= landed:
        return Freshness(
            True,
            dg.AssetCheckSeverity.WARN,
            f"the store has applied every landed message ({position_text(landed)})",
            None,
        )
    if watermark is None or status.position >= watermark.position:
        watermark = Watermark(landed, now)
    waited = (now - watermark.since).total_seconds()
    activity = [utc(t) for t in (status.committed_at, status.heartbeat_at) if t is not None]
    idle = (now - max(activity)).total_seconds() if activity else None
    behind = (
        f"the store is at {position_text(status.position)}, "
        f"the landed log at {position_text(landed)}"
    )
    if idle is None or idle > max_lag_seconds:
        since = "never committed" if idle is None else f"no commit or heartbeat for {idle:.0f}s"
        return Freshness(
            False,
            dg.AssetCheckSeverity.ERROR,
            f"stalled: {behind} and the store has {since} (is sis-live running? is the store "
            "reachable?)",
            watermark,
        )
    if waited > max_lag_seconds:
        return Freshness(
            False,
            dg.AssetCheckSeverity.WARN,
            f"lagging: {behind}; messages landed by {position_text(watermark.position)} have "
            f"waited {waited:.0f}s (SIS_LIVE_MAX_LAG_SECONDS={max_lag_seconds:g})",
            watermark,
        )
    return Freshness(True, dg.AssetCheckSeverity.WARN, f"catching up: {behind}", watermark)


def beyond_landing(status: StoreStatus, landed: LogPosition) -> str | None:
    """Why the live path is halted (sis_platform/live/applier.py), or None: a halt the writer
    recorded, or a store beyond the landed log that it has not seen yet."""
    if status.halt is not None:
        return (
            f"halted ({status.halt.reason}) since {status.halt.raised_at:%Y-%m-%d %H:%M:%S} "
            f"UTC: {status.halt.detail}"
        )
    if status.position > landed:
        return (
            f"the store is at {position_text(status.position)}, beyond the landing zone's last "
            f"message ({position_text(landed)}): the landing was rolled back under the store, "
            "and sis-live halts rather than skip what lands next"
        )
    return None


def store_unavailable(error: Exception) -> Freshness:
    """The evaluation when the store cannot be read at all."""
    return Freshness(
        False, dg.AssetCheckSeverity.ERROR, f"the serving store is unavailable: {error}", None
    )


def freshness_evaluation(fresh: Freshness, metadata: Mapping[str, Any]) -> dg.AssetCheckEvaluation:
    """The evaluation as reported without a run."""
    return dg.AssetCheckEvaluation(
        asset_key=SERVING_STORE_KEY,
        check_name=LIVE_STORE_FRESH,
        passed=fresh.passed,
        severity=fresh.severity,
        description=fresh.description,
        metadata=dict(metadata),
    )


@dg.asset_check(
    asset=SERVING_STORE,
    name=LIVE_STORE_FRESH,
    description="The live path keeps up: fails (WARN) when messages landed more than "
    "SIS_LIVE_MAX_LAG_SECONDS ago are not in the serving store yet, or (ERROR) when messages "
    "wait and the store has had no commit or heartbeat for that long, or sis-live has not "
    "created (or upgraded) the store. Reported without a run "
    "by serving_store_reporter when its result changes; executed from the UI it sees a stall "
    "only.",
)
def live_store_fresh(
    landing: LandingZoneResource, serving: ServingStoreResource
) -> dg.AssetCheckResult:
    landed = landing.catalog().last_position()
    metadata = {"landed_position": position_text(landed)}
    try:
        store = serving.open_reader()
    except StoreNotReady as error:
        # No store sis-live has created (or upgraded) yet: a failed check, as the reporter
        # shows it, rather than a failed step.
        fresh = store_unavailable(error)
    else:
        try:
            status = store.status()
        finally:
            store.close()
        fresh = assess_freshness(status, landed, datetime.now(UTC), serving.max_lag_seconds)
        metadata["store_position"] = position_text(status.position)
    return dg.AssetCheckResult(
        passed=fresh.passed,
        severity=fresh.severity,
        description=fresh.description,
        metadata=metadata,
    )


def position_text(position: LogPosition) -> str:
    """A log position as the UI shows it."""
    return f"batch {position.batch_seq}, message {position.msg_seq}"


def utc(moment: datetime) -> datetime:
    """`moment` as an aware UTC time (a naive one read from a store is UTC)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
