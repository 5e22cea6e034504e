"""Throughput of the reference pipeline (sis_platform.domain.pipeline) on a simulated feed.

    python scripts/bench_reference_fold.py                   # a day (12,000) and 100,000 messages
    python scripts/bench_reference_fold.py --messages 12000 --profile

The feed is generated first (not timed), then one ReferencePipeline processes it as one batch.
Throughput is given against wall time and against the process's CPU time ("per core": the
pipeline is single-threaded, so the two agree unless the machine is busy). Classification
(parse, validate, split) and the fold are also timed separately, and an applied update is
broken down into its steps (the patch engine's share is "patch compile" + "patch apply").
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import sys
import time
import timeit
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from lxml import etree

from sis_platform.domain.fold import MasterState, PatchCache, fold_master
from sis_platform.domain.items import Item, serialize
from sis_platform.domain.messages import parse_xml
from sis_platform.domain.patchscope import patch_scope, validate_patched
from sis_platform.domain.pipeline import (
    DeadLetter,
    LoggedMessage,
    ReferencePipeline,
    classify_message,
    valid_items_by_master,
)
from sis_platform.simulator.generator import generate_feed
from sis_platform.standards.xmlpatch import Patch, PatchError

T = TypeVar("T")


def timed(function: Callable[[], T]) -> tuple[T, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = function()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def feed(seed: int, count: int) -> list[LoggedMessage]:
    return [
        LoggedMessage(m.message_id, m.body, getattr(m, "delivery_count", 1))
        for m in generate_feed(seed, count)
    ]


def stages(messages: list[LoggedMessage]) -> tuple[float, float, int]:
    """CPU seconds to classify every message, then to fold every master; and the item count."""
    groups: dict[str, list[Item]] = {}

    def classify() -> None:
        groups.update(valid_items_by_master(messages))

    def fold() -> None:
        cache = PatchCache()
        for master_id, items in groups.items():
            state: MasterState | None = None
            fold_master(master_id, state, items, patches=cache)

    _, _, classify_cpu = timed(classify)
    _, _, fold_cpu = timed(fold)
    return classify_cpu, fold_cpu, sum(len(items) for items in groups.values())


def update_breakdown(messages: list[LoggedMessage]) -> dict[str, float]:
    """Mean CPU microseconds per applied update item, by step: whose cost is it."""
    steps = dict.fromkeys(
        ("parse payload", "patch compile", "patch apply", "scoped check", "serialize"), 0.0
    )
    trees: dict[str, etree._ElementTree] = {}
    documents: dict[str, bytes] = {}  # the last good version, to start again after a failure
    applied = 0
    clock = time.process_time
    seen: set[str] = set()
    for message in messages:
        if message.message_id in seen:
            continue
        seen.add(message.message_id)
        classified = classify_message(message)
        if isinstance(classified, DeadLetter):
            continue
        for item in classified:
            if item.category == "master":
                trees[item.master_id] = parse_xml(item.payload).getroottree()
                documents[item.master_id] = item.payload
                continue
            current = trees.get(item.master_id)
            if current is None:
                continue
            t0 = clock()
            operations = parse_xml(item.payload)
            t1 = clock()
            # As the fold does: patched in place, validated with what the engine located.
            located: dict[str, list[etree._Element]] = {}
            try:
                patch = Patch.from_element(operations)
                t2 = clock()
                result = patch.apply_in_place(current, located)
            except PatchError:
                trees[item.master_id] = parse_xml(documents[item.master_id]).getroottree()
                continue
            t3 = clock()
            invalid = validate_patched(result, patch_scope(operations), located)
            t4 = clock()
            document = serialize(result)
            t5 = clock()
            if invalid is not None:
                trees[item.master_id] = parse_xml(documents[item.master_id]).getroottree()
                continue
            trees[item.master_id] = result
            documents[item.master_id] = document
            applied += 1
            spans = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)
            for name, spent in zip(steps, spans, strict=True):
                steps[name] += spent
    return {name: spent / max(applied, 1) * 1e6 for name, spent in steps.items()}


def bench(seed: int, count: int, profile: bool, repeat: int) -> None:
    messages, generate_wall, _ = timed(lambda: feed(seed, count))
    size = sum(len(m.body) for m in messages)
    print(
        f"\n{len(messages):,} messages ({size / 1e6:.1f} MB, mean {size / len(messages):,.0f} B)"
        f" generated in {generate_wall:.1f} s"
    )

    runs: list[tuple[float, float]] = []
    for _ in range(repeat):
        pipeline = ReferencePipeline()
        _, wall, cpu = timed(partial(pipeline.process, messages))
        runs.append((wall, cpu))
    # On a shared machine the fastest run is the one least disturbed by other load.
    wall, cpu = min(runs, key=lambda run: run[1])
    items = sum(1 for r in pipeline.results if getattr(r, "position", None) is not None)
    counts = {str(k): v for k, v in sorted(pipeline.outcome_counts().items())}
    print(f"  outcomes: {counts}; masters {len(pipeline.masters):,}")
    print(f"  versions {len(pipeline.versions):,}; dead letters {len(pipeline.dead_letters):,}")
    print(
        f"  pipeline: {wall:.2f} s wall, {cpu:.2f} s CPU -> "
        f"{len(messages) / wall:,.0f} messages/s and {items / wall:,.0f} items/s wall; "
        f"{len(messages) / cpu:,.0f} messages/s and {items / cpu:,.0f} items/s per core"
        + (f" (fastest of {repeat} runs)" if repeat > 1 else "")
    )

    classify_cpu, fold_cpu, _ = stages(messages)
    print(
        f"  stages (CPU): classify {classify_cpu:.2f} s "
        f"({len(messages) / classify_cpu:,.0f} messages/s), "
        f"fold {fold_cpu:.2f} s ({items / fold_cpu:,.0f} items/s)"
    )

    breakdown = update_breakdown(messages)
    print(
        "  per applied update (CPU us): "
        + ", ".join(f"{name} {spent:.0f}" for name, spent in breakdown.items())
    )

    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        ReferencePipeline().process(messages)
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=20261121)
    parser.add_argument(
        "--messages", type=int, action="append", help="feed sizes (default: 12000 and 100000)"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile one more run")
    parser.add_argument("--repeat", type=int, default=1, help="runs per size; the fastest counts")
    args = parser.parse_args()

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {platform.platform()}"
    )
    # A fixed pure-Python workload, so runs on a busy or throttled machine can be told apart.
    calibration = min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000
    print(f"calibration: sum(range(1000)) takes {calibration * 1e6:.1f} us (lower: faster core)")
    for count in args.messages or [12_000, 100_000]:
        bench(args.seed, count, args.profile, args.repeat)


if __name__ == "__main__":
    main()
