"""What sis-live's metrics cost the loop, per group, and what a scrape costs.

    python scripts/bench_metrics.py [--repeat 2000]

For a group of 1 message (the feed's rates) and of 2,000 (a backlog's full group), the time
the loop spends recording it (sis_platform/live/metrics.py: got, landed, folded, committed,
visible, queue_committed), with `LiveMetrics` and with the recorder that records nothing
(SIS_METRICS_ADDRESS=off); and the time to render /metrics (text format) once every metric has
series. Figures are medians over `--repeat` rounds, in microseconds, on this process's one core.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import UTC, datetime

from prometheus_client.exposition import generate_latest

from sis_platform.domain.pipeline import LoggedMessage
from sis_platform.live.metrics import LiveMetrics, LiveRecorder, LiveState
from sis_platform.log.landing import LandedMessage, LogPosition
from sis_platform.serving.records import GroupCommit, OutcomeRow


def group(size: int) -> tuple[list[LandedMessage], GroupCommit]:
    """`size` landed messages, one applied item each and every tenth with a dead letter."""
    put = datetime.now(UTC)
    messages = [
        LandedMessage(LogPosition(1, i), LoggedMessage(f"m{i}", b"", 1), put) for i in range(size)
    ]
    outcomes = [OutcomeRow(f"m{i}", 1, i, 0, "e", "applied", None) for i in range(size)]
    outcomes += [
        OutcomeRow(f"m{i}", 1, i, 1, "e", "dead-lettered", "orphan-update")
        for i in range(0, size, 10)
    ]
    return messages, GroupCommit(LogPosition(1, size - 1), [], {}, [], [], outcomes)


def per_group(recorder: LiveRecorder, size: int, repeat: int) -> float:
    """Median microseconds to record one group of `size`."""
    messages, commit = group(size)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        recorder.got(size, 0.001)
        recorder.landed(size, 0.002)
        recorder.folded(0.003)
        recorder.committed(commit, 0.004)
        recorder.visible(messages)
        recorder.queue_committed(0.0005)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def scrape(repeat: int) -> tuple[float, int]:
    """Median microseconds to render /metrics, and its size in bytes."""
    metrics = LiveMetrics()
    state = LiveState(True, (5, 10), (5, 9), 0.0, True, True, False, 0.2, True, True)
    metrics.watch(lambda: state)
    per_group(metrics, 100, 10)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        text = generate_latest(metrics.registry)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6, len(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    print(f"load {os.getloadavg()[0]:.2f}")
    for size in (1, 2000):
        repeat = args.repeat if size == 1 else max(10, args.repeat // 100)
        on = per_group(LiveMetrics(process=False), size, repeat)
        off = per_group(LiveRecorder(), size, repeat)
        print(
            f"group of {size}: metrics on {on:.1f} us, off {off:.1f} us "
            f"({(on - off) / size:.2f} us per message)"
        )
    seconds, size = scrape(max(10, args.repeat // 10))
    print(f"render /metrics: {seconds:.0f} us, {size} bytes")
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
