"""The sis-live dashboard (deploy/grafana/sis-live.json) seen without Grafana, from a running
Prometheus that scrapes sis-live.

    python scripts/dashboard_snapshot.py [--prometheus http://127.0.0.1:9090]
        [--out bench-out/dashboard] [--minutes 15] [--scrape-seconds 15] [--var name=value ...]

For every panel, each of its queries (Grafana's variables substituted as Grafana would, with
`--scrape-seconds` as the data source's scrape interval) is evaluated over the last `--minutes`
through /api/v1/query_range, and the series that draw a line are counted; then the panel is
drawn by Prometheus's own graph page (one graph per query) in headless Chromium, one PNG per
panel in `--out`, with an index.html that lays them out under their titles. Exits 1 when a
query draws nothing (sis_platform/testing/dashboard.py does the work; the test that proves the
same on a running sis-live is tests/deploy/test_dashboard_data.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sis_platform.testing.dashboard import (
    DASHBOARD,
    Window,
    evaluate,
    panels,
    snapshot,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090")
    parser.add_argument("--out", type=Path, default=Path("bench-out/dashboard"))
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--scrape-seconds", type=float, default=15.0)
    parser.add_argument("--dashboard", type=Path, default=DASHBOARD)
    parser.add_argument(
        "--var", action="append", default=[], metavar="NAME=VALUE",
        help="a dashboard variable's value (the dashboard's own use none today)",
    )  # fmt: skip
    args = parser.parse_args()
    variables = dict(v.split("=", 1) for v in args.var)
    window = Window.last(args.minutes * 60, args.scrape_seconds)
    dashboard = panels(args.dashboard)
    empty = []
    for e in evaluate(args.prometheus, window, dashboard, variables):
        print(f"{e.panel.title} [{e.target.ref}]: {e.drawn} of {len(e.series)} series drawn")
        if not e.drawn:
            empty.append(f"{e.panel.title} [{e.target.ref}]")
    shots = snapshot(args.prometheus, args.out, window, dashboard, variables)
    print(f"{len(shots)} panels drawn into {args.out}/ (index.html); load {os.getloadavg()[0]:.2f}")
    if empty:
        print(f"no data: {', '.join(empty)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
