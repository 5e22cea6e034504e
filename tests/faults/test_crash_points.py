"""The crash-point hook itself: inert unless SIS_CRASH_AT names a point, counts arrivals, and
refuses names it does not know (a typo would otherwise make a fault test crash nowhere)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sis_platform.runtime import faults
from tests.faults.processes import REPO, SIGKILLED

pytestmark = pytest.mark.faults


@pytest.fixture(autouse=True)
def _fresh_counts(monkeypatch):
    monkeypatch.setattr(faults, "_reached", {})


def test_points_are_inert_without_the_variable(monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    assert not any(faults.armed(p) for p in faults.CRASH_POINTS)
    faults.crash_point("consume.after_get")  # returns: nothing armed


def test_a_point_with_a_count_arms_on_that_arrival_only(monkeypatch):
    monkeypatch.setenv(faults.ENV, "write.fold_steps, fold.after_versions@3")
    assert [faults.armed("fold.after_versions") for _ in range(4)] == [False, False, True, False]
    assert faults.armed("write.fold_steps")
    assert not faults.armed("write.master_versions")


def test_an_unknown_point_is_refused(monkeypatch):
    monkeypatch.setenv(faults.ENV, "fold.after_version")
    with pytest.raises(ValueError, match="unknown crash point 'fold.after_version'"):
        faults.armed("fold.after_versions")


def test_an_armed_point_kills_the_process_with_sigkill():
    code = "from sis_platform.runtime.faults import crash_point; crash_point('consume.after_land')"
    env = {**os.environ, "PYTHONPATH": str(REPO), faults.ENV: "consume.after_land"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, timeout=60)
    assert proc.returncode == SIGKILLED
