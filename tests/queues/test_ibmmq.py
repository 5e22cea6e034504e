"""The IBM MQ source against the fake queue manager in fake_pymqi (no queue manager runs here).

The fake proves the calls this module makes and what it does with the answers; it cannot
prove that a real queue manager answers that way (see fake_pymqi's docstring). The
conformance suite's "ibmmq" entry covers that when SIS_IBMMQ_* names a real one.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sis_platform.domain.pipeline import DeadLetter, LoggedMessage, classify_message
from sis_platform.domain.reasons import Reason
from sis_platform.queues.base import (
    DEFAULT_MAX_GET_BYTES,
    SourceUnavailable,
)
from sis_platform.queues.ibmmq import (
    IbmMqClientMissing,
    IbmMqError,
    IbmMqQueue,
    Rfh2Error,
    load_mqi,
    mqmd_put_time,
    parse_rfh2,
    rfh2_properties,
)
from sis_platform.queues.ibmmq import connection as connection_module
from sis_platform.queues.ibmmq import message as message_module
from sis_platform.queues.ibmmq.mqi import MQI_MODULES
from sis_platform.settings import DEFAULT_BACKOUT_THRESHOLD
from tests.queues import sources
from tests.queues.fake_pymqi import (
    CMQC,
    FakePymqi,
    FakeQueueManagerServer,
    build_rfh2,
    read_dead_letter_header,
)

QUEUE = "SPORTSDATA.IN"
BOQ = "SPORTSDATA.BACKOUT"
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
PASSWORD = "s3cr3t-Pa55w0rd"


@pytest.fixture
def server() -> FakeQueueManagerServer:
    server = FakeQueueManagerServer(
        name="QM1",
        channel="DEV.APP.SVRCONN",
        listeners=("mq1(1414)", "mq2(1414)"),
        dead_letter_queue=DLQ,
        users={"app": PASSWORD},
    )
    server.define_queue(QUEUE, backout_threshold=3, backout_queue=BOQ)
    server.define_queue(BOQ)
    return server


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


def make_source(
    server: FakeQueueManagerServer, sleeps: Sleeps | None = None, **overrides: object
) -> IbmMqQueue:
    settings: dict[str, object] = {
        "queue_manager": "QM1",
        "channel": "DEV.APP.SVRCONN",
        "conn_name": "mq1(1414),mq2(1414)",
        "queue": QUEUE,
        "user": "app",
        "password": PASSWORD,
        "sleep": sleeps if sleeps is not None else Sleeps(),
        "jitter": lambda: 0.5,
        "clock": lambda: 1000.0,  # frozen: waits are exactly what get() asked for
        "pymqi_module": FakePymqi(server),
    }
    settings.update(overrides)
    return IbmMqQueue(**settings)  # type: ignore[arg-type]


def ids(server: FakeQueueManagerServer, queue: str = QUEUE) -> list[str]:
    return [m.message_id for m in server.messages(queue)]


# -- syncpoint gets ---------------------------------------------------------------------


def test_get_hides_message_until_commit_removes_it(server: FakeQueueManagerServer) -> None:
    first = server.put_message(QUEUE, b"<a/>")
    second = server.put_message(QUEUE, b"<b/>")
    source = make_source(server)
    with source.connect() as one, source.connect() as two:
        got = one.get()
        assert got is not None and got.message_id == first.message_id
        assert ids(server) == [second.message_id]  # in the unit: invisible to others
        other = two.get()
        assert other is not None and other.message_id == second.message_id
        one.commit()
        two.commit()
    assert server.messages(QUEUE) == []
    assert server.in_flight() == 0


def test_backout_reinstates_messages_in_order_with_delivery_count_raised(
    server: FakeQueueManagerServer,
) -> None:
    put = [server.put_message(QUEUE, f"<m{i}/>".encode()) for i in range(3)]
    with make_source(server).connect() as session:
        first = [session.get(), session.get()]
        session.backout()
        assert ids(server) == [m.message_id for m in put]
        again = [session.get(), session.get(), session.get()]
    assert [m.message_id for m in first if m] == [m.message_id for m in put[:2]]
    assert [m.delivery_count for m in again if m] == [2, 2, 1]
    assert [m.redelivered for m in again if m] == [True, True, False]
    assert [m.message_id for m in again if m] == [m.message_id for m in put]


def test_get_uses_syncpoint_wait_fail_if_quiescing_without_convert_and_a_fresh_mqmd(
    server: FakeQueueManagerServer,
) -> None:
    server.put_message(QUEUE, b"<a/>")
    server.put_message(QUEUE, b"<b/>")
    with make_source(server).connect() as session:
        assert session.get(wait_seconds=1.5) is not None
        assert session.get(wait_seconds=0) is not None
        session.commit()
    first, second = server.gets
    for get in (first, second):
        assert get.options & CMQC.MQGMO_SYNCPOINT
        assert get.options & CMQC.MQGMO_WAIT
        assert get.options & CMQC.MQGMO_FAIL_IF_QUIESCING
        assert get.options & CMQC.MQGMO_PROPERTIES_FORCE_MQRFH2
        assert not get.options & CMQC.MQGMO_CONVERT
        assert get.md_msg_id in (b"", CMQC.MQMI_NONE)  # not the previous message's id
        assert get.md_correl_id in (b"", CMQC.MQCI_NONE)
        assert get.max_length == 64 * 1024  # a bounded buffer, never "any size"
    assert (first.wait_interval, second.wait_interval) == (1500, 0)


def test_empty_queue_reason_2033_is_none(server: FakeQueueManagerServer) -> None:
    with make_source(server).connect() as session:
        assert session.get(wait_seconds=2.0) is None
    assert server.gets[0].wait_interval == 2000


def test_wait_is_capped_by_max_wait_ms(server: FakeQueueManagerServer) -> None:
    with make_source(server, max_wait_ms=250).connect() as session:
        assert session.get(wait_seconds=30) is None
    assert server.gets[0].wait_interval == 250


def test_message_arriving_during_the_wait_is_returned(server: FakeQueueManagerServer) -> None:
    def arrives() -> None:
        server.put_message(QUEUE, b"<late/>")

    server.on_wait = arrives
    with make_source(server).connect() as session:
        message = session.get(wait_seconds=1)
        session.commit()
    assert message is not None and message.body == b"<late/>"


# -- the message ------------------------------------------------------------------------


def test_received_message_carries_msgid_put_time_and_backout_count(
    server: FakeQueueManagerServer,
) -> None:
    msg_id = bytes(range(24))
    server.put_message(
        QUEUE, b"<sportsdata/>", msg_id=msg_id, backout_count=2,
        put_date=b"20261121", put_time=b"14305967",
    )  # fmt: skip
    with make_source(server).connect() as session:
        message = session.get()
        session.backout()
    assert message is not None
    assert message.message_id == "ID:" + msg_id.hex()
    assert len(message.message_id) == 3 + 48
    assert message.put_time == datetime(2026, 11, 21, 14, 30, 59, 670_000, tzinfo=UTC)
    assert message.delivery_count == 3
    assert message.body == b"<sportsdata/>"
    assert dict(message.properties) == {}


def test_mqmd_put_time_is_utc_with_hundredths_and_none_when_unreadable() -> None:
    assert mqmd_put_time(b"20260101", b"00000001") == datetime(
        2026, 1, 1, 0, 0, 0, 10_000, tzinfo=UTC
    )
    assert mqmd_put_time(b"        ", b"        ") is None
    assert mqmd_put_time(b"20261340", b"12000000") is None


def test_rfh2_is_stripped_and_usr_properties_typed_by_dt(server: FakeQueueManagerServer) -> None:
    header = build_rfh2(
        [
            "<mcd><Msd>jms_bytes</Msd></mcd>",
            "<jms><Dst>queue:///SPORTSDATA.IN</Dst><Tms>1795272600000</Tms><Dlv>2</Dlv>"
            "<Pri>4</Pri><Cid>abc</Cid></jms>",
            '<usr><feed>sis</feed><seq dt="i8">42</seq><ratio dt="r8">0.5</ratio>'
            '<live dt="boolean">1</live><raw dt="bin.hex">CAFE</raw>'
            '<gone xsi:nil="true"></gone><a><b dt="i4">7</b></a></usr>',
        ],
        next_format=CMQC.MQFMT_NONE,
    )
    server.put_message(QUEUE, header + b"<sportsdata/>", format=CMQC.MQFMT_RF_HEADER_2)
    with make_source(server).connect() as session:
        message = session.get()
        session.commit()
    assert message is not None
    assert message.body == b"<sportsdata/>"
    assert dict(message.properties) == {
        "JMSDestination": "queue:///SPORTSDATA.IN",
        "JMSTimestamp": 1795272600000,
        "JMSDeliveryMode": 2,
        "JMSPriority": 4,
        "JMSCorrelationID": "abc",
        "feed": "sis",
        "seq": 42,
        "ratio": 0.5,
        "live": True,
        "raw": b"\xca\xfe",
        "gone": None,
        "a.b": 7,
    }


def test_rfh2_with_big_endian_integers_is_parsed(server: FakeQueueManagerServer) -> None:
    header = build_rfh2(['<usr><n dt="i4">5</n></usr>'], big_endian=True)
    server.put_message(
        QUEUE,
        header + b"<x/>",
        format=CMQC.MQFMT_RF_HEADER_2,
        encoding=CMQC.MQENC_INTEGER_NORMAL | 0x110,  # as z/OS writes it (MQENC_S390)
    )
    with make_source(server).connect() as session:
        message = session.get()
        session.commit()
    assert message is not None
    assert (message.body, dict(message.properties)) == (b"<x/>", {"n": 5})


def test_malformed_rfh2_is_delivered_unstripped_with_a_warning(
    server: FakeQueueManagerServer, caplog: pytest.LogCaptureFixture
) -> None:
    broken = build_rfh2(["<usr><n>1</n>"])  # not well-formed
    server.put_message(QUEUE, broken + b"<x/>", format=CMQC.MQFMT_RF_HEADER_2)
    with caplog.at_level(logging.WARNING), make_source(server).connect() as session:
        message = session.get()
        session.commit()
    assert message is not None
    assert message.body == broken + b"<x/>"  # the platform dead-letters these bytes
    assert dict(message.properties) == {}
    assert "MQRFH2 header not understood" in caplog.text


def test_rfh2_nested_3000_levels_deep_is_delivered_unstripped_and_the_next_message_too(
    server: FakeQueueManagerServer, caplog: pytest.LogCaptureFixture
) -> None:
    # 21 KB of <usr> groups: a recursive walk of it overflows Python's stack.
    deep = build_rfh2(["<usr>" + "<g>" * 3000 + "<n>1</n>" + "</g>" * 3000 + "</usr>"])
    server.put_message(QUEUE, deep + b"<x/>", format=CMQC.MQFMT_RF_HEADER_2)
    server.put_message(QUEUE, b"<next/>")
    with caplog.at_level(logging.WARNING), make_source(server).connect() as session:
        first, second = session.get(), session.get()
        session.commit()
    assert first is not None and second is not None
    assert first.body == deep + b"<x/>"  # the platform dead-letters these bytes
    assert dict(first.properties) == {}
    assert "MQRFH2 header not understood" in caplog.text
    assert "nested deeper than 64 groups" in caplog.text
    ends = classify_message(LoggedMessage(first.message_id, first.body, first.delivery_count))
    assert isinstance(ends, DeadLetter) and ends.reason is Reason.NOT_WELL_FORMED
    assert second.body == b"<next/>"
    assert ids(server) == []


def test_rfh2_groups_up_to_the_depth_bound_become_dotted_names() -> None:
    folder = "<usr>" + "<g>" * 64 + '<n dt="i4">1</n>' + "</g>" * 64 + "</usr>"
    assert rfh2_properties([folder]) == {"g." * 64 + "n": 1}
    with pytest.raises(Rfh2Error, match="nested deeper than 64 groups"):
        rfh2_properties(["<usr>" + "<g>" * 65 + "<n>1</n>" + "</g>" * 65 + "</usr>"])


def test_any_error_reading_an_rfh2_keeps_it_in_the_body_and_the_next_message_comes(
    server: FakeQueueManagerServer,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def unforeseen(folders: object) -> dict[str, object]:
        raise KeyError("a failure no parser check foresaw")

    monkeypatch.setattr(message_module, "rfh2_properties", unforeseen)
    header = build_rfh2(['<usr><n dt="i4">5</n></usr>'])
    server.put_message(QUEUE, header + b"<x/>", format=CMQC.MQFMT_RF_HEADER_2)
    server.put_message(QUEUE, b"<next/>")
    with caplog.at_level(logging.WARNING), make_source(server).connect() as session:
        first, second = session.get(), session.get()
        session.commit()
    assert first is not None and first.body == header + b"<x/>"
    assert "MQRFH2 header not understood" in caplog.text
    assert "a failure no parser check foresaw" in caplog.text
    assert second is not None and second.body == b"<next/>"


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.sampled_from(["<usr>", "</usr>", "<jms>", "</jms>", "<g>", "</g>", "<Tms>", "</Tms>"])
        | st.sampled_from(['<n dt="i8">', '<n dt="boolean">', '<n dt="bin.hex">', "</n>"])
        | st.sampled_from(['<n xsi:nil="true"/>', "<Pri>", "</Pri>", "&amp;", "&#0;"])
        | st.text(max_size=8),
        max_size=30,
    ).map("".join)
)
def test_a_folder_either_reads_or_raises_rfh2_error(folder: str) -> None:
    try:
        rfh2_properties([folder])
    except Rfh2Error:
        pass


def test_parse_rfh2_rejects_a_folder_running_past_struc_length() -> None:
    header = bytearray(build_rfh2(["<usr></usr>"]))
    header[36:40] = (400).to_bytes(4, "little")
    with pytest.raises(Rfh2Error, match="runs past"):
        parse_rfh2(bytes(header), CMQC.MQENC_NATIVE)


# -- BOTHRESH / BOQNAME -----------------------------------------------------------------


def test_message_at_bothresh_moves_to_boqname_in_the_same_unit(
    server: FakeQueueManagerServer,
) -> None:
    poison = server.put_message(
        QUEUE, b"<poison/>", backout_count=3, put_appl_name=b"provider-app".ljust(28)
    )
    good = server.put_message(QUEUE, b"<good/>")
    with make_source(server).connect() as session:
        message = session.get()
        assert message is not None and message.message_id == good.message_id
        assert server.messages(BOQ) == []  # the move is not visible before the commit
        session.commit()
    assert server.messages(QUEUE) == []
    (moved,) = server.messages(BOQ)
    assert moved.message_id == poison.message_id
    assert moved.body == b"<poison/>"
    # Context passed from the input handle: still the provider's message, not ours.
    assert (moved.put_date, moved.put_time) == (poison.put_date, poison.put_time)
    assert moved.put_appl_name == b"provider-app".ljust(28)


def test_backout_of_the_unit_rolls_back_the_move(server: FakeQueueManagerServer) -> None:
    delivered = server.put_message(QUEUE, b"<good/>")
    poison = server.put_message(QUEUE, b"<poison/>", backout_count=3)
    with make_source(server).connect() as session:
        assert session.get() is not None
        assert session.get() is None  # the poison message went to BOQNAME, in this unit
        session.backout()
    assert server.messages(BOQ) == []
    assert ids(server) == [delivered.message_id, poison.message_id]
    assert server.messages(QUEUE)[1].backout_count == 4


def test_repeated_backouts_reach_bothresh_and_move_the_message(
    server: FakeQueueManagerServer,
) -> None:
    put = server.put_message(QUEUE, b"<fails-every-time/>")
    with make_source(server).connect() as session:
        counts = []
        for _ in range(3):
            message = session.get()
            assert message is not None
            counts.append(message.delivery_count)
            session.backout()
        assert session.get() is None
        session.commit()
    assert counts == [1, 2, 3]
    assert [m.message_id for m in server.messages(BOQ)] == [put.message_id]


def test_blank_boqname_sends_the_message_to_the_dead_letter_queue_with_an_mqdlh(
    server: FakeQueueManagerServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.define_queue(QUEUE, backout_threshold=2)  # no BOQNAME
    poison = server.put_message(QUEUE, b"<poison/>", backout_count=2, format=CMQC.MQFMT_STRING)
    with caplog.at_level(logging.WARNING), make_source(server).connect() as session:
        assert session.get() is None
        session.commit()
    assert "BOQNAME is blank" in caplog.text
    (dead,) = server.messages(DLQ)
    assert dead.message_id == poison.message_id
    assert dead.format == CMQC.MQFMT_DEAD_LETTER_HEADER
    header = read_dead_letter_header(dead.body)
    assert header["StrucId"] == b"DLH "
    assert header["Reason"] == CMQC.MQRC_BACKOUT_THRESHOLD_REACHED
    assert (header["DestQName"], header["DestQMgrName"]) == (QUEUE, "QM1")
    assert header["Format"] == CMQC.MQFMT_STRING  # describes the original data
    assert header["data"] == b"<poison/>"


def test_unusable_boqname_falls_back_to_the_dead_letter_queue(
    server: FakeQueueManagerServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.define_queue(QUEUE, backout_threshold=1, backout_queue="NOT.DEFINED")
    poison = server.put_message(QUEUE, b"<poison/>", backout_count=1)
    with caplog.at_level(logging.ERROR), make_source(server).connect() as session:
        assert session.get() is None
        session.commit()
    assert "MQRC_UNKNOWN_OBJECT_NAME" in caplog.text
    assert [m.message_id for m in server.messages(DLQ)] == [poison.message_id]


def test_without_boqname_or_dead_letter_queue_the_message_is_delivered_and_logged(
    server: FakeQueueManagerServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.dead_letter_queue = ""
    server.define_queue(QUEUE, backout_threshold=2)
    server.put_message(QUEUE, b"<poison/>", backout_count=5)
    with caplog.at_level(logging.ERROR), make_source(server).connect() as session:
        message = session.get()
        session.commit()
    assert message is not None and message.delivery_count == 6
    assert "neither BOQNAME nor a dead-letter queue" in caplog.text
    assert "redelivery limit must dead-letter it" in caplog.text


def test_bothresh_zero_applies_the_platform_default_threshold_and_the_next_is_delivered(
    server: FakeQueueManagerServer,
) -> None:
    server.define_queue(QUEUE)  # MQ's defaults: BOTHRESH(0), BOQNAME blank
    poison = server.put_message(QUEUE, b"<kills-intake/>")
    good = server.put_message(QUEUE, b"<good/>")
    with make_source(server, backout_queue=BOQ).connect() as session:
        for delivery in range(1, DEFAULT_BACKOUT_THRESHOLD + 1):
            message = session.get()
            assert message is not None
            assert (message.message_id, message.delivery_count) == (poison.message_id, delivery)
            session.backout()
        message = session.get()
        assert message is not None and message.message_id == good.message_id
        session.commit()
    assert ids(server, BOQ) == [poison.message_id]
    assert server.messages(QUEUE) == []


def test_the_queues_own_bothresh_and_boqname_come_before_the_platforms(
    server: FakeQueueManagerServer,
) -> None:
    server.define_queue("OTHER.BACKOUT")
    poison = server.put_message(QUEUE, b"<poison/>", backout_count=3)  # BOTHRESH(3) BOQNAME(BOQ)
    source = make_source(server, backout_threshold=20, backout_queue="OTHER.BACKOUT")
    with source.connect() as session:
        assert session.get() is None
        session.commit()
    assert ids(server, BOQ) == [poison.message_id]
    assert server.messages("OTHER.BACKOUT") == []


def test_platform_threshold_zero_with_bothresh_zero_never_moves_and_warns(
    server: FakeQueueManagerServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.define_queue(QUEUE, backout_threshold=0, backout_queue=BOQ)
    server.put_message(QUEUE, b"<m/>", backout_count=50)
    with (
        caplog.at_level(logging.WARNING),
        make_source(server, backout_threshold=0).connect() as session,
    ):
        message = session.get()
        session.commit()
    assert message is not None and message.delivery_count == 51
    assert server.messages(BOQ) == []
    assert "no backout threshold" in caplog.text


def test_alias_queue_without_bothresh_delivers_and_warns(
    server: FakeQueueManagerServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.define_queue("SPORTSDATA.ALIAS", alias_of=QUEUE)
    server.put_message(QUEUE, b"<m/>", backout_count=9)
    source = make_source(server, queue="SPORTSDATA.ALIAS")
    with caplog.at_level(logging.WARNING), source.connect() as session:
        message = session.get()
        session.commit()
    assert message is not None and message.delivery_count == 10
    assert "no BOTHRESH/BOQNAME" in caplog.text


# -- bounded gets ------------------------------------------------------------------------


def test_message_over_max_get_bytes_is_moved_whole_unreturned_and_the_next_delivered(
    server: FakeQueueManagerServer, caplog: pytest.LogCaptureFixture
) -> None:
    big = server.put_message(QUEUE, b"<big>" + b"x" * 5000 + b"</big>")
    good = server.put_message(QUEUE, b"<good/>")
    with (
        caplog.at_level(logging.WARNING),
        make_source(server, max_get_bytes=1024).connect() as session,
    ):
        message = session.get()
        assert message is not None and message.message_id == good.message_id
        assert server.messages(BOQ) == []  # moved in the unit of work
        session.commit()
    (moved,) = server.messages(BOQ)
    assert (moved.message_id, moved.body) == (big.message_id, big.body)
    assert (moved.put_date, moved.put_time) == (big.put_date, big.put_time)
    assert server.messages(QUEUE) == []
    assert f"moved {big.message_id} to {BOQ}: 5011 bytes, over the get limit of 1024" in (
        caplog.text
    )
    # The first buffer is the bound; the one larger get is matched to that message by MsgId.
    first, whole, _next = server.gets
    assert first.max_length == 1024
    assert (whole.max_length, whole.md_msg_id) == (5011, big.msg_id)
    assert whole.match_options & CMQC.MQMO_MATCH_MSG_ID


def test_message_longer_than_the_first_buffer_is_got_again_whole_by_msgid(
    server: FakeQueueManagerServer,
) -> None:
    body = b"<m>" + b"x" * (100 * 1024) + b"</m>"  # over 64 KiB, under max_get_bytes
    put = server.put_message(QUEUE, body)
    with make_source(server).connect() as session:
        message = session.get()
        session.commit()
    assert message is not None and (message.message_id, message.body) == (put.message_id, body)
    first, whole = server.gets
    assert (first.max_length, whole.max_length) == (64 * 1024, len(body))
    assert server.messages(BOQ) == []


def test_buffers_never_exceed_the_channels_limit_whatever_max_get_bytes(
    server: FakeQueueManagerServer,
) -> None:
    # A 4 MiB server-connection channel: a buffer above it would fail with 2010 on every get.
    assert server.channel_max_message_length == 4 * 1024 * 1024 < DEFAULT_MAX_GET_BYTES
    small = server.put_message(QUEUE, b"<small/>")
    large = server.put_message(QUEUE, b"L" * (3 * 1024 * 1024))
    with make_source(server).connect() as session:
        got = [session.get(), session.get()]
        session.commit()
    assert [m.message_id for m in got if m] == [small.message_id, large.message_id]
    assert all(g.max_length is not None and g.max_length <= 3 * 1024 * 1024 for g in server.gets)
    # The MQCD offers MQ's largest length, so the server-connection channel decides.
    assert server.connects[0].max_message_length == 104_857_600


def test_message_longer_than_the_channel_allows_fails_the_get_naming_maxmsgl() -> None:
    server = FakeQueueManagerServer(
        listeners=("mq1(1414)",), users={"app": PASSWORD}, channel_max_message_length=1024 * 1024
    )
    server.define_queue(QUEUE)
    big = server.put_message(QUEUE, b"u" * (2 * 1024 * 1024))  # put by a local application
    with make_source(server).connect() as session, pytest.raises(IbmMqError) as raised:
        session.get()
    assert raised.value.reason == CMQC.MQRC_DATA_LENGTH_ERROR
    assert f"{big.message_id} of {2 * 1024 * 1024} bytes" in str(raised.value)
    assert "MAXMSGL" in str(raised.value)
    assert ids(server) == [big.message_id]  # still there, nothing lost


def test_message_of_exactly_max_get_bytes_is_delivered(server: FakeQueueManagerServer) -> None:
    put = server.put_message(QUEUE, b"y" * 1024)
    with make_source(server, max_get_bytes=1024).connect() as session:
        message = session.get()
        session.commit()
    assert message is not None and (message.message_id, message.body) == (put.message_id, put.body)


def test_backout_undoes_the_move_of_an_over_size_message(server: FakeQueueManagerServer) -> None:
    big = server.put_message(QUEUE, b"z" * 2048)
    with make_source(server, max_get_bytes=1024).connect() as session:
        assert session.get() is None
        session.backout()
    assert server.messages(BOQ) == []
    assert ids(server) == [big.message_id]
    assert server.messages(QUEUE)[0].backout_count == 1


def test_over_size_message_without_boqname_goes_to_the_dead_letter_queue_reason_2080(
    server: FakeQueueManagerServer,
) -> None:
    server.define_queue(QUEUE)  # no BOTHRESH, no BOQNAME
    big = server.put_message(QUEUE, b"w" * 2048)
    with make_source(server, max_get_bytes=1024).connect() as session:
        assert session.get() is None
        session.commit()
    (dead,) = server.messages(DLQ)
    header = read_dead_letter_header(dead.body)
    assert header["Reason"] == CMQC.MQRC_TRUNCATED_MSG_FAILED
    assert (dead.message_id, header["data"]) == (big.message_id, big.body)


def test_over_size_message_no_queue_takes_is_delivered_whole_with_an_error(
    server: FakeQueueManagerServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.dead_letter_queue = ""
    server.define_queue(QUEUE)
    big = server.put_message(QUEUE, b"v" * 2048)
    with (
        caplog.at_level(logging.ERROR),
        make_source(server, max_get_bytes=1024).connect() as session,
    ):
        message = session.get()
        session.commit()
    assert message is not None and message.body == big.body
    assert f"delivering {big.message_id} although 2048 bytes, over the get limit" in caplog.text
    assert "intake must dead-letter it too-large" in caplog.text


# -- connecting -------------------------------------------------------------------------


def test_a_password_without_tls_is_warned_about_once_per_channel(
    server: FakeQueueManagerServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(connection_module, "_warned_in_clear", set())
    with caplog.at_level(logging.WARNING, logger=connection_module.__name__):
        make_source(server).connect().close()
        make_source(server).connect().close()  # the same channel: said once
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "user app's password is sent without TLS" in warning
    assert "DEV.APP.SVRCONN" in warning and PASSWORD not in warning

    caplog.clear()
    server.cipher_spec = "ANY_TLS12_OR_HIGHER"
    tls = make_source(
        server, cipher_spec="ANY_TLS12_OR_HIGHER", key_repository="/var/mqm/ssl/client"
    )
    with caplog.at_level(logging.WARNING, logger=connection_module.__name__):
        tls.connect().close()
    assert not [r for r in caplog.records if "without TLS" in r.getMessage()]


def test_client_connection_passes_channel_conn_name_tls_and_credentials(
    server: FakeQueueManagerServer,
) -> None:
    server.cipher_spec = "ANY_TLS12_OR_HIGHER"
    source = make_source(
        server,
        cipher_spec="ANY_TLS12_OR_HIGHER",
        key_repository="/var/mqm/ssl/client",
        certificate_label="ibmwebspheremqapp",
    )
    source.connect().close()
    (record,) = server.connects
    assert record.queue_manager == "QM1"
    assert (record.channel, record.conn_name) == ("DEV.APP.SVRCONN", "mq1(1414),mq2(1414)")
    assert (record.channel_type, record.transport_type) == (CMQC.MQCHT_CLNTCONN, CMQC.MQXPT_TCP)
    assert record.cipher_spec == "ANY_TLS12_OR_HIGHER"
    assert record.key_repository == "/var/mqm/ssl/client"
    assert record.certificate_label == "ibmwebspheremqapp"
    assert (record.user, record.password) == ("app", PASSWORD)
    assert record.options == CMQC.MQCNO_RECONNECT_DISABLED
    # pymqi must never MQDISC (which commits) from a garbage-collected QueueManager.
    assert record.disconnect_on_exit is False


@pytest.mark.parametrize(
    ("mode", "option"),
    [
        ("any", CMQC.MQCNO_RECONNECT),
        ("qmgr", CMQC.MQCNO_RECONNECT_Q_MGR),
        ("as_def", CMQC.MQCNO_RECONNECT_AS_DEF),
    ],
)
def test_client_reconnect_setting_becomes_the_mqcno_option(
    server: FakeQueueManagerServer, mode: str, option: int
) -> None:
    make_source(server, client_reconnect=mode).connect().close()
    assert server.connects[0].options == option


def test_without_a_user_no_credentials_are_sent(server: FakeQueueManagerServer) -> None:
    server.users = None
    make_source(server, user=None, password=None).connect().close()
    assert (server.connects[0].user, server.connects[0].password) == (None, None)


def test_a_user_without_a_password_is_rejected_at_construction(
    server: FakeQueueManagerServer,
) -> None:
    with pytest.raises(ValueError, match="needs a password"):
        make_source(server, password=None)


def test_wrong_password_raises_ibm_mq_error_naming_2035_without_retrying(
    server: FakeQueueManagerServer, sleeps: Sleeps
) -> None:
    with pytest.raises(IbmMqError) as raised:
        make_source(server, sleeps, password="wrong").connect()
    assert raised.value.reason == 2035
    assert "MQCONNX queue manager QM1 failed: MQRC_NOT_AUTHORIZED (2035)" in str(raised.value)
    assert sleeps == [] and len(server.connects) == 1


def test_unknown_queue_raises_ibm_mq_error_naming_2085(server: FakeQueueManagerServer) -> None:
    with pytest.raises(IbmMqError, match=r"MQOPEN queue NOPE failed: MQRC_UNKNOWN_OBJECT_NAME"):
        make_source(server, queue="NOPE").connect()
    assert server.live_connections == 0  # the half-opened connection was closed


def test_tls_channel_without_a_key_repository_fails_with_2381(
    server: FakeQueueManagerServer,
) -> None:
    server.cipher_spec = "ANY_TLS12_OR_HIGHER"
    with pytest.raises(IbmMqError, match="MQRC_KEY_REPOSITORY_ERROR"):
        make_source(server, cipher_spec="ANY_TLS12_OR_HIGHER").connect()


QM_SUBJECT = "CN=QM1,OU=Feeds,O=SIS,C=GB"


def tls_source(server: FakeQueueManagerServer, sleeps: Sleeps, **overrides: object) -> IbmMqQueue:
    server.cipher_spec = "ANY_TLS12_OR_HIGHER"
    server.certificate_subject = QM_SUBJECT
    settings: dict[str, object] = {
        "cipher_spec": "ANY_TLS12_OR_HIGHER",
        "key_repository": "/var/mqm/ssl/client",
    }
    return make_source(server, sleeps, **{**settings, **overrides})


@pytest.mark.parametrize("peer", ["CN=QM1,O=SIS", "cn=qm1, o=sis, c=gb", "CN=QM*,OU=Feeds"])
def test_ssl_peer_name_reaches_the_channel_and_a_matching_certificate_connects(
    server: FakeQueueManagerServer, sleeps: Sleeps, peer: str
) -> None:
    source = tls_source(server, sleeps, ssl_peer_name=peer)
    source.connect().close()
    (record,) = server.connects
    assert record.peer_name == peer  # read through the MQCD's pointer, as MQ's client does
    assert f"peer {peer}" in source.description


@pytest.mark.parametrize("peer", ["CN=QM2,O=SIS", "CN=QM1,O=Other", "CN=QM1,L=London"])
def test_a_certificate_that_does_not_match_the_ssl_peer_name_is_refused_without_retrying(
    server: FakeQueueManagerServer, sleeps: Sleeps, peer: str
) -> None:
    with pytest.raises(IbmMqError) as raised:
        tls_source(server, sleeps, ssl_peer_name=peer).connect()
    assert raised.value.reason == CMQC.MQRC_SSL_PEER_NAME_MISMATCH
    assert "MQRC_SSL_PEER_NAME_MISMATCH (2398)" in str(raised.value)
    assert sleeps == [] and len(server.connects) == 1 and server.live_connections == 0


def test_without_an_ssl_peer_name_the_mqcd_points_at_none(
    server: FakeQueueManagerServer, sleeps: Sleeps
) -> None:
    tls_source(server, sleeps).connect().close()
    assert server.connects[0].peer_name is None


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"ssl_peer_name": "CN=QM1"}, "needs a cipher spec"),
        (
            {"ssl_peer_name": "CN=" + "x" * 1022, "cipher_spec": "ANY_TLS12_OR_HIGHER"},
            "longer than MQ's 1024 bytes",
        ),
        ({"ssl_peer_name": "QM1", "cipher_spec": "ANY_TLS12_OR_HIGHER"}, "not a distinguished"),
        (
            {"ssl_peer_name": "CN=QM1\nO=SIS", "cipher_spec": "ANY_TLS12_OR_HIGHER"},
            "not a distinguished",
        ),
    ],
)
def test_a_bad_ssl_peer_name_is_refused_before_connecting(
    server: FakeQueueManagerServer, settings: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        make_source(server, **settings)
    assert server.connects == []


# -- reconnecting -----------------------------------------------------------------------


def test_unreachable_queue_manager_is_retried_with_backoff_then_source_unavailable(
    server: FakeQueueManagerServer, sleeps: Sleeps
) -> None:
    server.available = False
    source = make_source(server, sleeps, reconnect_attempts=4, reconnect_initial_delay=0.5)
    with pytest.raises(SourceUnavailable, match=r"MQRC_Q_MGR_NOT_AVAILABLE \(2059\)"):
        source.connect()
    assert len(server.connects) == 4
    # Equal jitter with jitter() = 0.5: three quarters of 0.5, 1.0, 2.0 seconds.
    assert sleeps == [0.375, 0.75, 1.5]


def test_transient_refusals_are_retried_until_the_connection_succeeds(
    server: FakeQueueManagerServer, sleeps: Sleeps
) -> None:
    server.refuse_connections(CMQC.MQRC_HOST_NOT_AVAILABLE, CMQC.MQRC_Q_MGR_QUIESCING)
    server.put_message(QUEUE, b"<m/>")
    with make_source(server, sleeps).connect() as session:
        assert session.get() is not None
        session.commit()
    assert len(server.connects) == 3 and len(sleeps) == 2


def test_backoff_delay_doubles_up_to_the_cap_with_jitter(server: FakeQueueManagerServer) -> None:
    low = make_source(server, jitter=lambda: 0.0, reconnect_max_delay=3.0)
    high = make_source(server, jitter=lambda: 1.0, reconnect_max_delay=3.0)
    assert [low.backoff_delay(n) for n in (1, 2, 3, 4, 5)] == [0.25, 0.5, 1.0, 1.5, 1.5]
    assert [high.backoff_delay(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_broken_connection_with_an_empty_unit_reconnects_transparently(
    server: FakeQueueManagerServer,
) -> None:
    put = server.put_message(QUEUE, b"<m/>")
    with make_source(server).connect() as session:
        server.break_connections()
        message = session.get()
        assert message is not None and message.message_id == put.message_id
        session.commit()
    assert len(server.connects) == 2
    assert server.messages(QUEUE) == []


def test_broken_connection_with_messages_in_the_unit_is_reported_not_hidden(
    server: FakeQueueManagerServer,
) -> None:
    first = server.put_message(QUEUE, b"<1/>")
    second = server.put_message(QUEUE, b"<2/>")
    with make_source(server).connect() as session:
        assert session.get() is not None
        server.fail_next("MQGET", CMQC.MQRC_CONNECTION_BROKEN)
        with pytest.raises(SourceUnavailable, match="1 message"):
            session.get()
        # The queue manager backed the unit out: both are back, the first one counted.
        assert ids(server) == [first.message_id, second.message_id]
        assert server.messages(QUEUE)[0].backout_count == 1
        again = session.get()  # a new connection and a new unit
        assert again is not None and again.message_id == first.message_id
        with pytest.raises(SourceUnavailable, match="nothing was committed"):
            session.commit()  # the caller must not believe its first unit committed
        assert ids(server) == [first.message_id, second.message_id]
        assert session.get() is not None
        session.commit()
    assert ids(server) == [second.message_id]


def test_quiescing_queue_manager_backs_out_the_unit_before_disconnecting(
    server: FakeQueueManagerServer,
) -> None:
    put = server.put_message(QUEUE, b"<m/>")
    server.put_message(QUEUE, b"<n/>")
    with make_source(server).connect() as session:
        assert session.get() is not None
        # 2161 leaves the connection up with the unit open; MQDISC alone would commit it.
        server.fail_next("MQGET", CMQC.MQRC_Q_MGR_QUIESCING)
        with pytest.raises(SourceUnavailable, match="MQRC_Q_MGR_QUIESCING"):
            session.get()
    assert server.disconnects_committing_a_unit == 0
    assert ids(server)[0] == put.message_id


def test_reconnect_exhausted_during_get_raises_source_unavailable(
    server: FakeQueueManagerServer, sleeps: Sleeps
) -> None:
    with make_source(server, sleeps, reconnect_attempts=3).connect() as session:
        server.break_connections()
        server.available = False
        with pytest.raises(SourceUnavailable, match="not reachable after 3 attempts"):
            session.get()
        server.available = True
        assert session.get() is None  # and it recovers once the queue manager is back
    assert len(sleeps) == 2


def test_connection_lost_during_commit_reports_an_unknown_outcome(
    server: FakeQueueManagerServer,
) -> None:
    server.put_message(QUEUE, b"<m/>")
    with make_source(server).connect() as session:
        assert session.get() is not None
        server.fail_next("MQCMIT", CMQC.MQRC_CONNECTION_BROKEN)
        with pytest.raises(SourceUnavailable, match="outcome is unknown"):
            session.commit()
        again = session.get()
        assert again is not None and again.delivery_count == 2
        session.commit()


def test_commit_answered_backed_out_raises_source_unavailable(
    server: FakeQueueManagerServer,
) -> None:
    server.put_message(QUEUE, b"<m/>")
    with make_source(server).connect() as session:
        assert session.get() is not None
        server.fail_next("MQCMIT", CMQC.MQRC_BACKED_OUT)
        with pytest.raises(SourceUnavailable, match="MQRC_BACKED_OUT"):
            session.commit()


def test_other_reasons_raise_ibm_mq_error_with_the_reason_name(
    server: FakeQueueManagerServer,
) -> None:
    with make_source(server).connect() as session:
        server.fail_next("MQGET", CMQC.MQRC_NOT_AUTHORIZED)
        with pytest.raises(IbmMqError) as raised:
            session.get()
    assert str(raised.value) == (
        f"MQGET queue {QUEUE} failed: MQRC_NOT_AUTHORIZED (2035), MQCC_FAILED"
    )


def test_backout_on_a_broken_connection_is_quietly_done_by_the_queue_manager(
    server: FakeQueueManagerServer,
) -> None:
    put = server.put_message(QUEUE, b"<m/>")
    with make_source(server).connect() as session:
        assert session.get() is not None
        server.break_connections()
        session.backout()
        message = session.get()
        assert message is not None and message.message_id == put.message_id
        assert message.delivery_count == 2
        session.commit()


def test_a_connection_breaking_again_right_after_reconnecting_is_reported(
    server: FakeQueueManagerServer,
) -> None:
    server.put_message(QUEUE, b"<m/>")
    with make_source(server).connect() as session:
        server.break_connections()
        server.fail_next("MQGET", CMQC.MQRC_CONNECTION_BROKEN)
        with pytest.raises(SourceUnavailable, match="again right after reconnecting"):
            session.get()
    assert len(server.connects) == 2


# -- closing ----------------------------------------------------------------------------


def test_close_backs_out_the_open_unit_instead_of_letting_mqdisc_commit_it(
    server: FakeQueueManagerServer,
) -> None:
    put = server.put_message(QUEUE, b"<m/>")
    session = make_source(server).connect()
    assert session.get() is not None
    session.close()
    session.close()  # idempotent
    assert server.disconnects_committing_a_unit == 0
    assert ids(server) == [put.message_id]
    assert server.messages(QUEUE)[0].backout_count == 1
    assert server.live_connections == 0
    with pytest.raises(RuntimeError, match="closed"):
        session.get()


def test_close_does_not_disconnect_when_mqback_fails_because_mqdisc_would_commit(
    server: FakeQueueManagerServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.put_message(QUEUE, b"<m/>")
    session = make_source(server).connect()
    assert session.get() is not None
    server.fail_next("MQBACK", CMQC.MQRC_UNEXPECTED_ERROR)
    with caplog.at_level(logging.ERROR):
        session.close()
    assert "not disconnecting, so as not to commit" in caplog.text
    assert server.disconnects_committing_a_unit == 0
    assert server.in_flight() == 1  # left for the end of the process to back out


# -- producing --------------------------------------------------------------------------


def test_producer_puts_a_persistent_bytes_message_committed_at_once(
    server: FakeQueueManagerServer,
) -> None:
    with make_source(server).producer() as producer:
        message_id = producer.put(b"<sportsdata/>")
    (stored,) = server.messages(QUEUE)
    assert stored.message_id == message_id
    assert len(message_id) == 3 + 48
    assert stored.format == CMQC.MQFMT_NONE
    assert stored.persistence == CMQC.MQPER_PERSISTENT
    with make_source(server).connect() as session:
        got = session.get()
        session.commit()
    assert got is not None and got.message_id == message_id and got.body == b"<sportsdata/>"


def test_producer_reuses_an_explicit_message_id_for_duplicates(
    server: FakeQueueManagerServer,
) -> None:
    duplicate = "ID:" + "ab" * 24
    with make_source(server).producer() as producer:
        assert producer.put(b"<a/>", message_id=duplicate) == duplicate
        assert producer.put(b"<a/>", message_id=duplicate) == duplicate
        with pytest.raises(ValueError, match="not a JMS message id"):
            producer.put(b"<a/>", message_id="ID:xyz")
    assert ids(server) == [duplicate, duplicate]


def test_producer_retries_a_broken_put_once_with_the_same_message_id(
    server: FakeQueueManagerServer,
) -> None:
    with make_source(server).producer() as producer:
        server.fail_next("MQPUT", CMQC.MQRC_CONNECTION_BROKEN)
        message_id = producer.put(b"<a/>")
        server.fail_next("MQPUT", CMQC.MQRC_CONNECTION_BROKEN)
        server.fail_next("MQPUT", CMQC.MQRC_CONNECTION_BROKEN)
        with pytest.raises(SourceUnavailable, match="MQPUT"):
            producer.put(b"<b/>")
    assert ids(server) == [message_id]
    assert len(server.connects) == 3


# -- description and secrets ------------------------------------------------------------


def test_description_names_qmgr_channel_conn_and_queue_but_never_the_password(
    server: FakeQueueManagerServer,
) -> None:
    source = make_source(server, cipher_spec="ANY_TLS12_OR_HIGHER")
    assert source.description == (
        f"IBM MQ queue {QUEUE} on queue manager QM1 (channel DEV.APP.SVRCONN, "
        "conn mq1(1414),mq2(1414), TLS ANY_TLS12_OR_HIGHER, user app)"
    )
    for text in (source.description, repr(source), str(source), repr(vars(source))):
        assert PASSWORD not in text


def test_password_never_appears_in_logs_or_errors(
    server: FakeQueueManagerServer, caplog: pytest.LogCaptureFixture
) -> None:
    errors: list[str] = []
    with caplog.at_level(logging.DEBUG):
        server.available = False
        try:
            make_source(server).connect()
        except SourceUnavailable as exc:
            errors.append(repr(exc) + str(exc))
        server.available = True
        server.dead_letter_queue = ""
        server.define_queue(QUEUE, backout_threshold=1)
        server.put_message(QUEUE, b"<m/>", backout_count=1)
        with make_source(server).connect() as session:
            session.get()
            server.fail_next("MQCMIT", CMQC.MQRC_NOT_AUTHORIZED)
            try:
                session.commit()
            except IbmMqError as exc:
                errors.append(repr(exc) + str(exc))
    assert len(errors) == 2 and caplog.records
    assert all(PASSWORD not in text for text in errors)
    assert PASSWORD not in caplog.text


# -- which binding: IBM's ibmmq, else pymqi -------------------------------------------------


@pytest.mark.parametrize(
    ("installed", "loaded"),
    [(("ibmmq", "pymqi"), "ibmmq"), (("ibmmq",), "ibmmq"), (("pymqi",), "pymqi")],
)
def test_the_source_uses_ibmmq_when_installed_else_pymqi(
    server: FakeQueueManagerServer,
    monkeypatch: pytest.MonkeyPatch,
    installed: tuple[str, ...],
    loaded: str,
) -> None:
    fakes = {name: FakePymqi(server) for name in installed}
    for name in MQI_MODULES:
        monkeypatch.setitem(sys.modules, name, fakes.get(name))  # None: `import name` fails
    assert load_mqi() is fakes[loaded]
    poison = server.put_message(QUEUE, b"<poison/>")
    source = make_source(server, pymqi_module=None)  # the binding is loaded, not injected
    with source.connect() as session:
        message = session.get()
        session.commit()
    assert message is not None and message.message_id == poison.message_id
    assert source.pymqi is fakes[loaded]


def test_connecting_without_either_binding_names_the_extras_and_the_mq_client_library(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in MQI_MODULES:
        monkeypatch.setitem(sys.modules, name, None)  # makes `import name` fail
    source = IbmMqQueue("QM1", "DEV.APP.SVRCONN", "mq1(1414)", QUEUE)  # constructing is fine
    with pytest.raises(IbmMqClientMissing) as raised:
        source.connect()
    text = str(raised.value)
    assert "sis-platform[ibmmq]" in text and "sis-platform[pymqi]" in text
    assert "IBM MQ C client library" in text
    assert "ibmmq: " in text and "pymqi: " in text  # why each import failed
    assert isinstance(raised.value, ImportError)


# -- helpers for administration and the conformance suite ------------------------------


def test_with_queue_keeps_the_connection_settings_for_another_queue(
    server: FakeQueueManagerServer,
) -> None:
    poison = server.put_message(BOQ, b"<poison/>")
    source = make_source(server, cipher_spec=None)
    backout = source.with_queue(BOQ)
    assert (source.queue, backout.queue) == (QUEUE, BOQ)
    with backout.connect() as session:
        message = session.get()
        session.commit()
    assert message is not None and message.message_id == poison.message_id
    assert server.connects[-1].password == PASSWORD


def test_connected_queue_manager_backs_out_and_disconnects_on_exit(
    server: FakeQueueManagerServer,
) -> None:
    with make_source(server).connected_queue_manager() as qmgr:
        assert qmgr.inquire(CMQC.MQCA_DEAD_LETTER_Q_NAME).rstrip() == DLQ.encode()
        assert server.live_connections == 1
    assert server.live_connections == 0
    assert server.disconnects_committing_a_unit == 0


def test_conformance_real_queue_manager_entry_defines_and_deletes_its_queues(
    server: FakeQueueManagerServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry's "ibmmq" glue (from_env, PCF) run against the fake posing as ibmmq."""
    monkeypatch.setitem(sys.modules, "ibmmq", FakePymqi(server))
    env = {
        "SIS_IBMMQ_QMGR": "QM1",
        "SIS_IBMMQ_CHANNEL": "DEV.APP.SVRCONN",
        "SIS_IBMMQ_CONN": "mq1(1414)",
        "SIS_IBMMQ_USER": "app",
        "SIS_IBMMQ_PASSWORD": PASSWORD,
    }
    spec = {"env": env, "key": "test"}
    name = "T" + "0" * 32
    with sources.open_ibmmq(spec, name, 0).producer() as producer:
        poison = producer.put(b"<poison/>")
    source = sources.open_ibmmq(spec, name, 1)
    assert (server.queues[name].backout_threshold, server.queues[name].backout_queue) == (
        1,
        f"{name}.BACKOUT",
    )
    with source.connect() as session:
        assert session.get() is not None
        session.backout()
        assert session.get() is None  # moved to BOQNAME
        session.commit()
    assert [m.message_id for m in sources.read_backout_ibmmq(source)] == [poison]
    sources._delete_real_queues(env, sources._REAL_QUEUES.pop("test"))
    assert name not in server.queues and f"{name}.BACKOUT" not in server.queues
