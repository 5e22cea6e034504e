"""`LandingZone`: one landing zone's parts wired together over one root and one anchor signer:
`catalog` (what is landed, read back: sis_platform/log/landing/catalog.py), `writer` (what
lands: writer.py) and `upkeep` (merge and expiry: upkeep.py). It holds no logic of its own;
code that needs one part takes that part.
"""

from __future__ import annotations

from pathlib import Path

from sis_platform.log.landing.catalog import Catalog
from sis_platform.log.landing.signing import AnchorSigner
from sis_platform.log.landing.upkeep import Upkeep
from sis_platform.log.landing.writer import ZoneWriter
from sis_platform.log.seal import LogSeal


class LandingZone:
    """The landing zone at `root`: its catalog, writer and upkeep. With `seal` (the platform's
    zones: sis_platform/log/seal.py) anchors are signed with the log key and witnessed;
    without it (a zone opened to read bodies, some tests) they are written unsigned."""

    def __init__(self, root: Path, seal: LogSeal | None = None) -> None:
        self.catalog = Catalog(root, AnchorSigner(seal))
        self.writer = ZoneWriter(self.catalog)
        self.upkeep = Upkeep(self.catalog)
