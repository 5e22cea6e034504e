"""Loading the peer conformance vectors.

The peer conformance vectors live outside the repository, in ../shared/conformance (a fresh
clone in CI has shared/ beside it). A missing folder is an error, not a skip: those cases are
part of the contract.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFORMANCE_DIR = REPO_ROOT.parent / "shared" / "conformance"


def load_conformance(name: str) -> dict[str, Any]:
    path = CONFORMANCE_DIR / name
    if not path.is_file():
        raise FileNotFoundError(
            f"conformance vectors not found at {path}: the repository expects ../shared/ beside it"
        )
    with path.open(encoding="utf-8") as f:
        return json.load(f)
