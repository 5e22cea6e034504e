"""Resources for the landing zone, the Delta lake and feed processing settings."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg
from pydantic import Field

from sis_platform.domain.dedup import DedupWindow
from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.domain.priority import Priority
from sis_platform.intake.lease import ConsumerLease, holder_id
from sis_platform.log.landing import Catalog, LandingZone
from sis_platform.log.seal import log_seal
from sis_platform.settings import (
    DEFAULT_BATCH_MAX_BYTES,
    DEFAULT_BATCH_MAX_MESSAGES,
    DEFAULT_BATCH_MAX_SECONDS,
    DEFAULT_DEAD_LETTER_RATE_WARN,
    DEFAULT_DEDUP_WINDOW_BATCHES,
    DEFAULT_GET_WAIT_SECONDS,
    DEFAULT_LAKE_LAG_FAIL_SECONDS,
    DEFAULT_LAKE_LAG_WARN_SECONDS,
    DEFAULT_LAKE_MAX_FILES,
    DEFAULT_LAKE_OPTIMIZE_EVERY,
    DEFAULT_LAKE_RETAIN_HOURS,
    DEFAULT_LAKE_VACUUM_EVERY,
    DEFAULT_LEASE_SECONDS,
    DEFAULT_MAX_RUNS_IN_FLIGHT,
    DEFAULT_QUARANTINE_AFTER,
    DEFAULT_REDELIVERY_LIMIT,
    LAKE_REPLAY_WINDOW_HOURS,
    LakeUpkeepSettings,
)
from sis_platform.standards.selector import Selector

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sis_platform.lake.delta import Lake


class LandingZoneResource(dg.ConfigurableResource):
    """Durable landing batches, how large the sensor makes them, and the consumer lease that
    keeps two deployments sharing the landing zone from consuming at once."""

    root: str = Field(description="Folder of the landing zone (shared storage in production).")
    max_messages: int = Field(
        default=DEFAULT_BATCH_MAX_MESSAGES,
        description="Most messages in one batch. A deep queue fills a batch within "
        "max_seconds, so a backlog lands in few large batches (each run has a fixed Spark cost).",
    )
    max_bytes: int = Field(
        default=DEFAULT_BATCH_MAX_BYTES,
        description="Most body bytes in one batch, checked before each get: a batch may exceed "
        "it by less than one message's bound (SIS_MAX_MESSAGE_BYTES; a larger body is moved "
        "aside at intake, not counted).",
    )
    max_seconds: float = Field(
        default=DEFAULT_BATCH_MAX_SECONDS,
        description="Longest a sensor tick spends getting one batch; keep well under the "
        "sensor timeout (60 s by default).",
    )
    max_runs_in_flight: int = Field(
        default=DEFAULT_MAX_RUNS_IN_FLIGHT,
        description="The sensor lands no new batch while this many batch runs are queued or "
        "running (backpressure: batches grow instead of the run queue). Ahead of a batch run "
        "in flight it lands one only in a backlog: when the last batch filled up to its "
        "message or byte bound.",
    )
    get_wait_seconds: float = Field(
        default=DEFAULT_GET_WAIT_SECONDS,
        description="How long one get waits for a message before the batch closes.",
    )
    deployment: str | None = Field(
        default=None,
        description="This deployment's name in the consumer lease (e.g. prod, dr); the host "
        "name when unset.",
    )
    lease_seconds: float = Field(
        default=DEFAULT_LEASE_SECONDS,
        description="How long the consumer lease lasts unless renewed (every tick renews it); "
        "a standby takes over this long after the holder's last tick.",
    )

    log_key: str | None = Field(
        default=None,
        description="The log key (bound to the SIS_LOG_KEY variable, read when used; never a "
        "value in configuration). Unset: the key file signs the log's anchors.",
    )
    log_key_file: str | None = Field(
        default=None,
        description="The file holding the key that signs the log's anchors (outside the data "
        "folder). Unset, with no log_key: anchors are written unsigned (and fail verification).",
    )
    create_log_key: bool = Field(
        default=False,
        description="Create log_key_file (mode 0600) for a new log (the default key file).",
    )
    log_witness: str | None = Field(
        default=None,
        description="The witness file of the log's latest sealed batch (outside the data folder).",
    )

    def zone(self) -> LandingZone:
        if self.log_witness is None or (self.log_key is None and self.log_key_file is None):
            return LandingZone(Path(self.root))
        seal = log_seal(
            self.log_key_file or "",
            self.log_witness,
            self.log_key,
            create_key=self.create_log_key,
        )
        return LandingZone(Path(self.root), seal)

    def catalog(self) -> Catalog:
        """The zone's catalog: what readers (checks, sensors, the lake) need of it."""
        return self.zone().catalog

    def lease(self) -> ConsumerLease:
        """The consumer lease in the landing zone's root, as this process holds or awaits it."""
        return ConsumerLease(Path(self.root), holder_id(self.deployment), self.lease_seconds)


