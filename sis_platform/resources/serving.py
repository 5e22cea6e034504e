"""The serving store as a Dagster resource: where sis-live commits what it folds.

The resource holds the store's URL only (`sqlite:///<path>` or `postgresql://user@host/db`);
the PostgreSQL password is never part of it: `sis_platform.serving.open_reader` and
`open_writer` take it from
SIS_SERVING_PASSWORD when they connect. The reporter sensor and the freshness check read the
store through it, the live == lake check records its gate in it and the fold the lake's
progress (live intake only); sis-live itself never imports Dagster.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import dagster as dg
from pydantic import Field

from sis_platform.serving import ServingReader, ServingWriter, open_reader, open_writer
from sis_platform.settings import DEFAULT_LIVE_MAX_LAG_SECONDS


class ServingStoreResource(dg.ConfigurableResource):
    """The serving store sis-live keeps (docs/serving.md), opened for reading or, by the
    platform's own records, for writing."""

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
        "(ServingWriter.record_lake_progress), for sis-live's /metrics: on with live intake, "
        "off with sensor intake, where no sis-live keeps or reads a store.",
    )

    def open_reader(self) -> ServingReader:
        """A reader of the store; the caller closes it."""
        return open_reader(self.url)

    def open_writer(self) -> ServingWriter:
        """A writer of the store (the live == lake gate, the lake's progress); the caller
        closes it."""
        return open_writer(self.url)

    @property
    def kind(self) -> str:
        """The store's engine as a Dagster kind: `sqlite` or `postgres`."""
        return store_kind(self.url)


def store_kind(url: str) -> str:
    """`sqlite` or `postgres`, from the URL's scheme (the asset's kind in the UI)."""
    scheme = urlsplit(url).scheme.split("+", 1)[0]
    return "postgres" if scheme in ("postgresql", "postgres") else "sqlite"
