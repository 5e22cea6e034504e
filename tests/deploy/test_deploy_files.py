"""The deployment files under deploy/ (docs/deployment.md, "Kubernetes"): what can be proven
without a cluster or the Helm chart. They parse; the image, the Helm values and the sis-live
manifest name the same image, code location module, port, user, settings and volumes; no
secret is written in any of them; the PostgreSQL instance file loads as a Dagster instance on a
real (throwaway) PostgreSQL; and the instance settings the values give the chart load in Dagster.
The values file against the chart's own schema is checked outside the suite (the chart is not in
this repository): docs/deployment.md says how.
"""

from __future__ import annotations

import json
import re
import shutil
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import dagster as dg
import psycopg
import pytest
import yaml

# Tick statuses and instigator types are not part of Dagster's top-level API.
from dagster._core.definitions.run_request import InstigatorType
from dagster._core.scheduler.instigation import TickStatus

from sis_platform.settings.variables import SECRET_VARIABLES
from tests.pg import USER, PgCluster, cluster
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
VALUES = DEPLOY / "helm-values.yaml"
SIS_LIVE = DEPLOY / "sis-live.yaml"
INSTANCE = DEPLOY / "dagster-postgres.yaml"

pytestmark = pytest.mark.cost(40)

# Every secret the platform or Dagster reads: only ever from a Secret, never written in a file.
SECRETS = {
    *SECRET_VARIABLES,
    "SIS_STOMP_KEY_PASSWORD",
    "SIS_SPARK_SECRET_CONF",
    "DAGSTER_PG_PASSWORD",
    "SPARK_CONNECT_AUTHENTICATE_TOKEN",
}
SECRET_KEY = re.compile(r"(?i)password|passwd|token|secret_?conf|secret_?key|access_?key")


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def manifests() -> dict[tuple[str, str], dict[str, Any]]:
    docs = [doc for doc in yaml.safe_load_all(SIS_LIVE.read_text()) if doc]
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in docs}


def dockerfile_json(instruction: str) -> list[str]:
    """The exec-form arguments of the Dockerfile's (last) `instruction`, e.g. CMD."""
    lines = [
        line for line in DOCKERFILE.read_text().splitlines() if line.startswith(instruction + " ")
    ]
    assert lines, f"no {instruction} in {DOCKERFILE}"
    return list(json.loads(lines[-1][len(instruction) + 1 :]))


def dockerfile_env() -> dict[str, str]:
    """The ENV settings of the Dockerfile (continued lines joined)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            env.update(re.findall(r"(\w+)=(\S+)", line))
    return env


def user_deployment() -> dict[str, Any]:
    (deployment,) = load(VALUES)["dagster-user-deployments"]["deployments"]
    return dict(deployment)


def run_launcher() -> dict[str, Any]:
    launcher = load(VALUES)["runLauncher"]
    assert launcher["type"] == "K8sRunLauncher"
    return dict(launcher["config"]["k8sRunLauncher"])


def pod_template() -> dict[str, Any]:
    return dict(manifests()[("Deployment", "sis-live")]["spec"]["template"])


def sis_live_pod() -> dict[str, Any]:
    return dict(pod_template()["spec"])


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """Every (path, key, value) of a parsed YAML document's mappings."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield path, key, value
            yield from walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from walk(item, f"{path}/{index}")


def test_every_deploy_file_parses() -> None:
    files = sorted(DEPLOY.glob("*.yaml"))
    assert {f.name for f in files} >= {VALUES.name, SIS_LIVE.name, INSTANCE.name, "dagster.yaml"}
    for path in files:
        docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        assert docs and all(isinstance(doc, dict) for doc in docs), path


def test_image_serves_the_code_location_the_values_and_workspace_name() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    module = pyproject["tool"]["dagster"]["module_name"]
    workspace = load(ROOT / "workspace.yaml")
    assert workspace["load_from"][0]["python_module"]["module_name"] == module

    cmd = dockerfile_json("CMD")
    assert cmd[:3] == ["dagster", "api", "grpc"]
    assert cmd[cmd.index("--module-name") + 1] == module
    port = int(cmd[cmd.index("--port") + 1])
    assert f"EXPOSE {port}" in DOCKERFILE.read_text()

    deployment = user_deployment()
    args = deployment["dagsterApiGrpcArgs"]
    assert args[args.index("--module-name") + 1] == module
    assert deployment["port"] == port

    # One image for the code server, every run (the launcher takes the code server's image)
    # and sis-live; its tag is the package's version, as the Dockerfile's build command says.
    image = f"{deployment['image']['repository']}:{deployment['image']['tag']}"
    assert deployment["image"]["tag"] == pyproject["project"]["version"]
    assert f"-t {image} " in DOCKERFILE.read_text()
    assert "image" not in run_launcher()
    (container,) = sis_live_pod()["containers"]
    assert container["image"] == image
    assert container["args"] == ["sis-live"]


