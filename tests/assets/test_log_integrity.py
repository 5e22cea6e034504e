"""The message log's integrity (docs/design.md invariant 5) on real Spark and Delta: every kind of
tampering with the Delta table or a landing file, truncation of the last batch, a consistent
rewrite without the log key, the last batches deleted with their anchors, the whole folder
restored from an earlier copy, and a missing or wrong key, is caught by the blocking
`hash_chain_intact` check (run again later, as from the UI) and by `sis-verify-log`; an intact
log passes both.

One log of three batches is built once for the module; each test tampers with it, checks, and
puts it back (Delta RESTORE, the landing files copied back)."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sis_platform.assets.message_log import CHAIN_CHECK, hash_chain_intact, raw_messages
from sis_platform.cli import verify_log
from sis_platform.lake.tables import RAW_MESSAGES
from sis_platform.log.chain import ChainRecord, chain_link
from sis_platform.log.landing.rows import anchor_metadata, chain_records
from tests.domain.sportsdata_fixtures import (
    ASCOT_1430,
    GO_SOFT,
    PRICE_7_TO_9,
    event,
    master,
    update,
)
from tests.harness import Harness, received

pytestmark = [pytest.mark.spark, pytest.mark.dagster, pytest.mark.cost(140)]

CHECK_KEY = dg.AssetCheckKey(dg.AssetKey("raw_messages"), CHAIN_CHECK)
BATCHES = ("0000000001", "0000000002", "0000000003")


@dataclass
class Log:
    h: Harness
    lake: Any
    version: int  # raw_messages' Delta version of the intact log
    saved: Path  # copy of the intact landing zone
    earlier_version: int  # raw_messages' Delta version after the first two batches
    earlier: Path  # copy of the landing zone after the first two batches

    @property
    def zone(self) -> Any:
        return self.h.zone

    def restore(self) -> None:
        self.lake.restore(RAW_MESSAGES, self.version)
        for name in ("batches", "anchors"):
            shutil.rmtree(self.zone.catalog.root / name)
            shutil.copytree(self.saved / name, self.zone.catalog.root / name)

    def check(self, key: str) -> dg.AssetCheckEvaluation:
        """Run the check alone for `key`, as the UI runs it: a run of the check with the
        partition's tag (`execute_in_process(partition_key=...)` wants an asset selected)."""
        defs = dg.Definitions(
            assets=[raw_messages],
            asset_checks=[hash_chain_intact],
            jobs=[
                dg.define_asset_job(
                    "check_log", selection=dg.AssetSelection.checks(hash_chain_intact)
                )
            ],
            resources=self.h.resources,
        )
        result = defs.resolve_job_def("check_log").execute_in_process(
            tags={"dagster/partition": key}, instance=self.h.instance, raise_on_error=False
        )
        (evaluation,) = result.get_asset_check_evaluations()
        return evaluation

    def row(self, key: str, msg_seq: int) -> Any:
        return (
            self.lake.read(RAW_MESSAGES)
            .where(f"batch_key = '{key}' AND msg_seq = {msg_seq}")
            .first()
        )


@pytest.fixture(scope="module")
def log(spark, tmp_path_factory) -> Iterator[Log]:
    h = Harness(tmp_path_factory.mktemp("integrity") / "data")
    batches = [
        [
            received(master(event(ASCOT_1430))),
            received(update(ASCOT_1430, GO_SOFT)),
            received(update(ASCOT_1430, PRICE_7_TO_9)),
        ],
        [
            received(update(ASCOT_1430, GO_SOFT)),
            received(b"<not-xml", delivery_count=2),
            received(update(ASCOT_1430, PRICE_7_TO_9)),
        ],
        [received(update(ASCOT_1430, GO_SOFT)), received(update(ASCOT_1430, PRICE_7_TO_9))],
    ]
    lake = h.lake(spark)
    earlier = h.data_dir.parent / "earlier-landing"
    keys = []
    for i, batch in enumerate(batches):
        keys.append(h.zone.writer.land(batch).key)
        h.instance.add_dynamic_partitions("batches", keys[-1:])
        result = h.materialize(keys[-1], "raw_messages")
        (evaluation,) = result.get_asset_check_evaluations()
        assert evaluation.passed, evaluation.metadata["problems"]
        if i == 1:  # a copy of the whole folder, as a backup would take it
            earlier_version = lake.version(RAW_MESSAGES)
            for name in ("batches", "anchors"):
                shutil.copytree(h.zone.catalog.root / name, earlier / name)
    assert tuple(keys) == BATCHES
    saved = h.data_dir.parent / "intact-landing"
    for name in ("batches", "anchors"):
        shutil.copytree(h.zone.catalog.root / name, saved / name)
    yield Log(h, lake, lake.version(RAW_MESSAGES), saved, earlier_version, earlier)


