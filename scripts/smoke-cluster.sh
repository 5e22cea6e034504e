#!/usr/bin/env bash
# The production deployment's parts, started on this machine and run with the feed simulator
# (the tests marked `cluster`; docs/deployment.md, "Proven on one machine"):
# - the batch runs' Spark driver on a standalone cluster (a master and two workers from the
#   pyspark distribution), their Delta tables on S3-compatible storage (moto's S3 server) under
#   s3a://, the object store's keys from SIS_SPARK_SECRET_CONF (tests/cluster);
# - Dagster on PostgreSQL (deploy/dagster-postgres.yaml): the daemon runs the sensor and the
#   runs, the webserver shows them, sis-live beside them (tests/e2e/test_daemon.py).
# Each compares the lake (and the serving store) with the reference fold. Every listener is on
# loopback. The first run fetches the S3A connector's jars from Maven Central (about 700 MB).
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m pytest -m cluster -p no:xdist "$@"
