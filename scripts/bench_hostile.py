"""Time and peak memory of each class of hostile message, through the reference pipeline (what
sis-live runs) and through the functions the lake's Spark Python workers run.

    python scripts/bench_hostile.py                 # every class, both paths: a table
    python scripts/bench_hostile.py --path reference --only namespace-flood-master

Each class is a few hostile messages followed by a valid master of another event; each runs in
a process of its own (this script with `--one`), so its peak RSS is its own. The table gives,
per class and path: the end state of each hostile message (`applied`, or the reason it was
dead-lettered), whether the valid master after it was applied, the seconds the messages took
and the process's peak RSS (MiB, imports included; the `baseline` row is a valid master alone).

Paths: `reference` is `ReferencePipeline.process` (sis-live's group loop runs the same
`classify_stretch` and `fold_stretch`); `worker` is `lake/spark/items.py`'s `_classify_batches` (the
`mapInArrow` function of message_items) on one Arrow batch of raw rows, then
`lake/spark/fold/worker.py`'s `fold_one` per master (the fold's per-master function), without a
JVM. The intake's size bound (a body over SIS_MAX_MESSAGE_BYTES is moved aside before it is
landed) is measured as the pipeline sees such a body: parse_message's own size check.
"""

from __future__ import annotations

import argparse
import json
import resource
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sis_platform.domain.limits import DEFAULT_LIMITS  # noqa: E402
from sis_platform.domain.pipeline import LoggedMessage  # noqa: E402

OTHER = "BENCH-OTHER"  # the valid master after the hostile messages
ASCOT = "ASC-20261121-1430"

MARKET = (
    '<market id="WIN" type="win" status="open">'
    '<selection id="1" number="1" name="One" status="runner"><price num="5" den="2"/></selection>'
    "</market>"
)


def event(master_id: str, markets: str = MARKET, extra: str = "") -> str:
    return (
        f'<event id="{master_id}" sport="horse-racing" country="GB" course="Ascot" '
        f'name="{master_id}" start="2026-11-21T14:30:00Z" status="dormant"{extra}>'
        f"{markets}</event>"
    )


def master(*events: str, ids: list[str], extra: str = "") -> bytes:
    return (
        f'<sportsdata category="master" type="new" id="{" ".join(ids)}"{extra}>'
        + "".join(events)
        + "</sportsdata>"
    ).encode()


def update(ids: list[str], operations: str, extra: str = "") -> bytes:
    return (
        f'<sportsdata category="update" id="{" ".join(ids)}"{extra}>{operations}</sportsdata>'
    ).encode()


def declarations(count: int, uri_chars: int = 0) -> str:
    padding = "u" * uri_chars
    return " " + " ".join(f'xmlns:n{i}="urn:{padding}:{i}"' for i in range(count))


REPLACE = '<replace sel="/event/@going">soft</replace>'
PRICE = "<replace sel=\"/event/market[@id='WIN']/selection[@id='1']/price/@num\">{}</replace>"


def _messages(*bodies: bytes) -> list[LoggedMessage]:
    return [LoggedMessage(f"hostile-{i}", body) for i, body in enumerate(bodies)]


def _ascot() -> LoggedMessage:
    return LoggedMessage("master-ascot", master(event(ASCOT), ids=[ASCOT]))


def baseline() -> list[LoggedMessage]:
    return []


def doctype_fifo() -> list[LoggedMessage]:
    body = b'<!DOCTYPE x [<!ENTITY % e SYSTEM "/dev/stdin"> %e;]>' + update([ASCOT], REPLACE)
    return _messages(body)


def relaxng_attributes() -> list[LoggedMessage]:
    attributes = " ".join(f'a{i}=""' for i in range(24_000))
    return [_ascot(), *_messages(update([ASCOT], f'<add sel="/event"><x {attributes}/></add>'))]


def relaxng_children() -> list[LoggedMessage]:
    content = "<x>" + "<y/>" * 200_000 + "</x>"
    return [_ascot(), *_messages(update([ASCOT], f'<add sel="/event">{content}</add>'))]


def xpath_cost() -> list[LoggedMessage]:
    deep = "/event" + "/market" * 60 + "[@id='x']" * 10 + "/@status"
    long = "/event" + "[@id='" + "x" * 4_000 + "']/@going"
    general = "//market[count(//selection) > 0]/@status"
    return [
        _ascot(),
        *_messages(
            *(update([ASCOT], f'<replace sel="{sel}">x</replace>') for sel in (deep, long, general))
        ),
    ]


