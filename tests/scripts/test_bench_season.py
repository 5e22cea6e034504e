"""scripts/bench_season.py's plot: a panel per quantity over the days of a results file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture
def bench_season(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # the scripts import their neighbours by name
    import bench_season

    yield bench_season
    sys.modules.pop("bench_season", None)


def _day(day: int, scale: int) -> dict:
    table = {"rows": 100 * scale, "files": scale, "bytes": 1e6 * scale}
    return {
        "day": day,
        "run_p50_s": 30.0 + scale,
        "run_max_s": 90.0 + scale,
        "step_p50_s": {"fold_masters": 14.0 + scale, "interpreted_model": 11.0},
        "tables": {
            "selections": {**table, "deletion_vectors": scale, "log_entries": 10},
            "dead_letters": {**table, "rows": 0, "deletion_vectors": None, "log_entries": None},
        },
    }


def test_plot_from_draws_the_days_of_a_results_file(bench_season, tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    results.write_text(json.dumps([_day(1, 1), _day(30, 2), _day(365, 5)]))
    assert bench_season.main(["--plot-from", str(results)]) == 0
    assert (tmp_path / "season.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_table_a_later_day_added_is_drawn_from_the_day_it_appears(
    bench_season, tmp_path: Path
) -> None:
    first, last = _day(1, 1), _day(365, 5)
    del first["tables"]["dead_letters"]
    assert bench_season.plot_days([first, last], tmp_path / "season.png")
    assert (tmp_path / "season.png").stat().st_size > 0


def test_the_catch_up_is_drawn_beside_the_runs_on_the_days_that_measured_it(
    bench_season, tmp_path: Path
) -> None:
    first, last = _day(1, 1), _day(365, 5)
    last["catch_up"] = {"batches": 720, "wall_s": 400.0, "runs": []}
    assert bench_season.plot_days([first, last], tmp_path / "season.png")
    assert (tmp_path / "season.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_negative_catch_up_is_refused(bench_season) -> None:
    with pytest.raises(SystemExit) as refused:
        bench_season.parse_args(["--catch-up", "-1"])
    assert refused.value.code == 2
    assert bench_season.parse_args(["--days", "1,2", "--catch-up", "720"]).catch_up == 720
