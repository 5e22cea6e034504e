#!/usr/bin/env bash
# Set up and run the full test suite: the environment, ActiveMQ for the broker tests, pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh -m "not spark" -x).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if [ -x scripts/activemq.sh ]; then
  ./scripts/activemq.sh install
fi
exec .venv/bin/python -m pytest "$@"
