"""Webhook notifications of failed runs and checks (sis_platform/sensors/notify.py,
sis_platform/runtime/webhook.py), posted to a real HTTP receiver on loopback from a Dagster
instance on disk: what is posted, once per failure, with the token; a receiver that is down or
redirects fails the tick without losing the notification; and the URL's rules."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import dagster as dg
import pytest

from sis_platform.definitions import build_definitions
from sis_platform.runtime.webhook import Webhook, WebhookFailed
from sis_platform.sensors.notify import (
    CHECK_FAILURE_SENSOR_NAME,
    RUN_FAILURE_SENSOR_NAME,
    TOKEN_VARIABLE,
    build_notify_sensors,
)
from sis_platform.settings import ConfigurationError, load_settings

pytestmark = [pytest.mark.dagster]

WAIT_SECONDS = 30.0


class Receiver:
    """A webhook receiver: each POST's headers and JSON body, in order; answers `status`."""

    def __init__(self) -> None:
        self.posts: queue.Queue[tuple[dict[str, str], dict[str, Any]]] = queue.Queue()
        self.status = 204
        self.url = ""

    def next(self) -> tuple[dict[str, str], dict[str, Any]]:
        return self.posts.get(timeout=WAIT_SECONDS)

    def none_left(self) -> bool:
        return self.posts.empty()


@contextmanager
def receiver() -> Iterator[Receiver]:
    got = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.posts.put((dict(self.headers), json.loads(body)))
            self.send_response(got.status)
            if got.status in (301, 302):
                self.send_header("Location", "http://127.0.0.1:9/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    got.url = f"http://127.0.0.1:{server.server_address[1]}/hook?key=abc"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield got
    finally:
        server.shutdown()
        server.server_close()


@dg.op
def fails() -> None:
    raise RuntimeError("the batch could not be read")


@dg.job
def failing_job() -> None:
    fails()


@dg.asset
def watched() -> int:
    return 1


@dg.asset_check(asset=watched)
def watched_is_two() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=False, description="watched is 1, not 2")


@dg.asset_check(asset=watched)
def watched_is_one() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=True)


DEFS = dg.Definitions(assets=[watched], asset_checks=[watched_is_two, watched_is_one])


def tick(sensor: dg.SensorDefinition, instance: dg.DagsterInstance, cursor: str | None) -> Any:
    """One evaluation of `sensor` over DEFS' checks."""
    return sensor(dg.build_sensor_context(instance=instance, cursor=cursor, definitions=DEFS))


def sensors(url: str) -> dict[str, dg.SensorDefinition]:
    return {s.name: s for s in build_notify_sensors(url)}


def test_a_failed_run_is_posted_with_its_job_run_and_message(monkeypatch, tmp_path):
    monkeypatch.setenv(TOKEN_VARIABLE, "s3cret")
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance, receiver() as hook:
        result = failing_job.execute_in_process(instance=instance, raise_on_error=False)
        assert not result.success
        context = dg.build_run_status_sensor_context(
            sensor_name=RUN_FAILURE_SENSOR_NAME,
            dagster_instance=instance,
            dagster_run=result.dagster_run,
            dagster_event=result.get_run_failure_event(),
        ).for_run_failure()
        sensors(hook.url)[RUN_FAILURE_SENSOR_NAME](context)
        headers, body = hook.next()
    assert headers["Authorization"] == "Bearer s3cret"
    assert body["kind"] == "run_failed"
    assert body["job"] == "failing_job"
    assert body["run_id"] == result.run_id
    assert "fails" in body["message"]


LETTERS = dg.StaticPartitionsDefinition(["a", "b", "c"])


@dg.asset(partitions_def=LETTERS)
def unreadable() -> None:
    raise RuntimeError("the batches could not be read")


def test_a_failed_run_over_a_range_is_posted_with_its_range(tmp_path):
    defs = dg.Definitions(
        assets=[unreadable],
        jobs=[dg.define_asset_job("range_job", selection=[unreadable], partitions_def=LETTERS)],
    )
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance, receiver() as hook:
        result = defs.resolve_job_def("range_job").execute_in_process(
            instance=instance,
            tags={
                "dagster/asset_partition_range_start": "a",
                "dagster/asset_partition_range_end": "b",
            },
            raise_on_error=False,
        )
        assert not result.success
        context = dg.build_run_status_sensor_context(
            sensor_name=RUN_FAILURE_SENSOR_NAME,
            dagster_instance=instance,
            dagster_run=result.dagster_run,
            dagster_event=result.get_run_failure_event(),
        ).for_run_failure()
        sensors(hook.url)[RUN_FAILURE_SENSOR_NAME](context)
        _, body = hook.next()
    assert body["partition"] is None
    assert body["partition_range"] == {"start": "a", "end": "b"}


