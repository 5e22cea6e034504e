#!/usr/bin/env bash
# Set up and run the platform on its embedded default: an embedded durable queue fed by the
# feed simulator, sis-live consuming it into the landing zone and the serving store, local Spark
# with Delta tables under ./data, and Dagster (webserver + daemon), all under one supervisor
# (sis-run, sis_platform/runtime/supervisor.py): every program's output on stderr prefixed with its
# name, a program that dies restarted with backoff, and Ctrl-C, SIGTERM or SIGHUP stop every
# process it started, Dagster's run workers included.
#
#   SIS_SIM_MESSAGES  messages the simulator publishes (default 12000, one racing day; 0: none)
#   SIS_SIM_RATE      messages per second (default 4.2; "backlog" publishes all at once)
#   SIS_SIM_SEED      the simulated day's seed (default 1)
#   SIS_UI_HOST/PORT  where the Dagster UI listens (default 127.0.0.1:3000)
#   SIS_DATA_DIR      where everything is kept (default ./data)
#   SIS_INTAKE        live (default): sis-live consumes the queue; sensor: the Dagster sensor
#                     does, and sis-live is not started
#   SIS_SPARK         local (default): every run starts a Spark driver of its own; connect: one
#                     long-lived Spark Connect server (sis-spark-connect, started first) that
#                     every run uses, so no run warms up a JVM of its own (SIS_SPARK_CONNECT_PORT,
#                     default 15002)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# shellcheck disable=SC1091
source .venv/bin/activate
# What the platform writes from here on (lake, Dagster's instance, logs) is private to this user.
umask 077

export SIS_DATA_DIR="${SIS_DATA_DIR:-$PWD/data}"
export DAGSTER_HOME="$SIS_DATA_DIR/dagster"
mkdir -p "$DAGSTER_HOME"
cp deploy/dagster.yaml "$DAGSTER_HOME/dagster.yaml"

SPARK=${SIS_SPARK:-local}
spark=(--spark "$SPARK")
case "$SPARK" in
  local) ;;
  connect)
    CONNECT_PORT=${SIS_SPARK_CONNECT_PORT:-15002}
    spark+=(--spark-connect-port "$CONNECT_PORT")
    # Every run connects to the server sis-run starts (and waits for) before Dagster, with the
    # token sis-run makes unless SPARK_CONNECT_AUTHENTICATE_TOKEN is set. `localhost`, not
    # 127.0.0.1: PySpark sends a token without TLS only to that host (docs/spark-connect.md).
    export SIS_SPARK_MASTER="sc://localhost:$CONNECT_PORT"
    ;;
  *) echo "SIS_SPARK=$SPARK: expected local or connect" >&2; exit 2 ;;
esac

# exec: the supervisor takes this process's pid, so signalling it stops everything.
exec sis-run --workspace workspace.yaml \
  --host "${SIS_UI_HOST:-127.0.0.1}" --port "${SIS_UI_PORT:-3000}" "${spark[@]}" \
  --sim-messages "${SIS_SIM_MESSAGES:-12000}" --sim-rate "${SIS_SIM_RATE:-4.2}" \
  --sim-seed "${SIS_SIM_SEED:-1}"
