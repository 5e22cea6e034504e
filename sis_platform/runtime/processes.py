"""Whether a process recorded by host name and process id has ended: the consumer lease's
holder (intake/lease.py) and a Spark driver's scratch folder (lake/driver/scratch.py) are named so.
"""

from __future__ import annotations

import os
import socket


def ended_here(host: str, pid: str) -> bool:
    """True only when `host` is this host and no process `pid` exists on it. Another host's
    process, a `pid` that is not a number, and another user's process all count as alive:
    this host cannot tell that they ended."""
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # exists, owned by someone else
    return False
