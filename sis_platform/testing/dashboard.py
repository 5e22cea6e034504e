"""The shipped Grafana dashboard (deploy/grafana/sis-live.json) queried and drawn without Grafana:
each panel's targets with Grafana's variables substituted as Grafana substitutes them, evaluated
over a time range through a Prometheus server's HTTP API (`/api/v1/query_range`, as Grafana's
Prometheus data source does), and each panel drawn by that server's own graph page in headless
Chromium (Debian's, driven by Playwright). Used by tests/deploy/test_dashboard_data.py and
scripts/dashboard_snapshot.py."""

from __future__ import annotations

import html
import json
import math
import re
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "sis-live.json"
CHROMIUM = Path("/usr/bin/chromium")  # Debian's package (scripts/chromium.sh install)
# Grafana's Prometheus data source: the points a panel asks for at most (about its width in
# pixels), which sets $__interval and the query's step.
MAX_DATA_POINTS = 1000
# Grafana's `$name`, `${name}`, `${name:format}` and the deprecated `[[name]]`.
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
SERIES_SHOWN = re.compile(r"Total time series: (\d+)")


@dataclass(frozen=True)
class Target:
    """One query of a panel, as the dashboard's JSON has it."""

    ref: str  # the target's refId (A, B, ...)
    expr: str  # PromQL, with Grafana's variables unsubstituted
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    targets: tuple[Target, ...]


@dataclass(frozen=True)
class Window:
    """The time range a dashboard shows, and the step its queries take (Grafana's $__interval:
    the range over the panel's points, never under the data source's scrape interval; Grafana's
    rounding to a round interval is left out). Its start and end are multiples of the step, as
    Grafana aligns them, so its last step may lie up to a step before `end` asked."""

    start: float  # Unix seconds
    end: float
    step: float  # seconds
    scrape_seconds: float  # the data source's scrape interval, for $__rate_interval

    @classmethod
    def last(cls, seconds: float, scrape_seconds: float, end: float | None = None) -> Window:
        end = time.time() if end is None else end
        step = max(scrape_seconds, math.ceil(seconds / MAX_DATA_POINTS))
        aligned = math.floor(end / step) * step
        return cls(math.floor((end - seconds) / step) * step, aligned, float(step), scrape_seconds)


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    values: list[float]  # every value of the range, NaN included

    @property
    def drawn(self) -> bool:
        """A line a graph draws: at least one finite value (a histogram quantile over no
        observations is NaN, which no graph draws)."""
        return any(math.isfinite(v) for v in self.values)


@dataclass(frozen=True)
class Evaluated:
    """A panel's target as Prometheus answered it over a window."""

    panel: Panel
    target: Target
    expr: str  # as sent: Grafana's variables substituted
    series: list[Series]

    @property
    def drawn(self) -> int:
        """How many of its series draw a line."""
        return sum(s.drawn for s in self.series)


@dataclass(frozen=True)
class PanelShot:
    """One panel drawn by Prometheus's graph page: the picture, and the series the page said
    each of the panel's queries returned."""

    panel: Panel
    png: Path
    url: str
    series: tuple[int, ...]  # per target, in the panel's order


def panels(path: Path = DASHBOARD) -> list[Panel]:
    """The dashboard's panels with their targets, in the JSON's order."""
    dashboard = json.loads(path.read_text())
    return [
        Panel(
            p["title"],
            tuple(Target(t["refId"], t["expr"], t.get("legendFormat", "")) for t in p["targets"]),
        )
        for p in dashboard["panels"]
    ]


def substitute(expr: str, window: Window, variables: dict[str, str] | None = None) -> str:
    """`expr` with Grafana's variables replaced as Grafana does for a Prometheus query over
    `window`: the built-in `$__interval`, `$__interval_ms`, `$__rate_interval`
    (max($__interval + scrape interval, 4 x scrape interval)), `$__range`, `$__range_s`,
    `$__range_ms`, and the dashboard's own variables from `variables` (a multi-value "All" is
    the caller's regex, e.g. `.*`). An unknown variable raises ValueError: a query Grafana
    would send differently must not pass unseen."""
    span = window.end - window.start
    rate_interval = max(window.step + window.scrape_seconds, 4 * window.scrape_seconds)
    builtin = {
        "__interval": f"{window.step:g}s",
        "__interval_ms": f"{window.step * 1000:g}",
        "__rate_interval": f"{rate_interval:g}s",
        "__range": f"{span:.0f}s",
        "__range_s": f"{span:.0f}",
        "__range_ms": f"{span * 1000:.0f}",
    }
    known = {**builtin, **(variables or {})}

    def value(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g is not None)
        if name not in known:
            raise ValueError(f"no value for Grafana variable {name!r} in {expr!r}")
        return known[name]

    return VARIABLE.sub(value, expr)


