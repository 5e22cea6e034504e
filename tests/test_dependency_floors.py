"""The floors of pyproject.toml's dependencies admit no version that lacks an API the code
calls: an older release that the floor let in would fail only where that API is reached."""

from __future__ import annotations

import inspect
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def requirement(name: str) -> Requirement:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"]:
        parsed = Requirement(line)
        if parsed.name == name:
            return parsed
    raise AssertionError(f"{name} is not a dependency")


def test_stomp_py_floor_has_set_ssl_with_verify() -> None:
    """sis_platform/queues/stomp/link.py calls `set_ssl(..., verify=True)`: stomp.py added
    `verify` in 9.0.0 (8.2.0, the release before, has no such argument, and TLS would fail
    with a TypeError at the first connection)."""
    import stomp
    import stomp.transport

    specifier = requirement("stomp.py").specifier
    assert "verify" in inspect.signature(stomp.transport.Transport.set_ssl).parameters
    assert specifier.contains(stomp.__version__)
    assert not specifier.contains("8.2.0")
    assert not specifier.contains("8.1.0")