class DeltaLakeResource(dg.ConfigurableResource):
    """Where the Delta tables live: a local folder, or s3a://, abfss://, gs:// on a cluster."""

    base_path: str
    optimize_every: int = Field(
        default=DEFAULT_LAKE_OPTIMIZE_EVERY,
        ge=0,
        description="The fold and the model compact their tables every this many fold steps "
        "(0: never).",
    )
    vacuum_every: int = Field(
        default=DEFAULT_LAKE_VACUUM_EVERY,
        ge=0,
        description="... and vacuum them every this many fold steps (0: never).",
    )
    retain_hours: float = Field(
        default=DEFAULT_LAKE_RETAIN_HOURS,
        ge=LAKE_REPLAY_WINDOW_HOURS,
        description="Hours a file removed from a table is kept before VACUUM deletes it.",
    )
    max_files: int = Field(
        default=DEFAULT_LAKE_MAX_FILES,
        ge=1,
        description="`files_within_bound` fails when a table lists more data files.",
    )

    def upkeep(self) -> LakeUpkeepSettings:
        return LakeUpkeepSettings(
            optimize_every=self.optimize_every,
            vacuum_every=self.vacuum_every,
            retain_hours=self.retain_hours,
            max_files=self.max_files,
        )

    def lake(self, spark: SparkSession) -> Lake:
        # Imported here: sis_platform.lake.delta brings pyspark and delta (0.54 s measured),
        # which the sensor's process, holding this resource too, never needs.
        from sis_platform.lake.delta import Lake

        return Lake(spark, self.base_path, upkeep=self.upkeep())