def query_range(prometheus: str, expr: str, window: Window) -> list[Series]:
    """The series `expr` returns over `window` from the server at `prometheus` (its base URL)."""
    query = urllib.parse.urlencode(
        {"query": expr, "start": window.start, "end": window.end, "step": window.step}
    )
    url = f"{prometheus.rstrip('/')}/api/v1/query_range?{query}"
    with urllib.request.urlopen(url, timeout=60) as response:
        answer: dict[str, Any] = json.loads(response.read())
    if answer["status"] != "success":
        raise RuntimeError(f"{expr!r}: {answer}")
    return [
        Series(dict(s["metric"]), [float(v) for _, v in s["values"]])
        for s in answer["data"]["result"]
    ]


def evaluate(
    prometheus: str, window: Window, dashboard: list[Panel], variables: dict[str, str] | None = None
) -> list[Evaluated]:
    """Every target of `dashboard` evaluated over `window`, in the dashboard's order."""
    evaluated = []
    for panel in dashboard:
        for target in panel.targets:
            expr = substitute(target.expr, window, variables)
            evaluated.append(Evaluated(panel, target, expr, query_range(prometheus, expr, window)))
    return evaluated


def graph_url(prometheus: str, exprs: list[str], range_input: str) -> str:
    """Prometheus's graph page with one graph per expression over the last `range_input`."""
    params: dict[str, str] = {}
    for i, expr in enumerate(exprs):
        params |= {f"g{i}.expr": expr, f"g{i}.tab": "0", f"g{i}.range_input": range_input}
    return f"{prometheus.rstrip('/')}/graph?{urllib.parse.urlencode(params)}"


def snapshot(
    prometheus: str,
    out: Path,
    window: Window,
    dashboard: list[Panel],
    variables: dict[str, str] | None = None,
) -> list[PanelShot]:
    """One PNG per panel in `out` (Prometheus's graph page, a graph per target, over the last
    `window`'s span), and `index.html` laying them out under their titles."""
    from playwright.sync_api import sync_playwright  # heavy: only where a browser is wanted

    if not CHROMIUM.is_file():
        raise FileNotFoundError(f"{CHROMIUM} is missing: run scripts/chromium.sh install (as root)")
    out.mkdir(parents=True, exist_ok=True)
    range_input = f"{max(1, round((window.end - window.start) / 60))}m"
    shots = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            for number, panel in enumerate(dashboard, 1):
                exprs = [substitute(t.expr, window, variables) for t in panel.targets]
                url = graph_url(prometheus, exprs, range_input)
                page.goto(url)
                # The page has drawn when every graph shows its statistics (or an error): an
                # event of the page, awaited.
                page.wait_for_function(
                    """n => {
                        const graphs = [...document.querySelectorAll('.graph_wrapper')];
                        return graphs.length >= n && graphs.every(g =>
                            g.querySelector('.eval_stats').textContent.includes('Total time')
                            || g.querySelector('.error').textContent !== '');
                    }""",
                    arg=len(exprs),
                    timeout=60_000,
                )
                # The fixed navigation bar would cover a graph of a full-page picture (and the room
                # kept for it would stay blank).
                page.add_style_tag(
                    content="nav.navbar { display: none !important; } "
                    "body { padding-top: 0 !important; }"
                )
                page.evaluate("() => document.activeElement && document.activeElement.blur()")
                stats = page.locator(".eval_stats").all_inner_texts()
                series = tuple(
                    int(m.group(1)) if (m := SERIES_SHOWN.search(s)) else 0 for s in stats
                )
                png = out / f"{number:02d}-{_slug(panel.title)}.png"
                page.screenshot(path=str(png), full_page=True)
                shots.append(PanelShot(panel, png, url, series))
        finally:
            browser.close()
    (out / "index.html").write_text(_index(shots, window))
    return shots


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:60]


def _index(shots: list[PanelShot], window: Window) -> str:
    taken = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(window.end))
    cells = []
    for shot in shots:
        queries = "".join(
            f"<li><code>{html.escape(t.expr)}</code> ({n} series)</li>"
            for t, n in zip(shot.panel.targets, shot.series, strict=False)
        )
        cells.append(
            f"<section><h2>{html.escape(shot.panel.title)}</h2><ul>{queries}</ul>"
            f'<a href="{html.escape(shot.url)}"><img src="{shot.png.name}" '
            f'alt="{html.escape(shot.panel.title)}"></a></section>'
        )
    return (
        "<!doctype html><meta charset=utf-8><title>sis-live dashboard</title><style>"
        "body{font-family:sans-serif;margin:1em}main{display:grid;"
        "grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:1em}"
        "img{width:100%;border:1px solid #ccc}h2{font-size:1.1em;margin:.2em 0}"
        "ul{font-size:.8em;padding-left:1.2em}</style>"
        f"<h1>sis-live dashboard (deploy/grafana/sis-live.json), {taken}</h1>"
        f"<p>Each panel's queries drawn by Prometheus's graph page over the last "
        f"{(window.end - window.start) / 60:.0f} minutes.</p><main>{''.join(cells)}</main>\n"
    )