@pytest.fixture
def cli(log, monkeypatch, capsys) -> Callable[..., tuple[int, str]]:
    """Run `sis-verify-log` with the log's configuration: (exit status, its summary line on
    stdout). Each problem goes to stderr."""
    for name, value in log.h.env.items():
        monkeypatch.setenv(name, value)

    def run(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        code = verify_log.main(list(args))
        out = capsys.readouterr()
        return code, out.out.strip()

    return run


def test_an_intact_log_passes_the_check_and_sis_verify_log(log, cli):
    for key in BATCHES:
        evaluation = log.check(key)
        assert evaluation.passed, evaluation.metadata["problems"]
        assert evaluation.metadata["messages_checked"].value == log.zone.catalog.read(key).num_rows
    code, out = cli()
    assert code == 0, out
    assert "intact: 3 batch(es), 8 message(s)" in out


def _alter_body(log: Log) -> str:
    log.lake.update(
        RAW_MESSAGES,
        "batch_key = '0000000002' AND msg_seq = 1",
        {"body": "CAST('<not-xml/>' AS BINARY)"},
    )
    return log.row("0000000002", 1)["message_id"]


def _alter_delivery_count(log: Log) -> str:
    log.lake.update(
        RAW_MESSAGES, "batch_key = '0000000002' AND msg_seq = 1", {"delivery_count": "1"}
    )
    return log.row("0000000002", 1)["message_id"]


def _delete_row(log: Log) -> str:
    following = log.row("0000000002", 2)["message_id"]
    log.lake.delete(RAW_MESSAGES, "batch_key = '0000000002' AND msg_seq = 1")
    return following


def _insert_row(log: Log) -> str:
    # Appended after the last message with a link that follows it correctly: only the anchor
    # (message count and head) can tell.
    last = log.row("0000000002", 2)
    record = ChainRecord(
        batch_seq=2,
        msg_seq=3,
        message_id="ID:" + "ee" * 24,
        put_time_us=None,
        received_at_us=1_764_000_000_000_000,
        delivery_count=1,
        properties_json=None,
        body_size=0,
        body_sha256=hashlib.sha256(b"").hexdigest(),
        body_location=None,
    )
    link = chain_link(bytes.fromhex(last["chain_link"]), record).hex()
    row = {
        **last.asDict(),
        "msg_seq": 3,
        "message_id": record.message_id,
        "put_time": None,
        "delivery_count": 1,
        "properties_json": None,
        "body": b"",
        "body_size": 0,
        "body_sha256": record.body_sha256,
        "body_location": None,
        "prev_link": last["chain_link"],
        "chain_link": link,
    }
    row["received_at"] = datetime.fromtimestamp(record.received_at_us / 1e6, UTC)
    log.lake.append(RAW_MESSAGES, log.lake.spark.createDataFrame([row], RAW_MESSAGES.schema()))
    return record.message_id


def _swap_rows(log: Log) -> str:
    log.lake.update(
        RAW_MESSAGES, "batch_key = '0000000002' AND msg_seq IN (0, 1)", {"msg_seq": "1 - msg_seq"}
    )
    return log.row("0000000002", 0)["message_id"]


@pytest.mark.parametrize(
    "tamper",
    [_alter_body, _alter_delivery_count, _delete_row, _insert_row, _swap_rows],
    ids=["body", "delivery-count", "delete", "insert", "swap"],
)
def test_tampering_with_the_delta_table_is_detected(log, cli, tamper):
    try:
        message_id = tamper(log)
        evaluation = log.check("0000000002")
        assert not evaluation.passed
        assert evaluation.severity == dg.AssetCheckSeverity.ERROR
        problems = evaluation.metadata["problems"].value
        assert "raw_messages" in problems and "landing file" not in problems
        assert evaluation.metadata["first_problem_message_id"].value == message_id
        assert log.check("0000000001").passed and log.check("0000000003").passed

        code, out = cli()
        assert code == 1, out
        assert "first broken batch 0000000002 message" in out
        assert message_id in out
    finally:
        log.restore()
    assert log.check("0000000002").passed


def test_a_landing_file_rewritten_with_one_field_changed_is_detected(log, cli):
    path = log.zone.catalog.batch_path("0000000001")
    table = pq.read_table(path)
    counts = table.column("delivery_count").to_pylist()
    counts[2] = 3
    index = table.schema.get_field_index("delivery_count")
    rewritten = table.set_column(index, table.schema.field(index), pa.array(counts, pa.int32()))
    message_id = table.column("message_id")[2].as_py()
    try:
        pq.write_table(rewritten, path)  # its metadata (anchor copy included) kept as it was
        evaluation = log.check("0000000001")
        assert not evaluation.passed
        assert "landing file" in evaluation.metadata["problems"].value
        assert evaluation.metadata["first_problem_message_id"].value == message_id
        code, out = cli("--to", "1")
        assert code == 1, out
        assert f"first broken batch 0000000001 message 2 ({message_id})" in out
    finally:
        log.restore()


def test_truncating_the_last_batch_is_detected(log, cli):
    try:
        log.zone.catalog.batch_path("0000000003").unlink()
        log.lake.delete(RAW_MESSAGES, "batch_key = '0000000003'")
        evaluation = log.check("0000000003")
        assert not evaluation.passed
        problems = evaluation.metadata["problems"].value
        assert "landing file is missing" in problems
        assert "0 message(s) where the anchor says 2" in problems
        code, out = cli()
        assert code == 1, out
        assert "first broken batch 0000000003" in out
        assert cli("--to", "0000000002")[0] == 0  # the batches before it are intact
    finally:
        log.restore()


def _rewrite_consistently(log: Log, first: str) -> None:
    """What an intruder who can write the data folder but lacks the log key can do: change a
    message of batch `first`, recompute every SHA-256 link from there to the end of the log,
    rewrite the landing files with matching chain metadata and their anchors (the old
    signatures copied over), and rewrite raw_messages from them."""
    zone = log.zone
    link = bytes.fromhex(zone.catalog.anchors.read(first).first_prev)
    for key in [k for k in BATCHES if k >= first]:
        path = zone.catalog.batch_path(key)
        table = pq.read_table(path)
        if key == first:
            counts = table.column("delivery_count").to_pylist()
            counts[1] = 7
            index = table.schema.get_field_index("delivery_count")
            table = table.set_column(index, table.schema.field(index), pa.array(counts, pa.int32()))
        first_prev, prev_links, links = link, [], []
        for batch in table.to_batches():
            for record in chain_records(batch):
                prev_links.append(link.hex())
                link = chain_link(link, record)
                links.append(link.hex())
        for name, values in (("prev_link", prev_links), ("chain_link", links)):
            index = table.schema.get_field_index(name)
            table = table.set_column(index, table.schema.field(index), pa.array(values))
        old = zone.catalog.anchors.read(key)
        forged = dataclasses.replace(old, first_prev=first_prev.hex(), head=link.hex())
        metadata = {**(table.schema.metadata or {}), **anchor_metadata(forged)}
        pq.write_table(table.replace_schema_metadata(metadata), path)
        zone.catalog.anchors.path(key).unlink()
        zone.catalog.anchors.write(forged)
        log.h.defs.resolve_job_def("process_batch").execute_in_process(
            partition_key=key,
            instance=log.h.instance,
            raise_on_error=False,
            asset_selection=[dg.AssetKey("raw_messages")],
        )


def test_a_consistent_rewrite_of_a_batch_and_all_after_it_without_the_key_is_detected(log, cli):
    try:
        _rewrite_consistently(log, "0000000002")
        for key in ("0000000002", "0000000003"):
            evaluation = log.check(key)
            assert not evaluation.passed
            problems = evaluation.metadata["problems"].value
            assert f"batch {key}: its anchor's signature does not verify (a consistent " in problems
        code, out = cli()
        assert code == 1, out
        assert "first broken batch 0000000002" in out
        assert "consistent rewrite without the log key" in out
    finally:
        log.restore()
    assert log.check("0000000002").passed


def test_deleting_the_last_batches_with_their_anchors_is_detected(log, cli):
    try:
        log.zone.catalog.batch_path("0000000003").unlink()
        log.zone.catalog.anchors.path("0000000003").unlink()
        log.lake.delete(RAW_MESSAGES, "batch_key = '0000000003'")
        evaluation = log.check("0000000002")  # the last batch left fails: the log was cut
        assert not evaluation.passed
        problems = evaluation.metadata["problems"].value
        assert "batch 0000000003: truncated or rolled back: the witness" in problems
        code, out = cli()
        assert code == 1, out
        assert "first broken batch 0000000003" in out and "truncated or rolled back" in out
    finally:
        log.restore()


def test_restoring_the_whole_folder_from_an_earlier_copy_is_detected(log, cli):
    try:
        log.lake.restore(RAW_MESSAGES, log.earlier_version)
        for name in ("batches", "anchors"):
            shutil.rmtree(log.zone.catalog.root / name)
            shutil.copytree(log.earlier / name, log.zone.catalog.root / name)
        assert log.zone.catalog.keys() == list(BATCHES[:2])  # every file and anchor genuine, older
        evaluation = log.check("0000000001")
        assert not evaluation.passed
        assert "truncated or rolled back" in evaluation.metadata["problems"].value
        code, out = cli()
        assert code == 1, out
        assert "batch 0000000003" in out and "truncated or rolled back" in out
    finally:
        log.restore()


def test_a_missing_or_wrong_log_key_is_an_error_not_a_pass(log, cli, monkeypatch, tmp_path):
    key_file = tmp_path / "other.key"
    monkeypatch.setenv("SIS_LOG_KEY_FILE", str(key_file))
    code, out = cli()
    assert code == 1, out
    assert "the log key cannot be loaded" in out and "does not exist" in out
    key_file.write_text("another key, long enough to be one: 0123456789")
    key_file.chmod(0o600)
    code, out = cli()
    assert code == 1, out
    assert "not with the log key" in out


def test_sis_verify_log_compares_the_batch_runs_tags(log, cli, monkeypatch):
    from sis_platform.assets.run_tags import BATCH_TAG, CHAIN_HEAD_TAG, MESSAGES_TAG
    from sis_platform.cli.batch_runs import BatchRuns

    anchor = log.zone.catalog.anchors.read("0000000002")
    log.h.instance.create_run_for_job(
        log.h.defs.resolve_job_def("process_batch"),
        tags={BATCH_TAG: anchor.batch_key, CHAIN_HEAD_TAG: "ab" * 32, MESSAGES_TAG: "3"},
    )
    monkeypatch.setattr(verify_log, "dagster_runs", lambda: BatchRuns(log.h.instance))
    code, out = cli()
    assert code == 1, out
    assert "first broken batch 0000000002: the run was requested for 3 message(s)" in out


def test_sis_verify_log_refuses_bad_arguments(cli):
    assert cli("--from", "x")[0] == 2
    assert cli("--from", "3", "--to", "2")[0] == 2


def test_a_run_over_a_tampered_landing_file_stops_before_message_items(tmp_path, spark):
    h = Harness(tmp_path / "data")
    key = h.zone.writer.land(
        [received(master(event(ASCOT_1430))), received(update(ASCOT_1430, GO_SOFT))]
    ).key
    h.instance.add_dynamic_partitions("batches", [key])
    path = h.zone.catalog.batch_path(key)
    table = pq.read_table(path)
    index = table.schema.get_field_index("body")
    bodies = table.column("body").to_pylist()
    bodies[1] = update(ASCOT_1430, PRICE_7_TO_9)
    pq.write_table(table.set_column(index, table.schema.field(index), pa.array(bodies)), path)

    result = h.defs.resolve_job_def("process_batch").execute_in_process(
        partition_key=key, instance=h.instance, raise_on_error=False
    )
    assert not result.success
    (evaluation,) = result.get_asset_check_evaluations()
    assert not evaluation.passed
    materialized = {e.asset_key.path[-1] for e in result.get_asset_materialization_events()}
    assert materialized == {"raw_messages"}  # message_items never read the batch


def test_a_landing_file_rewritten_without_its_chain_metadata_is_detected(log, cli):
    """The same rows and links, the file's chain metadata (its copy of the anchor) left out:
    the check names the file instead of trusting its rows alone."""
    path = log.zone.catalog.batch_path("0000000002")
    table = pq.read_table(path)
    try:
        pq.write_table(table.replace_schema_metadata(None), path)
        evaluation = log.check("0000000002")
        assert not evaluation.passed
        assert "carries no chain metadata" in evaluation.metadata["problems"].value
        assert log.check("0000000001").passed and log.check("0000000003").passed
        code, out = cli()
        assert code == 1, out
        assert "first broken batch 0000000002" in out
    finally:
        log.restore()