class FeedProcessingResource(dg.ConfigurableResource):
    """How the feed is interpreted (docs/feed.md): resource bounds, limits and the item
    selector. The bounds are documented in sis_platform/domain/limits.py."""

    max_message_bytes: int = Field(
        default=DEFAULT_LIMITS.max_message_bytes,
        gt=0,
        description="A body over this many bytes is moved aside at intake and dead-lettered "
        "`too-large`.",
    )
    max_elements: int = Field(
        default=DEFAULT_LIMITS.max_elements,
        gt=0,
        description="Most elements in a message or a patched master (`too-complex` beyond).",
    )
    max_depth: int = Field(
        default=DEFAULT_LIMITS.max_depth, gt=0, description="Deepest element nesting."
    )
    max_attributes: int = Field(
        default=DEFAULT_LIMITS.max_attributes, gt=0, description="Most attributes on an element."
    )
    max_namespaces: int = Field(
        default=DEFAULT_LIMITS.max_namespaces,
        gt=0,
        description="Most namespace declarations on an element.",
    )
    max_document_namespaces: int = Field(
        default=DEFAULT_LIMITS.max_document_namespaces,
        gt=0,
        description="Most namespace declarations in a message or a patched master.",
    )
    max_children: int = Field(
        default=DEFAULT_LIMITS.max_children, gt=0, description="Most children of an element."
    )
    max_ids: int = Field(
        default=DEFAULT_LIMITS.max_ids, gt=0, description="Most master ids in one message."
    )
    max_split_bytes: int = Field(
        default=DEFAULT_LIMITS.max_split_bytes,
        gt=0,
        description="Most bytes the items of one message carry together (ids x an update's "
        "operation bytes); `too-complex` beyond.",
    )
    max_patch_operations: int = Field(
        default=DEFAULT_LIMITS.max_patch_operations,
        gt=0,
        description="Most patch operations in one update message.",
    )
    max_selector_length: int = Field(
        default=DEFAULT_LIMITS.max_selector_length,
        gt=0,
        description="Longest XPath selector (`sel`), in characters.",
    )
    max_selector_steps: int = Field(
        default=DEFAULT_LIMITS.max_selector_steps,
        gt=0,
        description="Most location steps plus predicates in one XPath selector.",
    )
    item_budget_seconds: float = Field(
        default=DEFAULT_LIMITS.item_budget_seconds,
        gt=0,
        description="Wall-clock seconds one item may take to fold; a worker over it is killed "
        "and the item dead-lettered `too-complex`.",
    )
    redelivery_limit: int = Field(
        default=DEFAULT_REDELIVERY_LIMIT,
        description="A message delivered more often than this is dead-lettered.",
    )
    selector: str | None = Field(
        default=None,
        description="JMS selector over item properties (category, type, masterId, sport, "
        "country, course, eventStatus, ...); items it does not select are recorded as filtered.",
    )
    priority: str | None = Field(
        default=None,
        description="JMS selectors separated by ';' (SIS_PRIORITY): each fold step commits the "
        "master_documents rows of the masters matching an earlier one before the others.",
    )
    dedup_window_batches: int = Field(
        default=DEFAULT_DEDUP_WINDOW_BATCHES,
        ge=0,
        description="A copy of a message id is a duplicate when an earlier copy lies in its "
        "batch or this many batches before it (0: anywhere in the log); sis-live applies the "
        "same window.",
    )
    quarantine_after: int = Field(
        default=DEFAULT_QUARANTINE_AFTER,
        ge=1,
        description="A master whose fold fails this many times for an unknown reason (a bug, "
        "a crashed worker) is quarantined: its items are dead-lettered `quarantined` until a "
        "dead-letter replay after the fix, so it cannot block the other masters.",
    )

    def limits(self) -> Limits:
        """The resource bounds as one domain record."""
        return Limits(
            max_message_bytes=self.max_message_bytes,
            max_elements=self.max_elements,
            max_depth=self.max_depth,
            max_attributes=self.max_attributes,
            max_namespaces=self.max_namespaces,
            max_document_namespaces=self.max_document_namespaces,
            max_children=self.max_children,
            max_ids=self.max_ids,
            max_split_bytes=self.max_split_bytes,
            max_patch_operations=self.max_patch_operations,
            max_selector_length=self.max_selector_length,
            max_selector_steps=self.max_selector_steps,
            item_budget_seconds=self.item_budget_seconds,
        )

    def dedup_window(self) -> DedupWindow:
        return DedupWindow(self.dedup_window_batches)

    def compiled_selector(self) -> Selector | None:
        return Selector.compile(self.selector) if self.selector else None

    def compiled_priority(self) -> Priority | None:
        return Priority.compile(self.priority) if self.priority else None


class FeedChecksResource(dg.ConfigurableResource):
    """The thresholds of the checks the fold reports on its tables (docs/operations.md, "Checks
    that watch the feed")."""

    lake_lag_warn_seconds: float = Field(
        default=DEFAULT_LAKE_LAG_WARN_SECONDS,
        gt=0,
        description="lake_lag_within_bounds warns when the oldest landed message the fold has "
        "not folded is older than this.",
    )
    lake_lag_fail_seconds: float = Field(
        default=DEFAULT_LAKE_LAG_FAIL_SECONDS,
        gt=0,
        description="lake_lag_within_bounds fails (severity ERROR) beyond this age.",
    )
    dead_letter_rate_warn: float = Field(
        default=DEFAULT_DEAD_LETTER_RATE_WARN,
        gt=0,
        le=1,
        description="dead_letter_rate_below_threshold warns when a batch's dead-lettered "
        "messages are more than this share of its messages.",
    )