def huge_id_list() -> list[LoggedMessage]:
    return _messages(update([f"ID{i}" for i in range(20_000)], REPLACE))


def price_overflow() -> list[LoggedMessage]:
    big = MARKET.replace('num="5"', f'num="{2**63}"')
    return [
        _ascot(),
        *_messages(
            master(event("BIG", markets=big), ids=["BIG"]),
            update([ASCOT], PRICE.format(2**63)),
        ),
    ]


def oversize() -> list[LoggedMessage]:
    value = "x" * (DEFAULT_LIMITS.max_message_bytes + 1)
    return _messages(update([ASCOT], f'<replace sel="/event/@name">{value}</replace>'))


def namespace_flood_master() -> list[LoggedMessage]:
    ids = [f"NS-{i:03d}" for i in range(200)]
    return _messages(master(*(event(i) for i in ids), ids=ids, extra=declarations(150_000)))


def namespace_flood_updates() -> list[LoggedMessage]:
    operations = "".join(PRICE.format(n) for n in range(2, 42))
    bodies = [update([ASCOT], operations, extra=declarations(150_000)) for _ in range(3)]
    return [_ascot(), *_messages(*bodies)]


def namespace_spread() -> list[LoggedMessage]:
    # 160,000 declarations, 8 on each of 20,000 elements, within every other bound.
    content = ("<w>" + f"<x{declarations(8)}/>" * 5 + "</w>") * 4_000
    return [_ascot(), *_messages(update([ASCOT], f'<add sel="/event">{content}</add>'))]


def _uri_chars(count: int, ids: int) -> int:
    # URIs as long as fit the body bound beside `ids` small events.
    return (DEFAULT_LIMITS.max_message_bytes - 400 * ids - 30_000) // count


def worst_namespaces_master() -> list[LoggedMessage]:
    # Within every bound: 200 events under a root with the most declarations an element may
    # make, their URIs as long as the body bound allows; the split reads them per event.
    ids = [f"WN-{i:03d}" for i in range(DEFAULT_LIMITS.max_ids)]
    count = DEFAULT_LIMITS.max_namespaces
    extra = declarations(count, _uri_chars(count, len(ids)))
    return _messages(master(*(event(i, markets="") for i in ids), ids=ids, extra=extra))


def worst_namespaces_update() -> list[LoggedMessage]:
    # Within every bound: an update with the most declarations on its root, URIs as long as
    # fit, and 100 operations, each compiled under them; for as many masters as the split
    # bound allows a payload of that size (15).
    masters = DEFAULT_LIMITS.max_split_bytes // DEFAULT_LIMITS.max_message_bytes - 1
    ids = [f"WU-{i:03d}" for i in range(masters)]
    count = DEFAULT_LIMITS.max_namespaces
    operations = "".join(PRICE.format(n) for n in range(2, 102))
    extra = declarations(count, _uri_chars(count, len(ids)))
    masters = master(*(event(i) for i in ids), ids=ids)
    return [LoggedMessage("masters", masters), *_messages(update(ids, operations, extra=extra))]


CLASSES: dict[str, Callable[[], list[LoggedMessage]]] = {
    "baseline": baseline,
    "doctype-fifo": doctype_fifo,
    "relaxng-attributes": relaxng_attributes,
    "relaxng-children": relaxng_children,
    "xpath-cost": xpath_cost,
    "huge-id-list": huge_id_list,
    "price-overflow": price_overflow,
    "oversize": oversize,
    "namespace-flood-master": namespace_flood_master,
    "namespace-flood-updates": namespace_flood_updates,
    "namespace-spread": namespace_spread,
    "worst-namespaces-master": worst_namespaces_master,
    "worst-namespaces-update": worst_namespaces_update,
}


class Ends(NamedTuple):
    """End states: per hostile message, and whether the valid master after them applied."""

    hostile: dict[str, str]
    other_applied: bool


def _valid_other() -> LoggedMessage:
    return LoggedMessage("valid-other", master(event(OTHER), ids=[OTHER]))


def run_reference(messages: list[LoggedMessage]) -> Ends:
    from sis_platform.domain.pipeline import ReferencePipeline

    pipeline = ReferencePipeline()
    pipeline.process([*messages, _valid_other()])
    return _ends(
        [(r.message_id, str(r.reason or r.outcome)) for r in pipeline.results],
        pipeline.masters.get(OTHER) is not None,
    )


