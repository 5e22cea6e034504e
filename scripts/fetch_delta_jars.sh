#!/usr/bin/env bash
# Fetch Delta's jars and their runtime dependencies with Maven (mvn dependency:copy-dependencies)
# into a cache folder, for machines where Spark's own resolver (spark.jars.packages) cannot
# reach Maven Central. Then: export SIS_SPARK_JARS_DIR=<that folder>. Scala and SLF4J are left
# out: Spark ships its own.
# Usage: scripts/fetch_delta_jars.sh [DEST]   (default ~/.cache/sis-platform/delta-jars)
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-$HOME/.cache/sis-platform/delta-jars}"
coordinate="$(.venv/bin/python -c \
  'from sis_platform.resources.spark import delta_package; print(delta_package())')"
IFS=: read -r group artifact version <<<"$coordinate"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat >"$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.sis</groupId><artifactId>delta-jars</artifactId><version>1</version>
  <dependencies>
    <dependency>
      <groupId>$group</groupId><artifactId>$artifact</artifactId><version>$version</version>
    </dependency>
  </dependencies>
</project>
POM
mkdir -p "$dest"
mvn -q -f "$work/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
  -DexcludeArtifactIds=scala-library,slf4j-api -DoutputDirectory="$dest"
echo "Delta jars for $coordinate in $dest:"
ls -1 "$dest"
echo "export SIS_SPARK_JARS_DIR=$dest"
