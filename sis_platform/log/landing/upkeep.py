"""`Upkeep`: a landing zone's maintenance by the consumer lease's holder: sealed batches in parts
merged into one file and their parts folders removed after a grace (`merge.py` beside it), and
batches past the retention expired once the lake has them (`expiry.py`).

sis-live runs both a bounded step per idle turn (`merger`, `expirer`); `sis-live merge` merges
an existing zone in one go (`merge_all`). What is read to verify a merge comes from the
zone's `Catalog`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sis_platform.log.landing.catalog import Catalog
from sis_platform.log.landing.expiry import CHECK_SECONDS, Expirer
from sis_platform.log.landing.layout import ZoneLayout
from sis_platform.log.landing.merge import Merger, MergeReport, merge_zone

if TYPE_CHECKING:
    from sis_platform.intake.lease import Fence


class Upkeep(ZoneLayout):
    """Maintenance of the zone `catalog` reads (the same root and anchor signer)."""

    def __init__(self, catalog: Catalog) -> None:
        super().__init__(catalog.root)
        self.catalog = catalog

    def merger(
        self,
        fence: Fence | None,
        grace_seconds: float,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> Merger:
        """sis-live's merging, a bounded step per idle turn (`Merger.turn`)."""
        return Merger(self, fence, grace_seconds, wall_clock=wall_clock)

    def expirer(
        self,
        fence: Fence | None,
        retain_seconds: float,
        *,
        check_seconds: float = CHECK_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> Expirer:
        """sis-live's landing expiry, a bounded step per idle turn (`Expirer.turn`)."""
        return Expirer(self, fence, retain_seconds, check_seconds=check_seconds, clock=clock)

    def merge_all(
        self,
        fence: Fence | None,
        grace_seconds: float,
        *,
        still_held: Callable[[], bool] = lambda: True,
    ) -> MergeReport:
        """Every sealed batch in parts merged, and the parts past their grace removed
        (`merge_zone`)."""
        return merge_zone(self, fence, grace_seconds, still_held=still_held)
