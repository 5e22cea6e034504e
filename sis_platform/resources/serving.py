"""The serving store as a Dagster resource: where sis-live commits what it folds.

The resource holds the store's URL only (`sqlite:///<path>` or `postgresql://user@host/db`);
the PostgreSQL password is never part of it: `sis_platform.serving.open_store` takes it from
SIS_SERVING_PASSWORD when it connects. The reporter sensor and the live == lake check open the
store through it, and the fold records the lake's progress in it (live intake only); sis-live
itself never imports Dagster.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import dagster as dg
from pydantic import Field

from sis_platform.serving import ServingStore, open_store
from sis_platform.settings import DEFAULT_LIVE_MAX_LAG_SECONDS


class ServingStoreResource(dg.ConfigurableResource):
    """The serving store sis-live keeps (docs/serving.md), opened for reading."""

    url: str = Field(
        description="The store's URL (SIS_SERVING_URL): sqlite:///<absolute path> or "
        "postgresql://user@host:port/dbname (password from SIS_SERVING_PASSWORD)."
    )

    max_lag_seconds: float = Field(
        default=DEFAULT_LIVE_MAX_LAG_SECONDS,
        gt=0,
        description="How long a landed message may wait for the store before live_store_fresh "
        "fails (SIS_LIVE_MAX_LAG_SECONDS).",
    )

    records_lake_progress: bool = Field(
        default=False,
        description="Whether the fold records the lake's progress in the store after each run "
        "(ServingStore.record_lake_progress), for sis-live's /metrics: on with live intake, "
        "off with sensor intake, where no sis-live keeps or reads a store.",
    )

    def open_store(self) -> ServingStore:
        """A connection to the store; the caller closes it."""
        return open_store(self.url)

    @property
    def kind(self) -> str:
        """The store's engine as a Dagster kind: `sqlite` or `postgres`."""
        return store_kind(self.url)


def store_kind(url: str) -> str:
    """`sqlite` or `postgres`, from the URL's scheme (the asset's kind in the UI)."""
    scheme = urlsplit(url).scheme.split("+", 1)[0]
    return "postgres" if scheme in ("postgresql", "postgres") else "sqlite"
