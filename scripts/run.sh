#!/usr/bin/env bash
# Set up and run the platform on its embedded default: an embedded durable queue fed by the
# feed simulator, local Spark with Delta tables under ./data, and Dagster (webserver + daemon).
#
#   SIS_SIM_MESSAGES  messages the simulator publishes (default 12000, one racing day)
#   SIS_SIM_RATE      messages per second (default 4.2; "backlog" publishes all at once)
#   SIS_UI_HOST/PORT  where the Dagster UI listens (default 127.0.0.1:3000)
#   SIS_DATA_DIR      where everything is kept (default ./data)
#   SIS_SPARK         local (default): every run starts a Spark driver of its own; connect: one
#                     long-lived Spark Connect server (sis-spark-connect, started here) that
#                     every run uses, so no run warms up a JVM of its own (SIS_SPARK_CONNECT_PORT,
#                     default 15002)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# shellcheck disable=SC1091
source .venv/bin/activate

export SIS_DATA_DIR="${SIS_DATA_DIR:-$PWD/data}"
export DAGSTER_HOME="$SIS_DATA_DIR/dagster"
mkdir -p "$DAGSTER_HOME"
cp deploy/dagster.yaml "$DAGSTER_HOME/dagster.yaml"
HOST=${SIS_UI_HOST:-127.0.0.1}
PORT=${SIS_UI_PORT:-3000}
MESSAGES=${SIS_SIM_MESSAGES:-12000}
RATE=${SIS_SIM_RATE:-4.2}

SPARK=${SIS_SPARK:-local}
case "$SPARK" in
  local|connect) ;;
  *) echo "SIS_SPARK=$SPARK: expected local or connect" >&2; exit 2 ;;
esac
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
if [ "$SPARK" = connect ]; then
  CONNECT_PORT=${SIS_SPARK_CONNECT_PORT:-15002}
  connect_log="$SIS_DATA_DIR/spark-connect.log"
  echo "== Spark Connect server on sc://127.0.0.1:$CONNECT_PORT (log: $connect_log)"
  # Its own process group, so stopping it stops its JVM too.
  setsid sis-spark-connect --port "$CONNECT_PORT" > "$connect_log" 2>&1 &
  server=$!
  pids+=(-- "-$server")
  # Ready when its log says so (the tail ends, and the wait with it, if the server exits).
  if ! grep -q -m1 "Spark Connect server started at" \
      <(tail -n +1 -f --pid="$server" "$connect_log"); then
    echo "the Spark Connect server did not start: see $connect_log" >&2
    exit 1
  fi
  export SIS_SPARK_MASTER="sc://127.0.0.1:$CONNECT_PORT"
fi

if [ "$RATE" = backlog ]; then pace=(--backlog); else pace=(--rate "$RATE"); fi
echo "== feed simulator: $MESSAGES messages into embedded://$SIS_DATA_DIR/queue (${pace[*]})"
sis-feed publish --to "embedded://$SIS_DATA_DIR/queue" --messages "$MESSAGES" \
  --seed "${SIS_SIM_SEED:-1}" --duplicates 0.01 \
  --invalid not-well-formed=0.002 --invalid schema-invalid=0.002 "${pace[@]}" \
  2> >(sed 's/^/[sis-feed] /' >&2) &
pids+=($!)

echo
echo "   Dagster UI: http://$HOST:$PORT   (data under $SIS_DATA_DIR; Ctrl-C stops everything)"
echo
dagster dev -w workspace.yaml -h "$HOST" -p "$PORT"
