from __future__ import annotations

import errno
import os
import pickle
import threading
from datetime import UTC, datetime, timedelta, timezone

import pytest
from lxml import etree

from sis_platform.domain.limits import Limits
from sis_platform.domain.messages import (
    DEFAULT_MAX_BYTES,
    ExternalAccessRefused,
    InvalidMessage,
    ParsedMessage,
    parse_message,
    parse_xml,
)
from sis_platform.domain.pipeline import DeadLetter, LoggedMessage, classify_message
from sis_platform.domain.reasons import Reason
from tests.domain.sportsdata_fixtures import (
    ASCOT_1430,
    ASCOT_1500,
    GO_SOFT,
    event,
    master,
    update,
)


def rejected(body: bytes, **kwargs) -> InvalidMessage:
    with pytest.raises(InvalidMessage) as caught:
        parse_message(body, **kwargs)
    return caught.value


def test_master_message_parses_to_its_envelope():
    parsed = parse_message(master(event(ASCOT_1430), event(ASCOT_1500), type="refresh"))
    assert isinstance(parsed, ParsedMessage)
    assert parsed.category == "master"
    assert parsed.type == "refresh"
    assert parsed.ids == (ASCOT_1430, ASCOT_1500)
    assert parsed.sent == datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
    assert parsed.root.tag == "sportsdata"


def test_update_message_parses_without_type():
    parsed = parse_message(update(f"{ASCOT_1430} {ASCOT_1500}", GO_SOFT))
    assert parsed.category == "update"
    assert parsed.type is None
    assert parsed.ids == (ASCOT_1430, ASCOT_1500)
    assert parsed.sent is None


def test_master_events_may_come_in_any_order():
    body = master(event(ASCOT_1500), event(ASCOT_1430), ids=f"{ASCOT_1430} {ASCOT_1500}")
    parsed = parse_message(body)
    assert parsed.ids == (ASCOT_1430, ASCOT_1500)


def test_id_list_is_split_on_any_xml_whitespace():
    parsed = parse_message(update("  A&#9;B&#10;C:1_x.y-z ", GO_SOFT))
    assert parsed.ids == ("A", "B", "C:1_x.y-z")


def test_a_64_character_id_is_valid_and_65_is_not():
    assert parse_message(update("x" * 64, GO_SOFT)).ids == ("x" * 64,)
    assert rejected(update("x" * 65, GO_SOFT)).reason is Reason.INVALID_ENVELOPE


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        ("2026-11-21T12:00:00Z", datetime(2026, 11, 21, 12, tzinfo=UTC)),
        (
            "2026-11-21T12:00:00.5+01:00",
            datetime(2026, 11, 21, 12, 0, 0, 500000, timezone(timedelta(hours=1))),
        ),
        (
            "2026-11-21T12:00:00.1234567-05:30",
            datetime(2026, 11, 21, 12, 0, 0, 123456, timezone(-timedelta(hours=5, minutes=30))),
        ),
        ("2026-11-21T12:00:00", datetime(2026, 11, 21, 12)),
    ],
)
def test_sent_is_an_xs_datetime(sent, expected):
    assert parse_message(master(event(), sent=sent)).sent == expected


# --- too-large ---------------------------------------------------------------------------------


def test_default_limit_is_4_mb():
    assert DEFAULT_MAX_BYTES == 4 * 1024 * 1024


def test_body_at_the_limit_is_accepted_and_one_byte_over_is_too_large():
    body = master(event())
    assert parse_message(body, limits=Limits(max_message_bytes=len(body))).ids == (ASCOT_1430,)
    error = rejected(body, limits=Limits(max_message_bytes=len(body) - 1))
    assert error.reason is Reason.TOO_LARGE
    assert str(len(body)) in error.detail


def test_size_is_checked_before_parsing():
    error = rejected(b"<not xml" * 10, limits=Limits(max_message_bytes=10))
    assert error.reason is Reason.TOO_LARGE


def test_body_over_the_default_limit_is_too_large():
    padding = b"<!--" + b"x" * DEFAULT_MAX_BYTES + b"-->"
    assert rejected(master(event()) + padding).reason is Reason.TOO_LARGE


# --- not-well-formed ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not xml at all",
        b"<sportsdata category='update' id='A'><replace sel='/x'>y</replace>",
        b"<sportsdata category='update' id='A'></sportsdata><extra/>",
        master(event()).replace(b"Ascot", b"Ascot \xff\xfe"),
        b"<?xml version='1.0' encoding='ISO-8859-1'?>"
        + master(event()).replace(b"Ascot", b"Caf\xe9"),
        master(event()).replace(b"Ascot", b"&undefined;"),
        "\ufeff".encode("utf-16-le") + master(event()).decode().encode("utf-16-le"),
    ],
    ids=[
        "empty",
        "text",
        "unclosed",
        "two-roots",
        "bad-utf8",
        "latin1-declared",
        "undefined-entity",
        "utf16",
    ],
)
def test_malformed_body_is_not_well_formed(body):
    assert rejected(body).reason is Reason.NOT_WELL_FORMED


