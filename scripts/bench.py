"""The platform's benchmark: backlog, Spark fold vs reference fold, latency.

    python scripts/bench.py                                   # everything, 12,000 messages
    python scripts/bench.py --parts backlog --messages 12000 --messages 120000
    python scripts/bench.py --parts fold --fold-messages 12000
    python scripts/bench.py --parts latency --latency-rates 0.42,4.2 --latency-seconds 120

Prints one table of every figure with its target and pass/fail, and writes the same as
`results.json` and a plot `bench.png` into `--out` (default bench-out/, not committed).

backlog  The embedded queue preloaded by the simulator with N messages, then the platform run
         until every master is current (every landed batch folded and the model refreshed):
         wall time (not counting the preload), messages/s, and the peak memory of the whole
         process tree (Python, the Spark JVM and its Python workers; sum of PSS, and of RSS).
         `--mode inprocess` (default): sensor ticks and runs in one process through Dagster's
         APIs, one Spark session for all runs, tuned as the long-lived driver it is
         (`--driver short-lived`: tuned for one run, as each run's driver under the daemon
         is); batches are landed by a process of their own while runs run, within the
         daemon's backpressure (`--landing overlap-thread`: by a thread of the runs' process;
         `--landing serial`: land, run, land...). `--mode daemon`: a real dagster-daemon
         launching each run in its own process with its own Spark driver, as scripts/run.sh.
fold     The same simulated feed landed and classified (raw_messages, message_items), then
         the Spark fold (`fold_step` over every batch, one step) timed alone, against the
         pure-Python reference fold (`fold_master` per master, one process) on the same items:
         items/s of each and the ratio Spark / reference, measured in the same run.
live     The live path (scripts/bench_live.py, not in the default parts): the real `sis-live`
         with a publisher and a reader of the serving store in processes of their own; put ->
         visible-in-store latency p50 / p95 / p99 / max per source (embedded, ActiveMQ over
         STOMP) and rate, and the time a backlog takes to reach the store, with sis-live's
         peak RSS:
             python scripts/bench.py --parts live --live-rates 0.42,4.2,42 \
                 --live-seconds 120,120,60 --live-backlog 12000,1200000 \
                 --live-sources embedded,stomp
latency  dagster-daemon running (sensor every SIS_SENSOR_INTERVAL_SECONDS, 1 s here) while
         `sis-feed publish --rate R` publishes for --latency-seconds; per message, the time
         from its put on the queue (put_time) to the Delta commit of the fold step that
         applied it (the fold_steps commit's timestamp in the Delta log): p50, p95, max.
catchup  After a day with the lake down (scripts/bench_catchup.py, a script of its own, not a
         part): N sealed batches landed by sis-live, then dagster-daemon started as deployed
         with a live feed beside it; the time until the lake has folded them all, the runs it
         took, the lake's lag over time and sis-live's put -> visible meanwhile:
             python scripts/bench_catchup.py --batches 720 --per-batch 50 --live-rate 0.42
Each measurement runs in its own child process, scripts/bench_worker.py (so one Spark driver at
a time, and peak memory is that measurement's alone). The machine's load average is recorded
with every figure. The platform runs on its defaults, except for SIS_* settings in the caller's
environment, which every measurement takes (a new data folder each, whatever SIS_DATA_DIR
says):

    SIS_BATCH_MAX_BYTES=268435456 SIS_BATCH_MAX_SECONDS=40 SIS_LEASE_SECONDS=120 \
        python scripts/bench.py --parts backlog --messages 1200000 --batch 200000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import bench_live
import bench_worker
import psutil
from bench_worker import REPO, load_average

# The performance targets (2 cores, 24 GB).
TARGET_12K_S = 60.0
TARGET_1M2_S = 15 * 60.0
TARGET_GROWTH = 11.0  # wall(1.2 M) / wall(120 k)
TARGET_PEAK_MIB = 4096.0
TARGET_FOLD_RATIO = 1.0
TARGET_P50_S = 10.0
TARGET_P95_S = 20.0


# --- measuring ---------------------------------------------------------------------------------


class PeakMemory(threading.Thread):
    """Samples the memory of a process and all its descendants: the sum of RSS every 0.25 s
    (counts pages shared between forked Python workers once per worker: an upper bound), and
    the sum of PSS (shared pages divided among their sharers: the tree's real footprint) every
    PSS_EVERY samples and at every new peak of the RSS sum. RSS is one read of a few numbers
    per process; PSS walks every page table of a process (/proc/PID/smaps_rollup), ~60 ms of
    kernel time for the tree of a backlog run (28 of them the JVM's): read four times a second,
    it took a quarter of one of a 2-core machine's cores from the measurement it measured."""

    PSS_EVERY = 4  # samples: once a second

    def __init__(self, root: psutil.Process) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.peak = 0  # RSS sum
        self.peak_pss = 0
        self.at_peak: dict[str, int] = {}  # PSS by process kind at the PSS peak
        self.stop = threading.Event()

    def run(self) -> None:
        sample = 0
        while not self.stop.wait(0.25):
            try:
                tree = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                continue
            sample += 1
            rss = self._rss(tree)
            if rss > self.peak or sample % self.PSS_EVERY == 0:
                self.peak = max(self.peak, rss)
                self._pss(tree)

    @staticmethod
    def _rss(tree: list[psutil.Process]) -> int:
        total = 0
        for p in tree:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                continue
        return total

    def _pss(self, tree: list[psutil.Process]) -> None:
        pss = 0
        kinds: dict[str, int] = {}
        for p in tree:
            try:
                info = p.memory_full_info()
                name = (
                    "java"
                    if p.name().startswith("java")
                    else (
                        "spark python worker"
                        if "pyspark" in " ".join(p.cmdline()[:4])
                        else "python / other"
                    )
                )
            except psutil.Error:
                continue
            pss += getattr(info, "pss", info.rss)
            kinds[name] = kinds.get(name, 0) + getattr(info, "pss", info.rss)
        if pss > self.peak_pss:
            self.peak_pss, self.at_peak = pss, kinds


class ChildResult(NamedTuple):
    result: dict[str, Any]  # the worker's JSON result, with the tree's memory at its peak
    peak_pss_mib: float  # peak PSS of the worker's process tree


def run_child(args: list[str], log: Path, timeout: float) -> ChildResult:
    """Run one measurement (scripts/bench_worker.py) in a child process and sample the memory
    of its process tree."""
    result_file = Path(tempfile.mkstemp(prefix="sis-bench-", suffix=".json")[1])
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, bench_worker.__file__, *args, "--result", str(result_file)],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        sampler = PeakMemory(psutil.Process(proc.pid))
        sampler.start()
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = -1
        finally:
            sampler.stop.set()
            sampler.join()
    try:
        if code != 0:
            raise RuntimeError(f"benchmark worker {args[:3]} failed ({code}): see {log}")
        result = json.loads(result_file.read_text())
        result["peak_rss_sum_mib"] = round(sampler.peak / 2**20)
        result["peak_pss_by_kind_mib"] = {k: round(v / 2**20) for k, v in sampler.at_peak.items()}
        return ChildResult(result, sampler.peak_pss / 2**20)
    finally:
        result_file.unlink(missing_ok=True)


# --- report ------------------------------------------------------------------------------------


class Row(NamedTuple):
    figure: str
    measured: str
    target: str
    verdict: str
    load: str  # 1-minute load average before / after


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def table_rows(results: dict[str, Any]) -> list[Row]:
    return [
        *_backlog_rows(results),
        *_fold_rows(results),
        *_latency_rows(results),
        *(Row(*r) for r in bench_live.live_rows(results.get("live", []))),
    ]


def _backlog_rows(results: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    backlog = sorted(results.get("backlog", []), key=lambda r: r["messages"])
    for r in backlog:
        n = r["messages"]
        target = ""
        ok: bool | None = None
        if n == 12_000:
            target, ok = f"<= {TARGET_12K_S:.0f} s", r["wall_s"] <= TARGET_12K_S
        elif n == 1_200_000:
            target, ok = f"<= {TARGET_1M2_S:.0f} s", r["wall_s"] <= TARGET_1M2_S
        load = f"{r['load_before']} / {r['load_after']}"
        rows.append(
            Row(
                f"backlog {n:,} ({r['mode']}, batches of {r['batch_max_messages']:,}): wall",
                f"{r['wall_s']:.1f} s ({r['batches']} batches)",
                target,
                verdict(ok),
                load,
            )
        )
        rows.append(
            Row(f"backlog {n:,}: throughput", f"{r['messages_per_s']:.0f} msg/s", "", "", load)
        )
        rows.append(
            Row(
                f"backlog {n:,}: peak memory, process tree (PSS; RSS sum "
                f"{r['peak_rss_sum_mib']:,} MiB)",
                f"{r['peak_pss_mib']:,} MiB",
                f"<= {TARGET_PEAK_MIB:.0f} MiB",
                verdict(r["peak_pss_mib"] <= TARGET_PEAK_MIB),
                load,
            )
        )
    by_n = {r["messages"]: r for r in backlog}
    if 120_000 in by_n and 1_200_000 in by_n:
        growth = by_n[1_200_000]["wall_s"] / by_n[120_000]["wall_s"]
        rows.append(
            Row(
                "backlog: wall(1.2 M) / wall(120 k)",
                f"{growth:.2f}x",
                f"<= {TARGET_GROWTH:.0f}x",
                verdict(growth <= TARGET_GROWTH),
                "",
            )
        )
    return rows


def _fold_rows(results: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for r in results.get("fold", []):
        load = f"{r['load_before']} / {r['load_after']}"
        rows.append(
            Row(
                f"fold {r['messages']:,} msgs / {r['items']:,} items: reference",
                f"{r['reference_items_per_s']:.0f} items/s",
                "",
                "",
                load,
            )
        )
        rows.append(
            Row(
                f"fold {r['messages']:,}: Spark (one step, {r['batches']} batches)",
                f"{r['spark_items_per_s']:.0f} items/s",
                "",
                "",
                load,
            )
        )
        rows.append(
            Row(
                f"fold {r['messages']:,}: Spark / reference",
                f"{r['ratio']:.3f}x",
                f">= {TARGET_FOLD_RATIO:.1f}x",
                verdict(r["ratio"] >= TARGET_FOLD_RATIO),
                load,
            )
        )
    return rows


def _latency_rows(results: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for r in results.get("latency", []):
        load = f"{r['load_before']} / {r['load_after']}"
        what = f"latency at {r['rate']} msg/s, {r['mode']} ({r['folded']}/{r['published']} msgs)"
        rows.append(
            Row(
                f"{what}: p50",
                f"{r['p50_s']:.1f} s",
                f"<= {TARGET_P50_S:.0f} s",
                verdict(r["p50_s"] <= TARGET_P50_S),
                load,
            )
        )
        rows.append(
            Row(
                f"{what}: p95",
                f"{r['p95_s']:.1f} s",
                f"<= {TARGET_P95_S:.0f} s",
                verdict(r["p95_s"] <= TARGET_P95_S),
                load,
            )
        )
        rows.append(Row(f"{what}: max", f"{r['max_s']:.1f} s", "", "", load))
    return rows


def print_table(results: dict[str, Any]) -> str:
    header = ("figure", "measured", "target", "", "load 1-min (before / after)")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    text = "\n".join(lines)
    print(text)
    return text


def plot(results: dict[str, Any], path: Path) -> bool:
    fig = bench_worker.new_figure(figsize=(16, 5))
    if fig is None:
        return False
    ax1, ax2, ax3 = fig.subplots(1, 3)
    backlog = sorted(results.get("backlog", []), key=lambda r: r["messages"])
    if backlog:
        _plot_backlog(backlog, ax1, ax2)
    else:
        for ax in (ax1, ax2):
            ax.set_axis_off()
    fold = results.get("fold", [])
    if fold:
        ax2.set_title(
            "Backlog memory; Spark/reference fold: " + ", ".join(f"{r['ratio']:.2f}x" for r in fold)
        )
    latency = results.get("latency", [])
    if latency:
        _plot_latency(latency, ax3)
    else:
        ax3.text(0.5, 0.5, "latency not measured", ha="center", va="center")
        ax3.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def _plot_backlog(backlog: list[dict[str, Any]], ax1: Any, ax2: Any) -> None:
    """Wall time against backlog size (log-log, with a linear fit and the targets), and the
    peak memory of each."""
    ns = [r["messages"] for r in backlog]
    walls = [r["wall_s"] for r in backlog]
    ax1.plot(ns, walls, "o-", label="measured")
    xs = [min(ns[0], 12_000), 1_200_000]
    if len(ns) >= 2:
        # Least squares wall = a + b N: a is the fixed cost, b the cost per message.
        mean_n, mean_w = sum(ns) / len(ns), sum(walls) / len(walls)
        b = sum((n - mean_n) * (w - mean_w) for n, w in zip(ns, walls, strict=True)) / sum(
            (n - mean_n) ** 2 for n in ns
        )
        a = mean_w - b * mean_n
        ax1.plot(
            xs,
            [a + b * x for x in xs],
            "--",
            label=f"linear fit: {a:.0f} s + {b * 1000:.2f} ms/msg",
        )
    else:
        top_n, top_w = ns[-1], walls[-1]
        ax1.plot(xs, [top_w * x / top_n for x in xs], "--", label=f"linear from {top_n:,}")
    ax1.plot([12_000, 1_200_000], [TARGET_12K_S, TARGET_1M2_S], "r^", label="targets")
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.set_xlabel("messages in the backlog")
    ax1.set_ylabel("wall time to every master current (s)")
    ax1.set_title("Backlog")
    ax1.legend()
    ax2.bar([f"{n:,}" for n in ns], [r["peak_pss_mib"] for r in backlog])
    ax2.axhline(TARGET_PEAK_MIB, color="r", linestyle="--", label="target")
    ax2.set_ylabel("peak memory (PSS) of the process tree (MiB)")
    ax2.set_title("Backlog memory; fold ratio in the title")
    ax2.legend()


def _plot_latency(latency: list[dict[str, Any]], ax3: Any) -> None:
    """p50, p95 and max latency per rate and mode, against the targets."""
    labels = [f"{r['rate']} msg/s\n{r.get('mode', 'daemon')}" for r in latency]
    width = 0.25
    xs = range(len(latency))
    for i, key in enumerate(("p50_s", "p95_s", "max_s")):
        ax3.bar([x + (i - 1) * width for x in xs], [r[key] for r in latency], width, label=key[:-2])
    ax3.set_xticks(list(xs), labels)
    ax3.axhline(TARGET_P50_S, color="g", linestyle="--", label="p50 target")
    ax3.axhline(TARGET_P95_S, color="r", linestyle="--", label="p95 target")
    ax3.set_ylabel("put to fold-step commit (s)")
    ax3.set_title("Latency: daemon (a Spark driver per run) / in-process (one)")
    ax3.legend()


# --- command line ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--parts",
        default="backlog,fold,latency",
        help="comma-separated: backlog, fold, latency, live (live is not in the default)",
    )
    parser.add_argument(
        "--messages",
        type=int,
        action="append",
        help="backlog size N (repeatable; 12000, 120000, 1200000)",
    )
    parser.add_argument("--mode", choices=["inprocess", "daemon"], default="inprocess")
    parser.add_argument(
        "--landing",
        choices=["overlap", "overlap-thread", "serial"],
        default="overlap",
        help="backlog --mode inprocess: overlap: batches landed while runs run by a process "
        "of its own, as under the daemon; overlap-thread: the same from a thread of the runs' "
        "process (sharing its interpreter lock); serial: land a batch, run it, land the next",
    )
    parser.add_argument(
        "--driver",
        choices=["long-lived", "short-lived"],
        default="long-lived",
        help="backlog --mode inprocess: the runs' one Spark driver tuned as the long-lived "
        "driver it is (C2 JIT, Spark's code generation), or as a driver that serves one run "
        "(as each run's own driver is under the daemon)",
    )
    parser.add_argument(
        "--batch", type=int, default=None, help="SIS_BATCH_MAX_MESSAGES (default: the platform's)"
    )
    parser.add_argument("--fold-messages", type=int, default=12_000)
    parser.add_argument("--latency-rates", default="0.42,4.2")
    parser.add_argument("--latency-seconds", type=float, default=120.0)
    parser.add_argument(
        "--latency-mode",
        choices=["daemon", "inprocess"],
        default="daemon",
        help="daemon: dagster-daemon, a process and Spark driver per run; "
        "inprocess: ticks and runs in one process with one long-lived Spark",
    )
    parser.add_argument(
        "--spark",
        choices=["local", "connect", "standalone"],
        default="local",
        help="backlog and latency: local: the runs' own local Spark drivers "
        "(the default); connect: one long-lived sis-spark-connect server that "
        "every run uses (SIS_SPARK_MASTER=sc://...); standalone: the runs' drivers "
        "submit to a standalone cluster started on this machine (a master and two "
        "1-core workers, as tests/cluster starts them; SIS_SPARK_MASTER=spark://...)",
    )
    parser.add_argument("--drain-timeout", type=float, default=900.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "bench-out")
    parser.add_argument("--keep", action="store_true", help="keep each measurement's data")
    parser.add_argument(
        "--append",
        action="store_true",
        help="add to the figures already in --out/results.json (same N, rate: "
        "replaced) and print the table of all of them",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="fold: print a cProfile of the Spark fold step to the log",
    )
    bench_live.add_options(parser)
    return parser.parse_args(argv)


def merged(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`old` results with `new` ones added; a new figure replaces an old one of the same kind
    (backlog and fold: same N; latency: same rate and mode)."""
    keys = {
        "backlog": ("messages", "mode"),
        "fold": ("messages",),
        "latency": ("rate", "mode"),
        "live": ("kind", "source", "rate", "messages", "prioritized", "metrics"),
    }
    out = {**old, **{k: v for k, v in new.items() if k not in keys}}
    for part, key in keys.items():
        rows = {tuple(r.get(k) for k in key): r for r in old.get(part, [])}
        rows.update({tuple(r.get(k) for k in key): r for r in new.get(part, [])})
        if rows:
            out[part] = list(rows.values())
    return out


def worker_options(args: argparse.Namespace, log: Path) -> list[str]:
    """The options every measurement's worker takes from the command line."""
    options = [
        "--seed",
        str(args.seed),
        "--log",
        str(log),
        "--spark",
        args.spark,
        "--landing",
        args.landing,
        "--driver",
        args.driver,
    ]
    if args.batch is not None:
        options += ["--batch", str(args.batch)]
    if args.keep:
        options.append("--keep")
    if args.profile:
        options.append("--profile")
    return options


def measure_backlog(args: argparse.Namespace, common: list[str], log: Path) -> list[Any]:
    figures = []
    for n in args.messages or [12_000]:
        print(f"backlog {n:,} ({args.mode}) ... load {load_average()}", flush=True)
        r, peak = run_child(
            ["--worker", "backlog", "--messages", str(n), "--mode", args.mode, *common],
            log,
            timeout=4 * 3600,
        )
        r["peak_pss_mib"] = round(peak)
        figures.append(r)
        print(
            f"  {r['wall_s']:.1f} s, {r['messages_per_s']:.0f} msg/s, "
            f"{peak:.0f} MiB peak PSS, {r['batches']} batches",
            flush=True,
        )
    return figures


def measure_fold(args: argparse.Namespace, common: list[str], log: Path) -> list[Any]:
    print(f"fold {args.fold_messages:,} ... load {load_average()}", flush=True)
    r, peak = run_child(
        ["--worker", "fold", "--messages", str(args.fold_messages), *common], log, timeout=3600
    )
    r["peak_pss_mib"] = round(peak)
    print(
        f"  Spark {r['spark_items_per_s']:.0f} items/s, reference "
        f"{r['reference_items_per_s']:.0f} items/s: {r['ratio']:.3f}x",
        flush=True,
    )
    return [r]


def measure_latency(args: argparse.Namespace, common: list[str], log: Path) -> list[Any]:
    figures = []
    for rate in [float(x) for x in args.latency_rates.split(",") if x.strip()]:
        print(
            f"latency at {rate} msg/s for {args.latency_seconds:.0f} s ... load {load_average()}",
            flush=True,
        )
        r, peak = run_child(
            [
                "--worker",
                "latency",
                "--mode",
                args.latency_mode,
                "--rate",
                str(rate),
                "--seconds",
                str(args.latency_seconds),
                "--drain-timeout",
                str(args.drain_timeout),
                *common,
            ],
            log,
            timeout=args.latency_seconds + args.drain_timeout + 300,
        )
        r["peak_pss_mib"] = round(peak)
        figures.append(r)
        print(
            f"  p50 {r['p50_s']:.1f} s, p95 {r['p95_s']:.1f} s, max {r['max_s']:.1f} s",
            flush=True,
        )
    return figures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - {"backlog", "fold", "latency", "live"}
    if unknown:
        raise SystemExit(f"unknown parts: {', '.join(sorted(unknown))}")
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "bench.log"
    common = worker_options(args, log)
    results: dict[str, Any] = {
        "machine": {
            "cores": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    print(f"machine: {results['machine']}; log: {log}", flush=True)
    if "backlog" in parts:
        results["backlog"] = measure_backlog(args, common, log)
    if "fold" in parts:
        results["fold"] = measure_fold(args, common, log)
    if "latency" in parts:
        results["latency"] = measure_latency(args, common, log)
    if "live" in parts:
        args.live_log = log
        results["live"] = bench_live.measure(args)
    if args.append and (args.out / "results.json").is_file():
        results = merged(json.loads((args.out / "results.json").read_text()), results)
    print()
    results["table"] = print_table(results)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    if plot(results, args.out / "bench.png"):
        print(f"\nwrote {args.out / 'results.json'} and {args.out / 'bench.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
