"""sis-live's traces (sis_platform/live/traces.py) as a collector receives them: an OTLP/HTTP
receiver on a loopback port (tests/otlp.py) decodes what the SDK's exporter posts. Each group
is one CONSUMER span with a child span per stage, carrying the messaging conventions'
attributes and the group's ids, bounded whatever an id's length; a collector that refuses or
never answers costs the live path nothing (every message still reaches the store); with no
endpoint set, nothing of OpenTelemetry is imported, and with one set and the SDK missing, the
command says which extra to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

from sis_platform.live.metrics import STAGES, LiveRecorder
from sis_platform.live.traces import (
    GROUP_SPAN,
    MAX_ID_CHARS,
    MAX_IDS,
    MAX_PENDING_GROUPS,
    Destination,
    LiveTraces,
    destination,
)
from sis_platform.serving import open_writer
from sis_platform.settings import (
    EmbeddedSourceSettings,
    IbmMqSourceSettings,
    StompSourceSettings,
)
from sis_platform.simulator.generator import generate_feed
from tests.live.processes import REPO, finish, live_env, start_live
from tests.live.running import BOUND_SECONDS, Place, drained, running
from tests.live.test_json_logs import _drain
from tests.live.test_service import STORE_OUTAGE, _Switch
from tests.otlp import ReceivedSpan, dead_collector, otlp_receiver

pytestmark = pytest.mark.cost(30)

WHERE = Destination("embedded", "sis.feed")


def _groups(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == GROUP_SPAN]


def _messages_in(spans: list[ReceivedSpan]) -> int:
    return sum(s.attributes["messaging.batch.message_count"] for s in _groups(spans))


def test_each_group_is_a_consumer_span_with_a_child_span_per_stage(tmp_path: Path) -> None:
    place = Place(tmp_path)
    feed = list(generate_feed(52, 150))
    place.put(feed)
    with otlp_receiver() as receiver:
        traces = LiveTraces(receiver.traces_url, WHERE)
        try:
            with running(place, tracing=traces.recorder) as service:
                assert service.wait_until(drained, BOUND_SECONDS)
        finally:
            traces.shutdown()  # the orderly stop's flush
        spans = receiver.spans()
    groups = _groups(spans)
    assert groups and _messages_in(spans) == len(feed)
    assert {g.service for g in groups} == {"sis-live"}
    children: dict[bytes, list[ReceivedSpan]] = {}
    for span in spans:
        if span.name != GROUP_SPAN:
            children.setdefault(span.parent_span_id, []).append(span)
    seen_ids: list[str] = []
    for group in groups:
        a = group.attributes
        assert group.kind == ProtoSpan.SPAN_KIND_CONSUMER and group.parent_span_id == b""
        assert a["messaging.system"] == "embedded"
        assert a["messaging.destination.name"] == "sis.feed"
        assert a["messaging.operation.type"] == "process"
        assert a["sis.visible"] is True
        count = a["messaging.batch.message_count"]
        assert a["sis.position.last"] - a["sis.position.first"] == count - 1
        assert a["sis.batch"] and a["sis.master_ids"]
        assert len(a["sis.message_ids"]) == min(count, MAX_IDS)
        seen_ids.extend(a["sis.message_ids"])
        stages = children[group.span_id]
        # One span per stage, named as the metrics name them, in the group's trace and time.
        assert sorted(s.name for s in stages) == sorted(STAGES)
        for stage in stages:
            assert stage.trace_id == group.trace_id
            assert group.start_ns <= stage.start_ns <= stage.end_ns <= group.end_ns
        by_name = {s.name: s for s in stages}
        assert by_name["get"].attributes["messaging.operation.type"] == "receive"
        assert by_name["get"].start_ns == group.start_ns
        assert by_name["get"].end_ns <= by_name["land"].start_ns
        assert by_name["land"].end_ns <= by_name["fold"].start_ns
        assert by_name["queue_commit"].attributes["messaging.operation.type"] == "settle"
        assert by_name["commit"].attributes["sis.master_ids"]
    # Every message is named by its group's span (groups here are at most MAX_IDS long).
    assert sorted(seen_ids) == sorted(m.message_id for m in feed)


def test_groups_landed_while_the_store_is_down_end_when_the_catch_up_commits_them(
    tmp_path: Path,
) -> None:
    place = Place(tmp_path)
    feed = list(generate_feed(56, 400))
    switch = _Switch(place.url)
    config = STORE_OUTAGE
    switch.down.set()
    place.put(feed)
    with otlp_receiver() as receiver:
        traces = LiveTraces(receiver.traces_url, WHERE)
        try:
            with running(place, config, switch.open, tracing=traces.recorder) as service:
                assert service.wait_until(
                    lambda s: s.landed_messages == len(feed) and s.source.depth() == 0,
                    BOUND_SECONDS,
                )
                switch.down.clear()
                assert service.wait_until(drained, BOUND_SECONDS)
        finally:
            traces.shutdown()
        spans = receiver.spans()
    groups = _groups(spans)
    assert _messages_in(spans) == len(feed) and len(groups) > MAX_PENDING_GROUPS
    # The oldest groups' spans were ended unseen once more than MAX_PENDING_GROUPS waited; the
    # rest ended when the catch-up made them visible, and its commit hangs off the newest.
    unseen = [g for g in groups if g.attributes["sis.visible"] is False]
    assert len(unseen) == len(groups) - MAX_PENDING_GROUPS
    seen = [g for g in groups if g.attributes["sis.visible"] is True]
    commits = [s for s in spans if s.name == "commit"]
    assert commits and {c.parent_span_id for c in commits} <= {g.span_id for g in seen}
    assert all(g.attributes["sis.master_ids"] for g in seen)


def test_a_one_megabyte_message_id_gives_a_bounded_attribute(tmp_path: Path) -> None:
    place = Place(tmp_path)
    huge = "m" * (1 << 20)
    body = next(iter(generate_feed(7, 1))).body
    with place.queue.producer() as producer:
        producer.put(body, message_id=huge)
    with otlp_receiver() as receiver:
        traces = LiveTraces(receiver.traces_url, WHERE)
        try:
            with running(place, tracing=traces.recorder) as service:
                assert service.wait_until(drained, BOUND_SECONDS)
        finally:
            traces.shutdown()
        spans = receiver.spans()
    (group,) = _groups(spans)
    assert group.attributes["messaging.message.id"] == huge[:MAX_ID_CHARS]
    assert group.attributes["sis.message_ids"] == (huge[:MAX_ID_CHARS],)
    longest = max(
        len(v) if isinstance(v, str) else max((len(x) for x in v if isinstance(x, str)), default=0)
        for s in spans
        for v in s.attributes.values()
        if isinstance(v, str | tuple)
    )
    assert longest <= MAX_ID_CHARS


@pytest.mark.parametrize("kind", ["refusing", "silent"])
def test_a_collector_that_is_down_never_holds_up_the_live_path(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A small queue, so that most spans are dropped rather than held; a short export timeout
    # bounds the flush at the stop.
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")
    place = Place(tmp_path)
    feed = list(generate_feed(53, 300))
    place.put(feed)
    with dead_collector(kind) as endpoint:
        traces = LiveTraces(endpoint + "/v1/traces", WHERE)
        try:
            with running(place, tracing=traces.recorder) as service:
                assert service.wait_until(
                    lambda s: drained(s) and s.landed_messages == len(feed), BOUND_SECONDS
                )
                landed = service.landed_to
        finally:
            traces.shutdown()
    # The SDK says so in a few lines, not one per span dropped (its loggers' duplicate filter:
    # one 'Queue full' per 20 s; one line per failed export, at most one per batch).
    told = [r for r in caplog.records if r.name.startswith("opentelemetry")]
    assert told and len(told) <= 10, [r.getMessage() for r in told]
    store = open_writer(place.url)
    try:
        assert set(store.latest_copies(m.message_id for m in feed)) == {m.message_id for m in feed}
        assert store.position() == landed
    finally:
        store.close()


def test_the_sis_live_command_flushes_its_spans_on_an_orderly_stop(tmp_path: Path) -> None:
    place = Place(tmp_path / "data")
    feed = list(generate_feed(54, 60))
    place.put(feed)
    log = tmp_path / "sis-live.log"
    with otlp_receiver() as receiver:
        live = start_live(
            place.root,
            log,
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            # Nothing is exported before the stop: the batch is not full, the delay not over.
            OTEL_BSP_SCHEDULE_DELAY="600000",
            OTEL_SERVICE_NAME="sis-live-test",
        )
        try:
            _drain(place, live, log)
            assert receiver.requests == 0
        finally:
            live.terminate()
            assert finish(live, BOUND_SECONDS, log) == 0
        spans = receiver.spans()
    groups = _groups(spans)
    assert _messages_in(spans) == len(feed)
    assert {g.service for g in groups} == {"sis-live-test"}
    assert {g.attributes["messaging.system"] for g in groups} == {"embedded"}
    assert all(g.attributes["sis.visible"] is True for g in groups)


_CHECK_OFF = """
import sys
from sis_platform.live.process import build_service, start_traces
from sis_platform.settings import load_settings
settings = load_settings()
assert settings.live.traces_endpoint is None
assert start_traces(settings) is None
service = build_service(settings)
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
assert not loaded, loaded
assert type(service.recorder) is type(service.metrics), service.recorder
print("off")
"""


def test_with_no_endpoint_nothing_of_opentelemetry_is_imported(tmp_path: Path) -> None:
    env = live_env(tmp_path / "data")
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", _CHECK_OFF],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "off"


def test_an_endpoint_without_the_sdk_installed_names_the_extra(tmp_path: Path) -> None:
    # The SDK made unimportable, as where the `otel` extra is not installed.
    script = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "from sis_platform.cli.live import main\n"
        "sys.exit(main([]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=live_env(tmp_path / "data", OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4318"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "install the `otel` extra" in done.stderr
    assert "sis-platform[otel]" in done.stderr


def test_each_source_is_named_as_the_messaging_conventions_name_it() -> None:
    assert destination(StompSourceSettings(destination="/queue/sis.feed")) == Destination(
        "activemq", "/queue/sis.feed"
    )
    ibmmq = IbmMqSourceSettings("QM1", "SIS.SVRCONN", "mq(1414)", "SIS.FEED", 1 << 20)
    assert destination(ibmmq) == Destination("ibm_mq", "SIS.FEED")
    assert destination(EmbeddedSourceSettings("/q", "sis.feed")) == WHERE


def test_the_recorder_passes_every_call_on(tmp_path: Path) -> None:
    # The metrics see the same calls with tracing on: the recorder wraps, it does not replace.
    calls: list[str] = []

    class Counting(LiveRecorder):
        def got(self, messages: int, seconds: float) -> None:
            calls.append("got")

        def queue_committed(self, seconds: float) -> None:
            calls.append("queue_committed")

        def source_connected(self) -> None:
            calls.append("source_connected")

    place = Place(tmp_path)
    place.put(list(generate_feed(55, 5)))
    with otlp_receiver() as receiver:
        traces = LiveTraces(receiver.traces_url, WHERE)
        try:
            with running(place, metrics=Counting(), tracing=traces.recorder) as service:
                assert service.wait_until(drained, BOUND_SECONDS)
        finally:
            traces.shutdown()
    assert {"got", "queue_committed", "source_connected"} <= set(calls)