def run_worker(messages: list[LoggedMessage]) -> Ends:
    import pyarrow as pa

    from sis_platform.lake.spark.fold.worker import WorkerPlan, fold_one
    from sis_platform.lake.spark.items import _classify_batches
    from sis_platform.runtime.guard import Guard

    logged = [*messages, _valid_other()]
    raw = pa.RecordBatch.from_pydict(
        {
            "batch_key": ["b"] * len(logged),
            "batch_seq": [1] * len(logged),
            "msg_seq": list(range(len(logged))),
            "message_id": [m.message_id for m in logged],
            "delivery_count": [1] * len(logged),
            "body": [m.body for m in logged],
            "body_size": [len(m.body) for m in logged],
            "body_sha256": [""] * len(logged),
            "body_location": pa.array([None] * len(logged), pa.string()),
        }
    )
    rows = [
        row
        for batch in _classify_batches(iter([raw]), limits=DEFAULT_LIMITS, redelivery_limit=5)
        for row in batch.to_pylist()
    ]
    ends = [(r["message_id"], r["reason"]) for r in rows if r["reason"] is not None]
    by_master: dict[str, list[dict[str, object]]] = {}
    for row in rows:
        if row["reason"] is None:
            by_master.setdefault(row["master_id"], []).append(row)
    plan = WorkerPlan(selector_text=None, limits=DEFAULT_LIMITS)
    guard = Guard(None, DEFAULT_LIMITS.item_budget_seconds)
    other_applied = False
    try:
        for master_id, items in by_master.items():
            for out in fold_one(master_id, None, items, plan, guard):
                if out.message_id is None or out.outcome is None:
                    continue  # a version or state row
                ends.append((out.message_id, out.reason or out.outcome))
                other_applied |= master_id == OTHER and out.outcome == "applied"
    finally:
        guard.close()
    return _ends(ends, other_applied)


def _ends(results: list[tuple[str, str]], other_applied: bool) -> Ends:
    by_message: dict[str, Counter[str]] = {}
    for message_id, end in results:
        if message_id.startswith("hostile-"):
            by_message.setdefault(message_id, Counter())[end] += 1
    hostile = {
        m: ", ".join(f"{end} x{n}" if n > 1 else end for end, n in counts.items())
        for m, counts in sorted(by_message.items())
    }
    return Ends(hostile, other_applied)


PATHS = {"reference": run_reference, "worker": run_worker}


def one(name: str, path: str) -> dict[str, object]:
    messages = CLASSES[name]()
    PATHS[path]([])  # imports, the schema and the workers' caches, outside the measurement
    started = time.perf_counter()
    ends = PATHS[path](messages)
    seconds = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    hostile_bytes = sum(len(m.body) for m in messages if m.message_id.startswith("hostile-"))
    return {
        "class": name,
        "path": path,
        "bytes": hostile_bytes,
        "seconds": round(seconds, 2),
        "peak_mib": round(peak_mib),
        "ends": ends.hostile,
        "other_applied": ends.other_applied,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", choices=[*PATHS, "both"], default="both")
    parser.add_argument("--only", action="append", choices=list(CLASSES))
    parser.add_argument("--one", choices=list(CLASSES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        sys.stdout.write(json.dumps(one(args.one, args.path)) + "\n")
        return
    paths = list(PATHS) if args.path == "both" else [args.path]
    header = "| class | path | hostile bytes | seconds | peak RSS MiB | next master | ends |"
    lines = [header, "|---|---|---:|---:|---:|---|---|"]
    sys.stdout.write("\n".join(lines) + "\n")
    for name in args.only or list(CLASSES):
        for path in paths:
            out = subprocess.run(
                [sys.executable, __file__, "--one", name, "--path", path],
                capture_output=True,
                text=True,
                check=False,
            )
            if out.returncode == -signal.SIGKILL:
                line = f"| {name} | {path} | | | | | killed (SIGKILL: the guard's item budget) |"
            elif out.returncode != 0:
                line = f"| {name} | {path} | | | | | failed: {out.stderr.strip()[-200:]} |"
            else:
                r = json.loads(out.stdout)
                ends = "; ".join(f"{m}: {e}" for m, e in r["ends"].items()) or "-"
                applied = "applied" if r["other_applied"] else "NOT applied"
                line = (
                    f"| {name} | {path} | {r['bytes']:,} | {r['seconds']:.2f} | "
                    f"{r['peak_mib']:,} | {applied} | {ends} |"
                )
            sys.stdout.write(line + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
