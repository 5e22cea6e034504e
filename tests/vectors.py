"""Loading the peer conformance vectors.

The vectors are data kept in the repository, in tests/conformance/ (README.md there names each
source suite, its licence and the fields of a case). A missing file is an error, not a skip:
those cases are part of the contract the domain code is tested against.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFORMANCE_DIR = Path(__file__).resolve().parent / "conformance"


def load_conformance(name: str) -> dict[str, Any]:
    """The parsed JSON of tests/conformance/<name>; FileNotFoundError when it is absent."""
    path = CONFORMANCE_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"conformance vectors not found at {path}")
    with path.open(encoding="utf-8") as f:
        return json.load(f)
