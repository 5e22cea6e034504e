"""The alert rules shipped for sis-live (deploy/prometheus/alerts.yml): valid for Prometheus
(`promtool check rules`), behaving as their unit tests say (`promtool test rules`,
tests/deploy/alerts_test.yml), and naming only metrics sis-live exports."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from sis_platform.live.metrics import LiveMetrics, LiveState
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
    }
    for rule in rules:
        named = set(re.findall(r"\b(sis_live_\w+)", rule["expr"]))
        assert named, rule["alert"]
        assert named <= exported, (rule["alert"], named - exported)