def test_doctype_is_rejected_even_without_declarations():
    body = b"<!DOCTYPE sportsdata>" + master(event())
    error = rejected(body)
    assert error.reason is Reason.NOT_WELL_FORMED
    assert "DOCTYPE" in error.detail


def test_internal_entity_declaration_is_rejected_and_never_expanded():
    body = b'<!DOCTYPE sportsdata [<!ENTITY course "Ascot">]>' + master(event()).replace(
        b'course="Ascot"', b'course="&course;"'
    )
    assert rejected(body).reason is Reason.NOT_WELL_FORMED


def test_billion_laughs_is_rejected():
    entities = '<!ENTITY lol0 "lol">' + "".join(
        f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">' for i in range(1, 10)
    )
    body = f"<!DOCTYPE sportsdata [{entities}]>".encode() + update(
        "A", "<replace sel='/event/@going'>&lol9;</replace>"
    )
    assert rejected(body).reason is Reason.NOT_WELL_FORMED


def test_external_entity_is_rejected_without_reading_the_file(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    body = f'<!DOCTYPE sportsdata [<!ENTITY x SYSTEM "file://{secret}">]>'.encode() + update(
        "A", "<replace sel='/event/@going'>&x;</replace>"
    )
    error = rejected(body)
    assert error.reason is Reason.NOT_WELL_FORMED
    assert "TOP-SECRET" not in error.detail


# --- entity declarations never reach the file system -------------------------------------------


def parameter_entity(system: str) -> bytes:
    return f'<!DOCTYPE x [<!ENTITY % p SYSTEM "{system}"> %p;]>'.encode() + update("A", GO_SOFT)


def reader_has_it_open(fifo) -> bool:
    # Opening a FIFO for writing without blocking fails with ENXIO while no reader has it open.
    try:
        descriptor = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as error:
        if error.errno == errno.ENXIO:
            return False
        raise
    os.close(descriptor)  # also lets a reader blocked in open() go on, to end of file
    return True


def classify_in_a_thread(body: bytes) -> tuple[threading.Thread, list[object]]:
    """Classify `body` in a daemon thread, so that a parser stuck on a FIFO or a device fails
    the test instead of hanging the run; the thread is given 30 s to end."""
    outcome: list[object] = []
    worker = threading.Thread(
        target=lambda: outcome.append(classify_message(LoggedMessage("ID:1", body))), daemon=True
    )
    worker.start()
    worker.join(timeout=30)
    return worker, outcome


def assert_dead_lettered_not_well_formed(worker: threading.Thread, outcome: list[object]):
    assert not worker.is_alive(), "the parser is still reading"
    (dead_letter,) = outcome
    assert isinstance(dead_letter, DeadLetter)
    assert dead_letter.reason is Reason.NOT_WELL_FORMED


@pytest.mark.parametrize("scheme", ["", "file://"], ids=["path", "file-url"])
def test_parameter_entity_naming_a_fifo_is_dead_lettered_and_the_fifo_never_opened(
    tmp_path, scheme
):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    worker, outcome = classify_in_a_thread(parameter_entity(f"{scheme}{fifo}"))
    assert not reader_has_it_open(fifo)
    assert_dead_lettered_not_well_formed(worker, outcome)


def test_parameter_entity_naming_dev_zero_is_dead_lettered_at_once():
    worker, outcome = classify_in_a_thread(parameter_entity("/dev/zero"))
    assert_dead_lettered_not_well_formed(worker, outcome)


def test_parameter_entity_naming_a_plain_file_is_dead_lettered_without_reading_it(tmp_path):
    declarations = tmp_path / "going.ent"
    declarations.write_text('<!ENTITY going "SECRET-GOING">')
    worker, outcome = classify_in_a_thread(parameter_entity(str(declarations)))
    assert_dead_lettered_not_well_formed(worker, outcome)
    assert b"SECRET-GOING" not in outcome[0].detail.encode()


@pytest.mark.parametrize(
    "prefix",
    [b"<!DOCTYPE sportsdata>", b"<!doctype sportsdata>", b'<!ENTITY x "y">'],
    ids=["doctype", "lower-case", "entity"],
)
def test_a_declaration_is_rejected_before_parsing(prefix):
    # The scan finds it even where the parser would report something else first.
    error = rejected(prefix + master(event()))
    assert error.reason is Reason.NOT_WELL_FORMED
    assert "not allowed" in error.detail


def test_a_doctype_after_a_utf8_bom_is_rejected(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    error = rejected(b"\xef\xbb\xbf" + parameter_entity(str(fifo)))
    assert error.reason is Reason.NOT_WELL_FORMED
    assert "DOCTYPE" in error.detail
    assert not reader_has_it_open(fifo)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32"])
def test_a_doctype_in_utf16_or_utf32_is_not_well_formed_and_never_read(tmp_path, encoding):
    # The parser reads every body as UTF-8: such a body fails at its first byte, before any
    # declaration (which the byte scan, looking for ASCII, would not see).
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    body = parameter_entity(str(fifo)).decode().encode(encoding)
    worker, outcome = classify_in_a_thread(body)
    assert not reader_has_it_open(fifo)
    assert_dead_lettered_not_well_formed(worker, outcome)


def test_the_parsers_resolver_refuses_external_access_behind_the_scan(tmp_path):
    # parse_xml (for the package's own payloads) has no scan: the resolver alone stops it.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ExternalAccessRefused):
        parse_xml(parameter_entity(f"file://{fifo}"))
    assert not reader_has_it_open(fifo)


@pytest.mark.parametrize("entity", ["&going;", "&nbsp;", "&#xZZ;"])
def test_a_reference_to_an_undeclared_entity_is_not_well_formed(entity):
    body = update("A", f'<replace sel="/event/@going">{entity}</replace>')
    assert rejected(body).reason is Reason.NOT_WELL_FORMED


def test_the_five_predefined_entities_and_character_references_are_text():
    body = update("A", '<replace sel="/event/@going">&lt;&gt;&amp;&apos;&quot;&#233;</replace>')
    parsed = parse_message(body)
    assert parsed.root[0].text == "<>&'\"\u00e9"
    assert isinstance(parsed.root, etree._Element)


# --- envelope ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (master(event()).replace(b'category="master" ', b""), "@category is missing"),
        (master(event()).replace(b'category="master"', b'category="news"'), "news"),
        (master(event()).replace(b'type="new" ', b""), "needs @type"),
        (master(event(), type="update"), "'update'"),
        (update("A", GO_SOFT, extra=' type="new"'), "must not have @type"),
        (update("A", GO_SOFT).replace(b' id="A"', b""), "@id is missing"),
        (update(" ", GO_SOFT), "no master id"),
        (update("A B+C", GO_SOFT), "'B+C'"),
        (update("A caf\u00e9", GO_SOFT), "caf"),
        (update("A\u00a0B", GO_SOFT), "does not match"),
        (update("A B A", GO_SOFT), "listed twice"),
        (master(event(), sent="yesterday"), "yesterday"),
        (master(event(), sent="2026-11-21"), "xs:dateTime"),
        (master(event(), sent="2026-13-40T12:00:00Z"), "not a valid date"),
        (master(event(), extra=' priority="high"'), "priority"),
        (master(event(), extra=' xmlns:x="urn:x" x:id="1"'), "unknown root attribute"),
    ],
    ids=[
        "no-category",
        "bad-category",
        "master-without-type",
        "master-bad-type",
        "update-with-type",
        "no-id",
        "blank-id",
        "bad-id-character",
        "non-ascii-id",
        "no-break-space-is-not-a-separator",
        "duplicate-id",
        "sent-not-a-date",
        "sent-date-only",
        "sent-impossible-date",
        "unknown-attribute",
        "namespaced-attribute",
    ],
)
def test_bad_envelope_is_invalid_envelope(body, detail):
    error = rejected(body)
    assert error.reason is Reason.INVALID_ENVELOPE
    assert detail in error.detail


