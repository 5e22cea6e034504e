"""A free TCP port on loopback, for a server a test starts (the port is free when returned;
nothing listens on it until the server binds it)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