def test_entrypoint_sets_umask_077_and_keeps_the_command_given_as_args() -> None:
    entrypoint = dockerfile_json("ENTRYPOINT")
    assert entrypoint[:2] == ["tini", "--"]
    assert 'umask 077 && exec "$@"' in entrypoint


def test_image_bakes_in_java_and_deltas_jars_where_the_runtime_looks() -> None:
    text = DOCKERFILE.read_text()
    assert "openjdk-17-jre-headless" in text
    assert re.search(r"^FROM python:3\.11-slim", text, re.M)
    env = dockerfile_env()
    # cache_home() (sis_platform/settings) is $XDG_CACHE_HOME: the jars resolved at build time
    # are found there at run time.
    assert env["XDG_CACHE_HOME"].startswith("/opt/")
    assert "RUN sis-spark-jars" in text
    assert re.search(r"^USER 10001:10001$", text, re.M)


def test_every_pod_mounts_the_same_volumes_settings_and_user() -> None:
    objects = manifests()
    settings_map = objects[("ConfigMap", "sis-platform-env")]["data"]
    # The landing zone (with the lease) and the site's data folder, each a ReadWriteMany claim
    # mounted where the settings and the image's defaults put them.
    where = {"sis-landing": "SIS_LANDING_DIR", "sis-data": "SIS_DATA_DIR"}
    for claim, variable in where.items():
        spec = objects[("PersistentVolumeClaim", claim)]["spec"]
        assert spec["accessModes"] == ["ReadWriteMany"]
        assert dockerfile_env()[variable] == settings_map[variable]

    deployment, launcher, pod = user_deployment(), run_launcher(), sis_live_pod()
    (container,) = pod["containers"]
    for volumes, mounts in (
        (deployment["volumes"], deployment["volumeMounts"]),
        (launcher["volumes"], launcher["volumeMounts"]),
        (pod["volumes"], container["volumeMounts"]),
    ):
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in volumes
            if "persistentVolumeClaim" in v
        }
        assert sorted(claims.values()) == sorted(where)
        mounted = {claims[m["name"]]: m["mountPath"] for m in mounts if m["name"] in claims}
        assert mounted == {claim: settings_map[variable] for claim, variable in where.items()}

    settings = {"name": "sis-platform-env"}
    assert settings in deployment["envConfigMaps"]
    assert settings in launcher["envConfigMaps"]
    assert {"configMapRef": settings} in container["envFrom"]

    pod_users = [
        deployment["podSecurityContext"]["runAsUser"],
        launcher["runK8sConfig"]["podSpecConfig"]["securityContext"]["runAsUser"],
        pod["securityContext"]["runAsUser"],
    ]
    assert pod_users == [10001] * 3


def test_sis_live_is_one_replica_whose_successor_waits_for_the_lease() -> None:
    spec = manifests()[("Deployment", "sis-live")]["spec"]
    assert spec["replicas"] == 1
    # Only the lease holder is ready: a rollout that kept the old pod until the new one is ready
    # would never end, so the old one stops while the new one starts and waits for the lease.
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 1