# --- schema-invalid ----------------------------------------------------------------------------


def test_root_other_than_sportsdata_is_schema_invalid():
    assert rejected(event().encode()).reason is Reason.SCHEMA_INVALID
    namespaced = master(event()).replace(b"<sportsdata ", b'<sportsdata xmlns="urn:x" ')
    assert rejected(namespaced).reason is Reason.SCHEMA_INVALID


def test_event_with_unknown_attribute_is_schema_invalid():
    error = rejected(master(event(extra=' colour="red"')))
    assert error.reason is Reason.SCHEMA_INVALID
    assert "colour" in error.detail


def test_update_with_unknown_operation_is_schema_invalid():
    assert rejected(update("A", "<delete sel='/event'/>")).reason is Reason.SCHEMA_INVALID


def test_a_master_with_a_price_beyond_a_signed_64_bit_long_is_schema_invalid():
    body = master(event()).replace(b'num="5"', b'num="9223372036854775808"')
    assert rejected(body).reason is Reason.SCHEMA_INVALID


# --- ids-mismatch ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (master(event(ASCOT_1430), ids=ASCOT_1500), "not listed"),
        (master(event(ASCOT_1430), ids=f"{ASCOT_1430} {ASCOT_1500}"), ASCOT_1500),
        (master(event(ASCOT_1430), event(ASCOT_1430), ids=f"{ASCOT_1430} {ASCOT_1500}"), "twice"),
        (master(event(ASCOT_1430), event(ASCOT_1500), ids=ASCOT_1430), "not listed"),
    ],
    ids=["event-not-listed", "listed-id-without-event", "event-twice", "extra-event"],
)
def test_events_not_matching_the_id_list_are_ids_mismatch(body, detail):
    error = rejected(body)
    assert error.reason is Reason.IDS_MISMATCH
    assert detail in error.detail


def test_invalid_message_pickles_with_reason_and_detail():
    error = pickle.loads(pickle.dumps(InvalidMessage(Reason.TOO_LARGE, "5 bytes")))
    assert (error.reason, error.detail) == (Reason.TOO_LARGE, "5 bytes")
