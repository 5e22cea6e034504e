#!/usr/bin/env bash
# Set up and run the full test suite: the environment, ActiveMQ for the broker tests, Chromium
# for the browser test, pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh -m "not spark" -x).
# --fast (first argument): the quick tier only, minutes instead of half an hour: the domain,
# settings, serving store and landing/log tests, without Spark, Dagster, brokers or browsers,
# and without mypy. CI runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=""
if [ "${1:-}" = --fast ]; then
  fast=yes
  shift
fi
./scripts/setup.sh
if [ -n "$fast" ]; then
  .venv/bin/ruff check .
  exec .venv/bin/python -m pytest -n "${SIS_TEST_WORKERS:-2}" --dist loadfile \
      -m "not (spark or dagster or broker or connect or e2e or faults or browser or cluster or prometheus)" \
      tests/domain tests/standards tests/test_settings.py tests/serving tests/log tests/intake \
      tests/runtime "$@"
fi
if [ -x scripts/activemq.sh ]; then
  ./scripts/activemq.sh install
fi
# Debian's prometheus (server and promtool) for the monitoring tests (tests/live/test_prometheus.py,
# tests/deploy/test_alert_rules.py), where it can be installed: as root on Debian.
if [ -x scripts/prometheus.sh ] && { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; }; then
  ./scripts/prometheus.sh install
fi
# Debian's chromium for the browser tests (tests/e2e/test_ui.py,
# tests/deploy/test_dashboard_data.py).
if [ -x scripts/chromium.sh ]; then
  ./scripts/chromium.sh install
fi
# Lint, formatting, types (pyproject.toml's [tool.mypy]) and the import floors
# ([tool.importlinter]) first: checks that fail fast before the long suite.
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy sis_platform
.venv/bin/lint-imports
# Two pytest-xdist workers, a test file at a time each: the Spark tests spend much of their time
# waiting (JVM starts, Delta commits), so two of them overlap well even on two cores. Files go
# out in collection order, which tests/conftest.py sorts heaviest first (their `cost` marks).
# SIS_TEST_WORKERS=0 runs everything in this one process.
# A worker that dies (a test killed its own process) ends the run at once, failed, naming the
# test: replacing it can leave the run waiting for ever on the rest of that worker's file.
exec .venv/bin/python -m pytest -n "${SIS_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder \
    --max-worker-restart 0 "$@"
