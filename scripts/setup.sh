#!/usr/bin/env bash
# Set up a development environment: Java check, a virtualenv in .venv with the platform and its
# dev tools installed (editable). Idempotent: re-running only installs what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "sis-platform needs Python 3.11 or newer (found: $("$PYTHON" --version 2>&1))" >&2
  exit 1
fi

if ! command -v java >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing a Java runtime for Spark (openjdk-17-jre-headless)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless
  else
    echo "Spark needs Java 17 or newer: install a JDK (e.g. apt-get install openjdk-17-jre-headless)" >&2
    exit 1
  fi
fi

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.sis-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "== installing sis-platform and its dependencies into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[dev]"
  touch "$stamp"
fi

# Delta's jars resolved once into the user's cache (~/.cache/sis-platform/spark-jars): Spark
# drivers then take them from there instead of running Spark's resolver at every start.
if [ -z "${SIS_SPARK_JARS_DIR:-}" ]; then
  .venv/bin/sis-spark-jars --if-missing
fi

# A class-data archive of the Spark driver's classes (JDK AppCDS) in the user's cache: every
# run's Spark driver then starts faster. Built once per install of the JDK and the virtualenv
# (a few minutes; the first Spark start also fetches Delta's jars): a fresh virtualenv at the
# same path has new jar files, which the JVM would not map an older archive for.
# SIS_SPARK_CLASS_ARCHIVE=off skips it.
if [ "${SIS_SPARK_CLASS_ARCHIVE:-}" != off ]; then
  .venv/bin/sis-spark-archive --if-missing
fi