def mounted_at(pod: dict[str, Any], container: dict[str, Any], path: Path) -> dict[str, Any]:
    """The volume of `pod` that `container` mounts at a folder holding `path`."""
    for mount in container["volumeMounts"]:
        if path.is_relative_to(mount["mountPath"]):
            (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
            return dict(volume)
    raise AssertionError(f"nothing mounted at {path}")


def test_sis_live_s_probes_ask_its_endpoint_and_its_heartbeat_is_on_a_volume_of_its_own() -> None:
    from sis_platform.settings import load_settings

    pod = sis_live_pod()
    (container,) = pod["containers"]
    (port,) = container["ports"]
    assert port["name"] == "metrics"
    probes = {
        kind: container[kind]["httpGet"]
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert probes == {
        "startupProbe": {"path": "/healthz", "port": "metrics"},
        "livenessProbe": {"path": "/healthz", "port": "metrics"},
        "readinessProbe": {"path": "/readyz", "port": "metrics"},
    }
    # The endpoint listens on the pod's own address at the probes' port, as the settings read
    # it once Kubernetes has put the pod's IP in (never every interface).
    objects = manifests()
    env = {
        **objects[("ConfigMap", "sis-platform-env")]["data"],
        **objects[("ConfigMap", "sis-live-env")]["data"],
    }
    own = {e["name"]: e for e in container["env"]}
    assert own["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    address = own["SIS_METRICS_ADDRESS"]["value"].replace("$(POD_IP)", "10.1.2.3")
    settings = load_settings({**env, "SIS_METRICS_ADDRESS": address, "SIS_SOURCE": "embedded"})
    assert settings.live.metrics_address == ("10.1.2.3", port["containerPort"])
    annotations = pod_template()["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port["containerPort"])
    # Only Prometheus is admitted, and only to that port.
    (rule,) = objects[("NetworkPolicy", "sis-live")]["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": port["containerPort"]}]
    (peer,) = rule["from"]
    assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    # The heartbeat's folder is the pod's own (never a shared claim another pod's beats reach).
    heartbeat = Path(env["SIS_LIVE_HEARTBEAT_FILE"])
    assert "emptyDir" in mounted_at(pod, container, heartbeat)
    # A beat older than the probe's bound fails it: the default bound, and one probe period on
    # top of it at most before a restart is due.
    assert "SIS_LIVE_STALL_SECONDS" not in env
    probe = container["livenessProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] <= 60


def test_the_code_server_s_port_admits_only_the_webserver_and_the_daemon() -> None:
    values = load(VALUES)
    deployment = user_deployment()
    policy = manifests()[("NetworkPolicy", "sis-code-server")]["spec"]
    assert policy["policyTypes"] == ["Ingress"]
    selected = policy["podSelector"]["matchLabels"]
    assert selected.items() <= deployment["labels"].items()
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": deployment["port"]}]
    (source,) = rule["from"]
    clients = source["podSelector"]["matchLabels"]
    assert set(source) == {"podSelector"}  # no namespaceSelector or ipBlock beside it
    for component in ("dagsterWebserver", "dagsterDaemon"):
        assert clients.items() <= values[component]["labels"].items(), component
    assert not clients.items() <= deployment["labels"].items()
    assert not clients.items() <= run_launcher().get("labels", {}).items()
    # The image run bare (no chart) serves on loopback only.
    cmd = dockerfile_json("CMD")
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    # sis-live admits Prometheus to its metrics port only (the probes' test checks which).
    sis_live = manifests()[("NetworkPolicy", "sis-live")]["spec"]
    assert sis_live["policyTypes"] == ["Ingress"]
    assert [p["port"] for rule in sis_live["ingress"] for p in rule["ports"]] == [9464]


PG_CA = Path("/etc/sis/pg-tls/ca.pem")


def test_every_postgresql_connection_verifies_the_server_s_certificate() -> None:
    from sis_platform.serving.location import PostgresLocation, parse_location

    values = load(VALUES)
    params = values["postgresql"]["postgresqlParams"]
    assert params == {"sslmode": "verify-full", "sslrootcert": str(PG_CA)}
    instance = load(INSTANCE)["storage"]["postgres"]["postgres_db"]
    assert instance["params"]["sslmode"] == "verify-full"
    serving = manifests()[("ConfigMap", "sis-platform-env")]["data"]["SIS_SERVING_URL"]
    location = parse_location(serving, {})
    assert isinstance(location, PostgresLocation)
    query = dict(parse_qsl(urlsplit(location.url).query))
    assert query == {"sslmode": "verify-full", "sslrootcert": str(PG_CA)}
    # The CA is mounted wherever a connection is made: Dagster's storage (webserver, daemon,
    # code server, runs) and the serving store (sis-live, code server, runs).
    pods = {
        "webserver": values["dagsterWebserver"],
        "daemon": values["dagsterDaemon"],
        "code server": user_deployment(),
        "runs": run_launcher(),
    }
    for name, spec in pods.items():
        volume = mounted_at(spec, spec, PG_CA)
        assert volume["secret"]["secretName"] == "sis-pg-tls", name
    pod = sis_live_pod()
    (container,) = pod["containers"]
    assert mounted_at(pod, container, PG_CA)["secret"]["secretName"] == "sis-pg-tls"


def test_run_pods_hold_the_spark_driver_within_their_memory_limit() -> None:
    driver = manifests()[("ConfigMap", "sis-platform-env")]["data"]["SIS_SPARK_DRIVER_MEMORY"]
    assert driver == "1536m"
    limits = run_launcher()["resources"]["limits"]
    requests = run_launcher()["resources"]["requests"]
    # The measured peak of a run's process tree is 3.9 GiB (BENCHMARKS.md): the limit is above
    # it, and well above the driver's heap.
    assert float(limits["memory"].removesuffix("Gi")) >= 4.5
    assert float(requests["memory"].removesuffix("Gi")) >= 4
    # The JVM sizes local[*] from the CPU limit: the cores the figures were measured on.
    assert limits["cpu"] == requests["cpu"] == "2"


def test_no_secret_is_written_in_any_deploy_file() -> None:
    documents = [*yaml.safe_load_all(SIS_LIVE.read_text()), load(VALUES), load(INSTANCE)]
    for document in filter(None, documents):
        assert document.get("kind") != "Secret", "a Secret's data belongs outside the repository"
        for path, key, value in walk(document):
            named = key in SECRETS or bool(SECRET_KEY.search(str(key)))
            if named and isinstance(value, str | int | float) and not isinstance(value, bool):
                assert value == "", f"{path}/{key} holds a secret"
            if isinstance(value, dict) and value.get("name") in SECRETS:
                assert "value" not in value, f"{path}/{key}: {value['name']} given inline"

    objects = manifests()
    for kind, name in objects:
        if kind == "ConfigMap":
            assert not set(objects[(kind, name)]["data"]) & SECRETS

    values = load(VALUES)
    assert values["generatePostgresqlPasswordSecret"] is False
    assert values["postgresql"]["postgresqlPassword"] == ""
    assert values["global"]["postgresqlSecretName"]
    # The platform's secrets reach the pods as whole Secrets (envSecrets, secretRef), by name.
    assert user_deployment()["envSecrets"] and run_launcher()["envSecrets"]
    (container,) = sis_live_pod()["containers"]
    assert [e for e in container["envFrom"] if "secretRef" in e]
    # Its own `env` holds only the pod's address and the metrics address built from it.
    assert {e["name"] for e in container["env"]} == {"POD_IP", "SIS_METRICS_ADDRESS"}

    for name in SECRETS:
        assert not re.search(rf"\b{name}\s*=", DOCKERFILE.read_text()), name


def test_instance_file_takes_every_connection_setting_from_the_environment() -> None:
    postgres_db = load(INSTANCE)["storage"]["postgres"]["postgres_db"]
    assert postgres_db["password"] == {"env": "DAGSTER_PG_PASSWORD"}
    connection = {k: v for k, v in postgres_db.items() if k not in ("scheme", "params")}
    assert all(set(value) == {"env"} for value in connection.values())


def test_instances_on_postgresql_name_dagster_postgres_driver() -> None:
    """dagster-postgres binds NOTIFY's parameter on the client, as psycopg2 does; SQLAlchemy
    2.1 takes psycopg 3 for a bare postgresql:// (tests/e2e/test_daemon.py found it)."""
    assert load(INSTANCE)["storage"]["postgres"]["postgres_db"]["scheme"] == "postgresql+psycopg2"
    assert load(VALUES)["postgresql"]["postgresqlScheme"] == "postgresql+psycopg2"


@pytest.mark.dagster
def test_the_values_instance_settings_load_in_dagster(tmp_path: Path) -> None:
    """The instance settings the values give the chart, as its templates write them into
    dagster.yaml (run coordinator, run retries and monitoring, additionalInstanceConfig copied
    as is), load in Dagster: a run limit in the run coordinator beside the `concurrency` block
    would be refused."""
    values = load(VALUES)
    daemon = values["dagsterDaemon"]
    queued = daemon["runCoordinator"]["config"]["queuedRunCoordinator"]
    assert "maxConcurrentRuns" not in queued
    instance_yaml = {
        "storage": {"sqlite": {"base_dir": str(tmp_path / "storage")}},
        "run_coordinator": {
            "module": "dagster._core.run_coordinator",
            "class": "QueuedRunCoordinator",
            "config": {"dequeue_interval_seconds": queued["dequeueIntervalSeconds"]},
        },
        "run_monitoring": {
            "enabled": daemon["runMonitoring"]["enabled"],
            "start_timeout_seconds": daemon["runMonitoring"]["startTimeoutSeconds"],
        },
        "run_retries": {
            "enabled": daemon["runRetries"]["enabled"],
            "max_retries": daemon["runRetries"]["maxRetries"],
        },
        "telemetry": {"enabled": values["telemetry"]["enabled"]},
        **values["additionalInstanceConfig"],
    }
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(instance_yaml))
    instance = dg.DagsterInstance.from_config(str(tmp_path))
    try:
        concurrency = instance.get_concurrency_config()
        assert concurrency.run_queue_config is not None
        assert concurrency.run_queue_config.max_concurrent_runs == 1
        assert concurrency.pool_config.default_pool_limit == 1
    finally:
        instance.dispose()


@pytest.mark.dagster
def test_every_instance_purges_sensor_ticks_after_a_bounded_time(tmp_path: Path) -> None:
    """Sensors tick every few seconds: an instance that keeps every tick grows by some 50,000
    rows a day. Each instance file, and the chart's values, bound every tick status."""
    shutil.copy(ROOT / "deploy" / "dagster.yaml", tmp_path / "dagster.yaml")
    instance = dg.DagsterInstance.from_config(str(tmp_path))
    try:
        kept = instance.get_tick_retention_settings(InstigatorType.SENSOR)
    finally:
        instance.dispose()
    assert set(kept) >= {TickStatus.SKIPPED, TickStatus.SUCCESS, TickStatus.FAILURE}
    assert all(0 < days <= 30 for days in kept.values()), kept
    local = load(ROOT / "deploy" / "dagster.yaml")["retention"]
    assert load(INSTANCE)["retention"] == local
    chart = load(VALUES)["retention"]
    assert chart["enabled"] is True
    assert chart["sensor"]["purgeAfterDays"] == local["sensor"]["purge_after_days"]
    assert chart["schedule"]["purgeAfterDays"] == local["schedule"]["purge_after_days"]


@pytest.fixture
def pg_on_loopback() -> Iterator[PgCluster]:
    """A throwaway cluster (tests/pg.py) on a loopback TCP port, with TLS: dagster-postgres
    connects by host name and port, and the instance file verifies the server."""
    with cluster(port=free_port(), tls=True) as running:
        yield running


@pytest.mark.dagster
def test_postgres_instance_file_loads_as_a_dagster_instance(
    pg_on_loopback: PgCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pg = pg_on_loopback
    admin = f"postgresql://{USER}@127.0.0.1:{pg.port}/postgres"
    with psycopg.connect(admin, password=pg.password, autocommit=True) as conn:
        conn.execute("CREATE DATABASE dagster")
    for name, value in pg.dagster_env("dagster").items():  # PGSSLROOTCERT too: verify-full
        monkeypatch.setenv(name, value)
    shutil.copy(INSTANCE, tmp_path / "dagster.yaml")

    instance = dg.DagsterInstance.from_config(str(tmp_path))
    try:
        storages = [
            type(instance.run_storage).__name__,
            type(instance.event_log_storage).__name__,
            type(instance.schedule_storage).__name__,
        ]
        assert storages == [
            "PostgresRunStorage",
            "PostgresEventLogStorage",
            "PostgresScheduleStorage",
        ]
        assert instance.get_runs() == []
        # An event stored and read back (storing one NOTIFYs listeners: the driver matters).
        instance.report_runless_asset_event(dg.AssetMaterialization("smoke"))
        assert instance.get_latest_materialization_event(dg.AssetKey("smoke")) is not None
        concurrency = instance.get_concurrency_config()
        assert concurrency.run_queue_config is not None
        assert concurrency.run_queue_config.max_concurrent_runs == 1
        assert concurrency.pool_config.default_pool_limit == 1
    finally:
        instance.dispose()
    # The file holds no password: the instance read it from the environment.
    assert pg.password not in (tmp_path / "dagster.yaml").read_text()
