"""What sis-live's traces cost: put -> visible with tracing on and off, and the loop's time per
group spent making spans.

    PYTHONPATH=. python scripts/bench_traces.py [--rate 20] [--seconds 60] [--order on,off,off,on]
        [--repeat 2000]

Put -> visible: sis-live's service in this process (tests/live/running.py: embedded queue,
landing zone and SQLite store in a temporary folder) is fed `--rate` messages per second of the
simulated feed for `--seconds`, once per value of `--order`; `on` exports its spans through the
SDK's batch span processor to an OTLP/HTTP receiver in a process of its own (tests/otlp.py,
which decodes every request, as a collector elsewhere would), `off` makes none. The latency is
the metric's own (`sis_live_put_to_visible_seconds`: from the queue's put time to the group's
store commit), taken from every message. Then, as bench_metrics.py does for the metrics: the
median time the loop spends in the recorder's calls for one group of 1 and of 2,000 messages,
with the traces (exporting to a receiver in this process) and without. A first run of 5 s with
traces off warms the process and is not counted. Prints the 1-minute load before and after each
part.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sis_platform.domain.pipeline import LoggedMessage
from sis_platform.live.metrics import LiveRecorder
from sis_platform.live.traces import GROUP_SPAN, Destination, LiveTraces
from sis_platform.log.landing import LandedMessage, LogPosition
from sis_platform.serving.records import GroupCommit, MasterRow
from sis_platform.simulator.generator import generate_feed
from tests.live.running import BOUND_SECONDS, Place, drained, running
from tests.otlp import OtlpReceiver, otlp_receiver

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

WHERE = Destination("embedded", "sis.feed")


class Latencies(LiveRecorder):
    """Put -> visible of every message applied, in seconds (as LiveMetrics.visible takes it)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def visible(self, messages: Sequence[LandedMessage]) -> None:
        now = time.time()
        self.seconds.extend(
            max(0.0, now - m.put_time.timestamp()) for m in messages if m.put_time is not None
        )


def _serve(conn: Connection) -> None:
    """The receiver's process: sends its endpoint, serves until told, sends its group spans."""
    with otlp_receiver() as receiver:
        conn.send(receiver.endpoint)
        conn.recv()
        conn.send(sum(1 for s in receiver.spans() if s.name == GROUP_SPAN))


@contextmanager
def receiver_process() -> Iterator[tuple[str, list[int]]]:
    """An OTLP receiver in its own process: its endpoint, and (once the block ends) the group
    spans it received."""
    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    process = multiprocessing.get_context("spawn").Process(target=_serve, args=(theirs,))
    process.start()
    received: list[int] = []
    try:
        yield ours.recv(), received
    finally:
        ours.send("stop")
        received.append(ours.recv())
        process.join()


def _load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def put_to_visible(traced: bool, rate: float, seconds: float, seed: int) -> str:
    """One run: its figures as a line."""
    count = int(rate * seconds)
    feed = list(generate_feed(seed, count))
    latencies = Latencies()
    before = _load()
    with tempfile.TemporaryDirectory() as folder, receiver_process() as (endpoint, received):
        place = Place(Path(folder))
        traces = LiveTraces(endpoint + "/v1/traces", WHERE) if traced else None
        try:
            with running(
                place,
                metrics=latencies,
                tracing=traces.recorder if traces is not None else None,
            ) as service:
                with place.queue.producer() as producer:
                    started = time.monotonic()
                    for i, message in enumerate(feed):
                        # Pacing the feed, not waiting for the service.
                        delay = started + i / rate - time.monotonic()
                        if delay > 0:
                            time.sleep(delay)
                        producer.put(message.body, message_id=message.message_id)
                done = service.wait_until(
                    lambda s: drained(s) and s.landed_messages == count, BOUND_SECONDS
                )
        finally:
            if traces is not None:
                traces.shutdown()
    (groups,) = received
    ms = [s * 1000 for s in latencies.seconds]
    figures = " / ".join(
        f"{v:,.1f}" for v in (*(_percentile(ms, p) for p in (0.5, 0.95, 0.99)), max(ms))
    )
    return (
        f"traces {'on ' if traced else 'off'}: {len(ms)} messages"
        f"{'' if done else ' (NOT drained)'}, p50 / p95 / p99 / max {figures} ms, "
        f"{groups} group spans received; load {before} -> {_load()}"
    )


def _group(size: int) -> tuple[list[LandedMessage], GroupCommit]:
    put = datetime.now(UTC)
    messages = [
        LandedMessage(LogPosition(1, i), LoggedMessage(f"m{i}", b"", 1), put) for i in range(size)
    ]
    masters = [MasterRow(f"e{i}", 1, None, f"m{i}", False, False) for i in range(min(size, 200))]
    return messages, GroupCommit(LogPosition(1, size - 1), masters, {}, [], [], [])


def per_group(recorder: LiveRecorder, size: int, repeat: int) -> float:
    """Median microseconds of the recorder's calls for one group of `size`."""
    messages, commit = _group(size)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        recorder.got(size, 0.001)
        recorder.landed(size, 0.002)
        recorder.group(messages, "0000000001")
        recorder.folded(0.003)
        recorder.committed(commit, 0.004)
        recorder.visible(messages)
        recorder.queue_committed(0.0005)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def recording(receiver: OtlpReceiver, repeat: int) -> list[str]:
    lines = []
    for size in (1, 2000):
        n = repeat if size == 1 else max(10, repeat // 100)
        traces = LiveTraces(receiver.traces_url, WHERE)
        try:
            on = per_group(traces.recorder(LiveRecorder()), size, n)
        finally:
            traces.shutdown()
        off = per_group(LiveRecorder(), size, n)
        lines.append(f"group of {size}: traces on {on:.1f} us, off {off:.1f} us per group")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--order", default="on,off,off,on")
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    # The first run in a process pays its imports and first folds: a short one, not counted.
    print(f"warm-up (not counted), {put_to_visible(False, args.rate, 5.0, seed=99)}", flush=True)
    for run, switch in enumerate(x.strip() for x in args.order.split(",") if x.strip()):
        if switch not in ("on", "off"):
            raise SystemExit("--order: a list of on and off")
        line = put_to_visible(switch == "on", args.rate, args.seconds, seed=100 + run)
        print(f"run {run + 1}, {line}", flush=True)
    before = _load()
    with otlp_receiver() as receiver:
        for line in recording(receiver, args.repeat):
            print(line, flush=True)
    print(f"recording: load {before} -> {_load()}")


if __name__ == "__main__":
    main()