def test_each_failed_check_is_posted_once_with_or_without_a_run_and_passed_ones_never(tmp_path):
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance, receiver() as hook:
        sensor = sensors(hook.url)[CHECK_FAILURE_SENSOR_NAME]
        first = tick(sensor, instance, None)
        assert isinstance(first, dg.SensorResult) and first.cursor is not None

        run = dg.materialize([watched, watched_is_two, watched_is_one], instance=instance)
        second = tick(sensor, instance, first.cursor)
        _, body = hook.next()
        assert body == {
            "kind": "check_failed",
            "asset": "watched",
            "check": "watched_is_two",
            "severity": "ERROR",
            "partition": None,
            "run_id": run.run_id,
            "description": "watched is 1, not 2",
        }
        assert isinstance(second, dg.SensorResult)
        # A check reported without a run (as serving_store_reporter reports live_store_fresh).
        instance.report_runless_asset_event(
            dg.AssetCheckEvaluation(
                asset_key=dg.AssetKey("watched"),
                check_name="watched_is_one",
                passed=False,
                severity=dg.AssetCheckSeverity.WARN,
                description="stale",
            )
        )
        fourth = tick(sensor, instance, second.cursor)
        _, body = hook.next()
        assert (body["check"], body["severity"], body["run_id"]) == ("watched_is_one", "WARN", None)
        assert isinstance(fourth, dg.SensorResult)
        second = fourth
        third = tick(sensor, instance, second.cursor)
        assert isinstance(third, dg.SensorResult) and third.skip_reason is not None
        assert hook.none_left()


@pytest.mark.parametrize("status", [500, 302])
def test_a_receiver_that_fails_or_redirects_fails_the_tick_and_keeps_the_cursor(tmp_path, status):
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance, receiver() as hook:
        sensor = sensors(hook.url)[CHECK_FAILURE_SENSOR_NAME]
        first = tick(sensor, instance, None)
        assert isinstance(first, dg.SensorResult)
        dg.materialize([watched, watched_is_two], instance=instance)
        hook.status = status
        with pytest.raises(WebhookFailed, match=f"answered {status}"):
            tick(sensor, instance, first.cursor)
        hook.next()  # the failed attempt reached it; a redirect was not followed
        assert hook.none_left()
        hook.status = 204
        again = tick(sensor, instance, first.cursor)
        assert isinstance(again, dg.SensorResult) and again.skip_reason is None
        assert hook.next()[1]["check"] == "watched_is_two"


def test_a_receiver_that_is_down_is_a_clear_error_within_the_timeout():
    with receiver() as hook:
        url = hook.url
    with pytest.raises(WebhookFailed, match="cannot be reached"):
        Webhook(url, timeout_seconds=5).post({"kind": "test"})


def test_the_sensors_exist_only_when_a_webhook_is_configured(tmp_path):
    def names(env: dict[str, str]) -> set[str]:
        defs = build_definitions({"SIS_DATA_DIR": str(tmp_path), **env})
        return {s.name for s in defs.sensors or []}

    assert not names({}) & {RUN_FAILURE_SENSOR_NAME, CHECK_FAILURE_SENSOR_NAME}
    configured = names({"SIS_NOTIFY_WEBHOOK_URL": "https://alerts.example.com/hook"})
    assert {RUN_FAILURE_SENSOR_NAME, CHECK_FAILURE_SENSOR_NAME} <= configured


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("http://alerts.example.com/hook", "plain http"),
        ("https://user:pw@alerts.example.com/hook", "credentials"),
        ("ftp://alerts.example.com/hook", "expected https"),
        ("https:///hook", "expected https"),
    ],
)
def test_a_webhook_url_that_would_leak_is_refused(tmp_path, url, refused):
    with pytest.raises(ConfigurationError, match=refused):
        load_settings({"SIS_DATA_DIR": str(tmp_path), "SIS_NOTIFY_WEBHOOK_URL": url})


def test_plain_http_is_accepted_to_loopback(tmp_path):
    settings = load_settings(
        {"SIS_DATA_DIR": str(tmp_path), "SIS_NOTIFY_WEBHOOK_URL": "http://127.0.0.1:8080/hook"}
    )
    assert settings.notify.webhook_url == "http://127.0.0.1:8080/hook"
