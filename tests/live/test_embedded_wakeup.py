"""The embedded queue's waiting get wakes on a ring of its doorbell (sis_platform.runtime.doorbell),
not by polling: with the fallback look-again interval set beyond the test's bound, only a ring can
end the wait in time."""

from __future__ import annotations

import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sis_platform.queues import embedded
from sis_platform.queues.base import ReceivedMessage
from sis_platform.queues.embedded import DOORBELL_DIR, EmbeddedQueue

REPO = Path(__file__).resolve().parents[2]
BOUND_SECONDS = 60.0  # how long a test waits for the wake before failing


@pytest.fixture(autouse=True)
def _no_fallback(monkeypatch):
    monkeypatch.setattr(embedded, "_REAP_INTERVAL_SECONDS", 3600.0)


def _waiting_get(queue: EmbeddedQueue) -> tuple[threading.Thread, list[ReceivedMessage | None]]:
    """A session's get waiting in a thread (daemon: a test that fails leaves it behind), and
    once it is waiting (its doorbell socket bound)."""
    session = queue.connect()
    result: list[ReceivedMessage | None] = []
    bound = threading.Event()
    original = session._bound_waiter

    def bind_then_signal():
        waiter = original()
        bound.set()
        return waiter

    session._bound_waiter = bind_then_signal  # type: ignore[method-assign]

    def get() -> None:
        result.append(session.get(wait_seconds=3600.0))
        session.commit()
        session.close()

    thread = threading.Thread(target=get, daemon=True)
    thread.start()
    assert bound.wait(BOUND_SECONDS)
    return thread, result


def test_a_put_from_another_process_wakes_a_waiting_get(tmp_path):
    queue = EmbeddedQueue(tmp_path / "queue")
    thread, result = _waiting_get(queue)
    code = (
        "import sys; from pathlib import Path; from sis_platform.queues.embedded import "
        "EmbeddedQueue; p = EmbeddedQueue(Path(sys.argv[1])).producer(); "
        "print(p.put(b'<late/>')); p.close()"
    )
    put = subprocess.run(
        [sys.executable, "-c", code, str(queue.path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=BOUND_SECONDS,
    )
    thread.join(BOUND_SECONDS)
    assert not thread.is_alive(), "the get was not woken by the put"
    assert result[0] is not None and result[0].message_id == put.stdout.strip()


def test_a_backout_by_another_session_wakes_a_waiting_get(tmp_path):
    queue = EmbeddedQueue(tmp_path / "queue")
    with queue.producer() as producer:
        put_id = producer.put(b"<m/>")
    other = queue.connect()
    assert other.get() is not None  # now in the other session's unit of work
    thread, result = _waiting_get(queue)
    other.backout()
    thread.join(BOUND_SECONDS)
    other.close()
    assert not thread.is_alive(), "the get was not woken by the backout"
    assert result[0] is not None and result[0].message_id == put_id
    assert result[0].delivery_count == 2


def test_the_doorbell_folder_is_private(tmp_path):
    queue = EmbeddedQueue(tmp_path / "queue")
    with queue.producer() as producer:
        producer.put(b"<m/>")
    with queue.connect() as session:
        assert session.get(wait_seconds=0.01) is not None
        session.commit()
    mode = stat.S_IMODE((queue.path / DOORBELL_DIR).stat().st_mode)
    assert mode == 0o700
