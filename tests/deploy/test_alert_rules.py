"""The alert rules shipped for sis-live (deploy/prometheus/alerts.yml): valid for Prometheus
(`promtool check rules`), behaving as their unit tests say (`promtool test rules`,
tests/deploy/alerts_test.yml), and naming only metrics sis-live exports (the lake's among them);
and the Grafana dashboard (deploy/grafana/sis-live.json): valid PromQL naming only those
metrics."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from sis_platform.live.lakelag import LakeLag
from sis_platform.live.metrics import LiveMetrics, LiveState
from sis_platform.serving import LakeProgress
from tests.prometheus import prometheus_binary

pytestmark = pytest.mark.cost(5)

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
UNIT_TESTS = Path(__file__).with_name("alerts_test.yml")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [prometheus_binary("promtool"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.prometheus
def test_promtool_accepts_the_alert_rules() -> None:
    checked = promtool("check", "rules", str(ALERTS))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


@pytest.mark.prometheus
def test_the_alert_rules_pass_their_unit_tests() -> None:
    tested = promtool("test", "rules", str(UNIT_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    tested_alerts = set(re.findall(r"alertname: (\w+)", UNIT_TESTS.read_text()))
    assert len(tested_alerts) >= 2, tested_alerts


def exported_names() -> set[str]:
    """Every sample name a sis-live with every gauge present exports."""
    metrics = LiveMetrics()
    state = LiveState(
        holding=True,
        landed=(1, 2),
        applied=(1, 1),
        behind_seconds=0.0,
        source_connected=True,
        store_available=True,
        halted=False,
        heartbeat_age_seconds=0.5,
        alive=True,
        ready=True,
        lake=LakeLag(LakeProgress(1, 1, datetime.now(UTC), 0), 1, None),
    )
    metrics.watch(lambda: state)
    return {s.name for family in metrics.registry.collect() for s in family.samples}


def test_every_alert_names_metrics_sis_live_exports() -> None:
    exported = exported_names()
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    assert {r["alert"] for r in rules} >= {
        "SisLiveNotProgressing",
        "SisLiveStoreBehind",
        "SisLiveDeadLetterRate",
        "SisLiveLeaseLost",
        "SisLiveLeaseFlapping",
        "SisLakeLagging",
    }
    for rule in rules:
        named = set(re.findall(r"\b(sis_(?:live|lake)_\w+)", rule["expr"]))
        assert named, rule["alert"]
        assert named <= exported, (rule["alert"], named - exported)


DASHBOARD = ROOT / "deploy" / "grafana" / "sis-live.json"


def test_the_dashboard_names_only_metrics_sis_live_exports() -> None:
    """Every panel of the shipped Grafana dashboard queries metrics sis-live exports (or the
    process collector's, joined to sis-live's own), through the dashboard's data source."""
    exported = exported_names()
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "sis-live"
    panels = dashboard["panels"]
    assert len(panels) >= 10
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            named = set(re.findall(r"\b(sis_(?:live|lake)_\w+|process_\w+)", target["expr"]))
            assert named, (panel["title"], target["expr"])
            own = {n for n in named if n.startswith(("sis_live_", "sis_lake_"))}
            assert own <= exported, (panel["title"], own - exported)
            assert named - own <= {"process_resident_memory_bytes"}, panel["title"]


@pytest.mark.prometheus
def test_the_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """Each panel query, as a recording rule, passes `promtool check rules` (PromQL syntax)."""
    targets = [t for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]
    rules = [{"record": f"dashboard:query_{i}", "expr": t["expr"]} for i, t in enumerate(targets)]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = promtool("check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
