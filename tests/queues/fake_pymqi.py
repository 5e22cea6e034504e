"""A FAKE of the part of pymqi that `sis_platform.queues.ibmmq` uses: not pymqi, not IBM MQ.

No queue manager runs on the build machines and pymqi cannot even be installed without the
IBM MQ client library, so the IBM MQ source is tested against this stand-in. It copies
pymqi's surface (class names QueueManager, Queue, MD, GMO, PMO, OD, CD, SCO, the CMQC
constant names and values, MQMIError(comp, reason) with `.comp`/`.reason`, Error,
PYIFError) and models, in memory, the queue manager behaviour the source relies on:

- local queues with FIFO order, BOTHRESH/BOQNAME, a maximum depth, alias queues (which have
  no BOTHRESH: MQINQ answers 2067 MQRC_SELECTOR_ERROR), and the queue manager's DEADQ;
- one unit of work per connection: MQGMO_SYNCPOINT gets are hidden until MQCMIT (gone) or
  MQBACK (reinstated at their old position with BackoutCount + 1); MQPMO_SYNCPOINT puts are
  visible only after MQCMIT; a normal MQDISC commits an open unit (MQDISC usage notes), a
  broken connection backs it out;
- MQMD fields filled in by MQGET (MsgId, CorrelId, Format, Encoding, CCSID, Persistence,
  BackoutCount, PutDate/PutTime in UTC with hundredths, PutApplName, UserIdentifier) and by
  MQPUT (a generated MsgId unless one is given; context passed from a saved input handle with
  MQPMO_PASS_ALL_CONTEXT, or set by the queue manager otherwise);
- MQGMO wait with reason 2033 MQRC_NO_MSG_AVAILABLE, MQMD match on MsgId/CorrelId. By default
  the fake never blocks (a test can hook `on_wait` to make a message arrive "during" the
  wait); with `blocking_waits=True` an MQGET really waits up to its WaitInterval for another
  thread's put, commit or backout (the conformance suite needs that);
- client connection checks: queue manager name, channel, conn name list, channel type and
  transport, TLS cipher spec and key repository, user/password (MQCSP), reconnect options;
  the SSLPEER the MQCD points at (read through its pointer and length, as the MQ client
  does) against the queue manager certificate's subject (`certificate_subject`): every
  attribute it names must be in the subject with that value, a value may end in `*`, names
  and values compare case-insensitively; a mismatch is 2398 MQRC_SSL_PEER_NAME_MISMATCH and a
  name that is not attribute=value pairs 2399 MQRC_SSL_PEER_NAME_ERROR;
- the channel's negotiated maximum message length (the lower of the MQCD's MaxMsgLength and
  the server-connection channel's MAXMSGL, 4 MiB by default): an MQGET or MQPUT whose buffer
  exceeds it fails with 2010 MQRC_DATA_LENGTH_ERROR, as for an MQ client; an MQGET with a
  maximum length fails with 2080 MQRC_TRUNCATED_MSG_FAILED for a longer message, leaving it
  on the queue, with the MQMD filled in and the full length on the error (pymqi's
  `original_length`);
- injectable failures: refused connects, the next call of a kind failing with a reason,
  broken connections (reason 2009 MQRC_CONNECTION_BROKEN by default), and a client that dies
  without MQBACK or MQDISC (`kill`);
- MQRFH2 bodies (`build_rfh2`) and MQDLH headers (`read_dead_letter_header`);
- PCF MQCMD_CREATE_Q / MQCMD_CHANGE_Q / MQCMD_DELETE_Q on local queues (PCFExecute), enough to
  run the conformance registry's real-queue-manager glue here.

It is stricter than pymqi in one way: assigning a field a structure does not have raises
AttributeError, so a misspelt option is a test failure rather than a silently ignored field.

What it cannot prove: anything about the wire (MQI client protocol, TLS handshakes, channel
authentication records, authority checks beyond one user/password), that real pymqi accepts
these calls with these types (its struct packing), real MQRFH2 produced by a JMS client, data
conversion, priorities, message groups or segmentation, MQ's own client auto-reconnect, how
long a real MQGET waits, or MQ's exact reason code for each failure. The conformance suite's
"ibmmq" entry runs the same tests against a real queue manager when one is configured.
"""

from __future__ import annotations

import ctypes
import functools
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar


class CMQC:
    """pymqi.CMQC: the cmqc.h constants the source and this fake use (same names and values)."""

    MQCC_OK = 0
    MQCC_WARNING = 1
    MQCC_FAILED = 2

    MQRC_NONE = 0
    MQRC_BACKED_OUT = 2003
    MQRC_CONNECTION_BROKEN = 2009
    MQRC_HCONN_ERROR = 2018
    MQRC_HOBJ_ERROR = 2019
    MQRC_NO_MSG_AVAILABLE = 2033
    MQRC_NOT_AUTHORIZED = 2035
    MQRC_NOT_OPEN_FOR_INPUT = 2037
    MQRC_NOT_OPEN_FOR_INQUIRE = 2038
    MQRC_NOT_OPEN_FOR_OUTPUT = 2039
    MQRC_PUT_INHIBITED = 2051
    MQRC_Q_FULL = 2053
    MQRC_Q_MGR_NAME_ERROR = 2058
    MQRC_Q_MGR_NOT_AVAILABLE = 2059
    MQRC_SELECTOR_ERROR = 2067
    MQRC_TRUNCATED_MSG_FAILED = 2080
    MQRC_DATA_LENGTH_ERROR = 2010
    MQRC_UNKNOWN_OBJECT_NAME = 2085
    MQRC_NOT_OPEN_FOR_PASS_ALL = 2093
    MQRC_CONTEXT_HANDLE_ERROR = 2097
    MQRC_Q_MGR_QUIESCING = 2161
    MQRC_Q_MGR_STOPPING = 2162
    MQRC_UNEXPECTED_ERROR = 2195
    MQRC_CONNECTION_QUIESCING = 2202
    MQRC_CONNECTION_STOPPING = 2203
    MQRC_CD_ERROR = 2277
    MQRC_BACKOUT_THRESHOLD_REACHED = 2362
    MQRC_KEY_REPOSITORY_ERROR = 2381
    MQRC_SSL_INITIALIZATION_ERROR = 2393
    MQRC_SSL_PEER_NAME_MISMATCH = 2398
    MQRC_SSL_PEER_NAME_ERROR = 2399
    MQRC_CHANNEL_NOT_AVAILABLE = 2537
    MQRC_HOST_NOT_AVAILABLE = 2538
    MQRC_UNKNOWN_CHANNEL_NAME = 2540
    MQRC_RECONNECT_FAILED = 2548

    MQCHT_SENDER = 1
    MQCHT_CLNTCONN = 6
    MQXPT_LU62 = 1
    MQXPT_TCP = 2

    MQCNO_NONE = 0x00000000
    MQCNO_RECONNECT_AS_DEF = 0x00000000
    MQCNO_RECONNECT = 0x01000000
    MQCNO_RECONNECT_DISABLED = 0x02000000
    MQCNO_RECONNECT_Q_MGR = 0x04000000

    MQOO_INPUT_AS_Q_DEF = 0x00000001
    MQOO_INPUT_SHARED = 0x00000002
    MQOO_INPUT_EXCLUSIVE = 0x00000004
    MQOO_BROWSE = 0x00000008
    MQOO_OUTPUT = 0x00000010
    MQOO_INQUIRE = 0x00000020
    MQOO_SAVE_ALL_CONTEXT = 0x00000080
    MQOO_PASS_ALL_CONTEXT = 0x00000200
    MQOO_FAIL_IF_QUIESCING = 0x00002000
    MQCO_NONE = 0x00000000

    MQGMO_NO_WAIT = 0x00000000
    MQGMO_WAIT = 0x00000001
    MQGMO_SYNCPOINT = 0x00000002
    MQGMO_NO_SYNCPOINT = 0x00000004
    MQGMO_ACCEPT_TRUNCATED_MSG = 0x00000040
    MQGMO_FAIL_IF_QUIESCING = 0x00002000
    MQGMO_CONVERT = 0x00004000
    MQGMO_PROPERTIES_FORCE_MQRFH2 = 0x02000000
    MQGMO_NO_PROPERTIES = 0x04000000
    MQGMO_PROPERTIES_IN_HANDLE = 0x08000000
    MQGMO_VERSION_1 = 1
    MQGMO_VERSION_4 = 4
    MQMO_NONE = 0x00000000
    MQMO_MATCH_MSG_ID = 0x00000001
    MQMO_MATCH_CORREL_ID = 0x00000002

    MQPMO_NONE = 0x00000000
    MQPMO_SYNCPOINT = 0x00000002
    MQPMO_NO_SYNCPOINT = 0x00000004
    MQPMO_NEW_MSG_ID = 0x00000040
    MQPMO_PASS_ALL_CONTEXT = 0x00000200
    MQPMO_FAIL_IF_QUIESCING = 0x00002000

    MQIA_Q_TYPE = 20
    MQIA_BACKOUT_THRESHOLD = 22
    MQCA_Q_NAME = 2016
    MQQT_LOCAL = 1
    MQCA_DEAD_LETTER_Q_NAME = 2006
    MQCA_Q_MGR_NAME = 2015
    MQCA_BACKOUT_REQ_Q_NAME = 2019

    MQMD_VERSION_1 = 1
    MQMT_DATAGRAM = 8
    MQEI_UNLIMITED = -1
    MQENC_NATIVE = 0x00000222
    MQENC_INTEGER_NORMAL = 0x00000001
    MQENC_INTEGER_REVERSED = 0x00000002
    MQCCSI_Q_MGR = 0
    MQFMT_NONE = b"        "
    MQFMT_STRING = b"MQSTR   "
    MQFMT_RF_HEADER_2 = b"MQHRF2  "
    MQFMT_DEAD_LETTER_HEADER = b"MQDEAD  "
    MQPRI_PRIORITY_AS_Q_DEF = -1
    MQPER_NOT_PERSISTENT = 0
    MQPER_PERSISTENT = 1
    MQPER_PERSISTENCE_AS_Q_DEF = 2
    MQMI_NONE = b"\0" * 24
    MQCI_NONE = b"\0" * 24
    MQAT_NO_CONTEXT = 0
    MQAT_UNIX = 6
    MQDLH_STRUC_ID = b"DLH "
    MQDLH_VERSION_1 = 1
    MQRFH_STRUC_ID = b"RFH "
    MQRFH_VERSION_2 = 2
    MQRFH_STRUC_LENGTH_FIXED_2 = 36


class CMQCFC:
    """pymqi.CMQCFC: the PCF constants the conformance registry's real-queue-manager entry uses."""

    MQIACF_PURGE = 1007
    MQPO_NO = 0
    MQPO_YES = 1
    MQRCCF_OBJECT_ALREADY_EXISTS = 4001


# Connection-level reasons: the fake breaks the connection (backing out its unit) when one of
# these is injected, unless told otherwise.
BREAKING_REASONS = frozenset({CMQC.MQRC_CONNECTION_BROKEN, CMQC.MQRC_RECONNECT_FAILED})


class Error(Exception):
    """pymqi.Error: base of MQMIError and PYIFError."""


class MQMIError(Error):
    """pymqi.MQMIError(comp, reason): an MQI call completed with a warning or failed."""

    def __init__(self, comp: int, reason: int, **kw: Any) -> None:
        self.comp, self.reason = comp, reason
        for key, value in kw.items():
            setattr(self, key, value)
        super().__init__(comp, reason)

    def __str__(self) -> str:
        return f"MQI Error. Comp: {self.comp}, Reason {self.reason}: {self.errorAsString()}"

    def errorAsString(self) -> str:  # noqa: N802  (pymqi's name)
        prefix = "WARNING: " if self.comp == CMQC.MQCC_WARNING else "FAILED: "
        for name in dir(CMQC):
            if name.startswith("MQRC_") and getattr(CMQC, name) == self.reason:
                return prefix + name
        return f"{prefix}reason {self.reason}"


class PYIFError(Error):
    """pymqi.PYIFError: misuse of pymqi itself (e.g. disconnecting twice)."""


F = TypeVar("F", bound=Callable[..., Any])


def _locked(method: F) -> F:
    """One queue manager, many threads (the conformance suite gets in one thread while it
    puts in another): every MQI call holds the server's lock."""

    @functools.wraps(method)
    def wrapper(self: FakeQueueManagerServer, *args: Any, **kwargs: Any) -> Any:
        with self._changed:
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _fail(reason: int, comp: int = CMQC.MQCC_FAILED) -> MQMIError:
    return MQMIError(comp, reason)


class _MQOpts:
    """pymqi.MQOpts: a structure whose fields are attributes, items and set()/get() keys."""

    _fields: ClassVar[tuple[tuple[str, Any], ...]] = ()

    def __init__(self, **kw: Any) -> None:
        for name, default in self._fields:
            object.__setattr__(self, name, default)
        self.set(**kw)

    if TYPE_CHECKING:
        # Fields are set from _fields at run time; for the type checker they are all Any.
        def __getattr__(self, name: str) -> Any: ...

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in {f for f, _ in self._fields}:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}")
        object.__setattr__(self, name, value)

    def set(self, **kw: Any) -> None:
        for name, value in kw.items():
            setattr(self, name, value)

    def get(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name, _ in self._fields}

    def __getitem__(self, name: str) -> Any:
        return getattr(self, name)

    def __setitem__(self, name: str, value: Any) -> None:
        setattr(self, name, value)

    def check_packable(self) -> None:
        """pymqi's pack() refuses str where MQ wants bytes (ensure_not_unicode)."""
        for name, _ in self._fields:
            if isinstance(getattr(self, name), str):
                raise TypeError(
                    f"Python 3 style string (unicode) found but not allowed here: {name}. "
                    "Convert to bytes."
                )


class MD(_MQOpts):
    _fields = (
        ("StrucId", b"MD  "),
        ("Version", CMQC.MQMD_VERSION_1),
        ("Report", 0),
        ("MsgType", CMQC.MQMT_DATAGRAM),
        ("Expiry", CMQC.MQEI_UNLIMITED),
        ("Feedback", 0),
        ("Encoding", CMQC.MQENC_NATIVE),
        ("CodedCharSetId", CMQC.MQCCSI_Q_MGR),
        ("Format", b""),
        ("Priority", CMQC.MQPRI_PRIORITY_AS_Q_DEF),
        ("Persistence", CMQC.MQPER_PERSISTENCE_AS_Q_DEF),
        ("MsgId", b""),
        ("CorrelId", b""),
        ("BackoutCount", 0),
        ("ReplyToQ", b""),
        ("ReplyToQMgr", b""),
        ("UserIdentifier", b""),
        ("AccountingToken", b""),
        ("ApplIdentityData", b""),
        ("PutApplType", CMQC.MQAT_NO_CONTEXT),
        ("PutApplName", b""),
        ("PutDate", b""),
        ("PutTime", b""),
        ("ApplOriginData", b""),
        ("GroupId", b""),
        ("MsgSeqNumber", 1),
        ("Offset", 0),
        ("MsgFlags", 0),
        ("OriginalLength", -1),
    )


class GMO(_MQOpts):
    _fields = (
        ("StrucId", b"GMO "),
        ("Version", CMQC.MQGMO_VERSION_1),
        ("Options", CMQC.MQGMO_NO_WAIT),
        ("WaitInterval", 0),
        ("Signal1", 0),
        ("Signal2", 0),
        ("ResolvedQName", b""),
        ("MatchOptions", CMQC.MQMO_MATCH_MSG_ID | CMQC.MQMO_MATCH_CORREL_ID),
        ("GroupStatus", ord(" ")),
        ("SegmentStatus", ord(" ")),
        ("Segmentation", ord(" ")),
        ("Reserved1", b" "),
        ("MsgToken", b""),
        ("ReturnedLength", -1),
        ("Reserved2", 0),
        ("MsgHandle", 0),
    )


class PMO(_MQOpts):
    _fields = (
        ("StrucId", b"PMO "),
        ("Version", 1),
        ("Options", CMQC.MQPMO_NONE),
        ("Timeout", -1),
        ("Context", 0),
        ("KnownDestCount", 0),
        ("UnknownDestCount", 0),
        ("InvalidDestCount", 0),
        ("ResolvedQName", b""),
        ("ResolvedQMgrName", b""),
        ("RecsPresent", 0),
        ("PutMsgRecFields", 0),
        ("PutMsgRecOffset", 0),
        ("ResponseRecOffset", 0),
        ("PutMsgRecPtr", 0),
        ("ResponseRecPtr", 0),
        ("OriginalMsgHandle", 0),
        ("NewMsgHandle", 0),
        ("Action", 0),
        ("PubLevel", 0),
    )


class OD(_MQOpts):
    _fields = (
        ("StrucId", b"OD  "),
        ("Version", 1),
        ("ObjectType", 1),
        ("ObjectName", b""),
        ("ObjectQMgrName", b""),
        ("DynamicQName", b"AMQ.*"),
        ("AlternateUserId", b""),
        ("ResolvedQName", b""),
        ("ResolvedQMgrName", b""),
    )


class CD(_MQOpts):
    _fields = (
        ("ChannelName", b""),
        ("Version", 11),
        ("ChannelType", CMQC.MQCHT_SENDER),
        ("TransportType", CMQC.MQXPT_LU62),
        ("Desc", b""),
        ("QMgrName", b""),
        ("ConnectionName", b""),
        ("MaxMsgLength", 4194304),
        ("HeartbeatInterval", 300),
        ("SSLCipherSpec", b""),
        ("SSLPeerNamePtr", 0),
        ("SSLPeerNameLength", 0),
        ("KeepAliveInterval", -1),
        ("SharingConversations", 10),
        ("DefReconnect", 0),
        ("CertificateLabel", b""),
    )


class SCO(_MQOpts):
    _fields = (
        ("StrucId", b"SCO "),
        ("Version", 5),
        ("KeyRepository", b""),
        ("CryptoHardware", b""),
        ("AuthInfoRecCount", 0),
        ("AuthInfoRecOffset", 0),
        ("AuthInfoRecPtr", 0),
        ("KeyResetCount", 0),
        ("FipsRequired", 0),
        ("EncryptionPolicySuiteB", [0, 0, 0, 0]),
        ("CertificateValPolicy", 0),
        ("CertificateLabel", b""),
    )


def _text(value: bytes | str) -> str:
    if isinstance(value, bytes):
        value = value.decode("ascii")
    return value.rstrip(" \x00")


def _blank_padded(value: str, length: int) -> bytes:
    return value.encode("ascii").ljust(length, b" ")


def _peer_name(cd: CD) -> str | None:
    """The SSLPEER an MQCD points at, read from memory as the MQ client library reads it."""
    if not cd.SSLPeerNamePtr:
        return None
    if cd.SSLPeerNameLength <= 0:
        raise _fail(CMQC.MQRC_CD_ERROR)
    return ctypes.string_at(cd.SSLPeerNamePtr, cd.SSLPeerNameLength).decode("utf-8")


def _distinguished_name(text: str) -> dict[str, str] | None:
    """ "CN=QM1, O=SIS" as {"CN": "QM1", "O": "SIS"} (names upper-cased); None: malformed."""
    attributes = {}
    for part in text.split(","):
        name, equals, value = part.partition("=")
        if not equals or not name.strip() or not value.strip():
            return None
        attributes[name.strip().upper()] = value.strip()
    return attributes


def _check_peer(peer_name: str, subject: str | None) -> None:
    pattern = _distinguished_name(peer_name)
    if pattern is None:
        raise _fail(CMQC.MQRC_SSL_PEER_NAME_ERROR)
    if subject is None:
        return
    actual = _distinguished_name(subject) or {}
    for name, wanted in pattern.items():
        value = actual.get(name, "").upper()
        wanted = wanted.upper()
        matches = value.startswith(wanted[:-1]) if wanted.endswith("*") else value == wanted
        if not matches:
            raise _fail(CMQC.MQRC_SSL_PEER_NAME_MISMATCH)


# -- the queue manager ------------------------------------------------------------------


@dataclass
class StoredMessage:
    """A message on a fake queue, with the MQMD fields MQGET returns."""

    body: bytes
    msg_id: bytes
    seq: int
    correl_id: bytes = CMQC.MQCI_NONE
    format: bytes = CMQC.MQFMT_NONE
    encoding: int = CMQC.MQENC_NATIVE
    ccsid: int = 1208
    persistence: int = CMQC.MQPER_PERSISTENT
    priority: int = 0
    backout_count: int = 0
    put_date: bytes = b"20261121"
    put_time: bytes = b"14300000"
    put_appl_type: int = CMQC.MQAT_UNIX
    put_appl_name: bytes = b"provider".ljust(28)
    user_identifier: bytes = b"provider".ljust(12)

    @property
    def message_id(self) -> str:
        return "ID:" + self.msg_id.hex()


@dataclass
class FakeQueue:
    name: str
    backout_threshold: int = 0
    backout_queue: str = ""
    max_depth: int = 5000
    alias_of: str | None = None  # an alias queue definition (no BOTHRESH/BOQNAME of its own)
    put_inhibited: bool = False
    messages: list[StoredMessage] = field(default_factory=list)  # visible, in order


@dataclass
class ConnectRecord:
    """What one MQCONNX asked for, as the fake received it."""

    queue_manager: str
    channel: str
    conn_name: str
    channel_type: int
    transport_type: int
    cipher_spec: str
    key_repository: str
    certificate_label: str
    peer_name: str | None  # the SSLPEER the MQCD pointed at
    options: int
    user: str | None
    password: str | None
    disconnect_on_exit: bool
    max_message_length: int


@dataclass
class GetRecord:
    """One MQGET as the fake received it (options, wait, and the MQMD passed in)."""

    options: int
    wait_interval: int
    match_options: int
    version: int
    md_msg_id: bytes
    md_correl_id: bytes
    max_length: int | None


@dataclass
class _Handle:
    queue: str
    options: int
    saved_context: StoredMessage | None = None


@dataclass
class _Connection:
    number: int
    user: str | None
    broken: int | None = None  # the reason every call now fails with
    max_message_length: int = 4 * 1024 * 1024  # negotiated for the channel at MQCONNX
    unit: list[tuple[str, str, StoredMessage]] = field(default_factory=list)
    handles: dict[int, _Handle] = field(default_factory=dict)


class FakeQueueManagerServer:
    """The in-memory queue manager all fake connections talk to."""

    def __init__(
        self,
        name: str = "QM1",
        channel: str = "DEV.APP.SVRCONN",
        listeners: tuple[str, ...] = ("mq1(1414)",),
        dead_letter_queue: str = "",
        users: dict[str, str] | None = None,
        cipher_spec: str | None = None,
        certificate_subject: str | None = None,
        blocking_waits: bool = False,
        now: Callable[[], datetime] | None = None,
        channel_max_message_length: int = 4 * 1024 * 1024,
    ) -> None:
        self.name = name
        self.channel_max_message_length = channel_max_message_length
        self.blocking_waits = blocking_waits
        # Put date and time: a fixed day advancing 10 ms a put, unless a clock is given.
        self._clock = now
        self._changed = threading.Condition(threading.RLock())
        self.channel = channel
        self.listeners = listeners
        self.dead_letter_queue = dead_letter_queue
        self.users = users
        self.cipher_spec = cipher_spec
        # The distinguished name of the queue manager's certificate, which a client's SSLPEER
        # must match (None: any peer name is accepted).
        self.certificate_subject = certificate_subject
        self.available = True
        self.queues: dict[str, FakeQueue] = {}
        self.connects: list[ConnectRecord] = []
        self.gets: list[GetRecord] = []
        self.disconnects_committing_a_unit = 0
        self.on_wait: Callable[[], None] | None = None
        self._refusals: list[int] = []
        self._failures: list[tuple[str, int, bool]] = []
        self._connections: list[_Connection] = []
        self._seq = 0
        self._handles = 100
        self._now = datetime(2026, 11, 21, 14, 30, tzinfo=UTC)
        if dead_letter_queue:
            self.define_queue(dead_letter_queue)

    # -- set-up and inspection, for tests ---------------------------------------------

    def define_queue(
        self,
        name: str,
        *,
        backout_threshold: int = 0,
        backout_queue: str = "",
        max_depth: int = 5000,
        alias_of: str | None = None,
    ) -> FakeQueue:
        queue = FakeQueue(name, backout_threshold, backout_queue, max_depth, alias_of)
        self.queues[name] = queue
        return queue

    @_locked
    def put_message(self, queue: str, body: bytes, **fields: Any) -> StoredMessage:
        """Put a committed message as another application would (fields: StoredMessage's)."""
        self._seq += 1
        fields.setdefault("msg_id", self._new_msg_id())
        message = StoredMessage(body=body, seq=self._seq, **fields)
        self._base(queue).messages.append(message)
        return message

    @_locked
    def messages(self, queue: str) -> list[StoredMessage]:
        """Committed, visible messages in delivery order."""
        return list(self._base(queue).messages)

    @_locked
    def in_flight(self) -> int:
        """Messages got or put inside units of work not yet committed or backed out."""
        return sum(len(c.unit) for c in self._connections)

    @property
    def live_connections(self) -> int:
        return sum(1 for c in self._connections if c.broken is None)

    # -- failures -------------------------------------------------------------------

    def refuse_connections(self, *reasons: int) -> None:
        """The next MQCONNX calls fail with these reasons, one each, in order."""
        self._refusals.extend(reasons)

    def fail_next(self, call: str, reason: int, *, breaks_connection: bool | None = None) -> None:
        """The next `call` ("MQGET", "MQPUT", "MQCMIT", "MQBACK", "MQOPEN", "MQINQ") on any
        connection fails with `reason`; by default reason 2009 also breaks that connection."""
        breaks = reason in BREAKING_REASONS if breaks_connection is None else breaks_connection
        self._failures.append((call, reason, breaks))

    @_locked
    def break_connections(self, reason: int = CMQC.MQRC_CONNECTION_BROKEN) -> None:
        """Every live connection breaks now; the queue manager backs out their units."""
        for conn in self._connections:
            if conn.broken is None:
                self._break(conn, reason)

    @_locked
    def kill(self, qmgr: QueueManager) -> None:
        """The client holding `qmgr` died (SIGKILL): its connection ends without MQBACK or
        MQDISC, and the queue manager backs its unit of work out."""
        conn = qmgr.connection()
        if conn.broken is None:
            self._break(conn, CMQC.MQRC_CONNECTION_BROKEN)

    # -- the MQI, called by the fake pymqi classes ----------------------------------------

    @_locked
    def connect(
        self,
        name: str,
        cd: CD,
        sco: SCO,
        options: int,
        user: str | None,
        password: str | None,
        disconnect_on_exit: bool,
    ) -> _Connection:
        cd.check_packable()
        sco.check_packable()
        conn_name = _text(cd.ConnectionName)
        peer_name = _peer_name(cd)
        self.connects.append(
            ConnectRecord(
                queue_manager=name,
                channel=_text(cd.ChannelName),
                conn_name=conn_name,
                channel_type=cd.ChannelType,
                transport_type=cd.TransportType,
                cipher_spec=_text(cd.SSLCipherSpec),
                key_repository=_text(sco.KeyRepository),
                certificate_label=_text(sco.CertificateLabel),
                peer_name=peer_name,
                options=options,
                user=user,
                password=password,
                disconnect_on_exit=disconnect_on_exit,
                max_message_length=cd.MaxMsgLength,
            )
        )
        if self._refusals:
            raise _fail(self._refusals.pop(0))
        if cd.ChannelType != CMQC.MQCHT_CLNTCONN or cd.TransportType != CMQC.MQXPT_TCP:
            raise _fail(CMQC.MQRC_CD_ERROR)
        addresses = [a.strip() for a in conn_name.split(",") if a.strip()]
        if not any(a in self.listeners for a in addresses):
            raise _fail(CMQC.MQRC_HOST_NOT_AVAILABLE)
        if not self.available:
            raise _fail(CMQC.MQRC_Q_MGR_NOT_AVAILABLE)
        if _text(cd.ChannelName) != self.channel:
            raise _fail(CMQC.MQRC_UNKNOWN_CHANNEL_NAME)
        if (self.cipher_spec or "") != _text(cd.SSLCipherSpec):
            # A cipher spec mismatch ends the channel (AMQ9631/AMQ9639 in the queue manager's
            # log); the client only sees the queue manager as unavailable.
            raise _fail(CMQC.MQRC_Q_MGR_NOT_AVAILABLE)
        if self.cipher_spec and not _text(sco.KeyRepository):
            raise _fail(CMQC.MQRC_KEY_REPOSITORY_ERROR)
        if peer_name is not None:
            _check_peer(peer_name, self.certificate_subject)
        if name and name != self.name:
            raise _fail(CMQC.MQRC_Q_MGR_NAME_ERROR)
        if self.users is not None and (user is None or self.users.get(user) != password):
            raise _fail(CMQC.MQRC_NOT_AUTHORIZED)
        conn = _Connection(
            number=len(self._connections) + 1,
            user=user,
            max_message_length=min(cd.MaxMsgLength, self.channel_max_message_length),
        )
        self._connections.append(conn)
        return conn

    def call(self, conn: _Connection, call: str) -> None:
        """Every MQI call starts here: a broken connection or an injected failure."""
        if conn.broken is not None:
            raise _fail(conn.broken)
        for index, (kind, reason, breaks) in enumerate(self._failures):
            if kind == call:
                del self._failures[index]
                if breaks:
                    self._break(conn, reason)
                raise _fail(reason)

    @_locked
    def open(self, conn: _Connection, name: str, options: int) -> int:
        self.call(conn, "MQOPEN")
        if name not in self.queues:
            raise _fail(CMQC.MQRC_UNKNOWN_OBJECT_NAME)
        self._handles += 1
        conn.handles[self._handles] = _Handle(name, options)
        return self._handles

    @_locked
    def close(self, conn: _Connection, handle: int) -> None:
        if conn.broken is not None:
            raise _fail(conn.broken)
        if conn.handles.pop(handle, None) is None:
            raise _fail(CMQC.MQRC_HOBJ_ERROR)

    @_locked
    def get(
        self, conn: _Connection, handle: int, md: MD, gmo: GMO, max_length: int | None
    ) -> bytes:
        self.call(conn, "MQGET")
        md.check_packable()
        gmo.check_packable()
        opened = conn.handles[handle]
        if not opened.options & (
            CMQC.MQOO_INPUT_AS_Q_DEF | CMQC.MQOO_INPUT_SHARED | CMQC.MQOO_INPUT_EXCLUSIVE
        ):
            raise _fail(CMQC.MQRC_NOT_OPEN_FOR_INPUT)
        if max_length is not None and max_length > conn.max_message_length:
            raise _fail(CMQC.MQRC_DATA_LENGTH_ERROR)
        self.gets.append(
            GetRecord(
                options=gmo.Options,
                wait_interval=gmo.WaitInterval,
                match_options=gmo.MatchOptions,
                version=gmo.Version,
                md_msg_id=md.MsgId,
                md_correl_id=md.CorrelId,
                max_length=max_length,
            )
        )
        message = self._first_match(opened.queue, md, gmo)
        if message is None and gmo.Options & CMQC.MQGMO_WAIT and gmo.WaitInterval:
            if self.blocking_waits:
                message = self._wait_for_match(conn, opened.queue, md, gmo)
            elif self.on_wait is not None:
                self.on_wait()
                message = self._first_match(opened.queue, md, gmo)
        if message is None:
            raise _fail(CMQC.MQRC_NO_MSG_AVAILABLE)
        if max_length is None and len(message.body) > conn.max_message_length:
            # pymqi without a maximum length asks again for exactly the message's length.
            raise _fail(CMQC.MQRC_DATA_LENGTH_ERROR)
        self._describe(md, message)
        if max_length is not None and len(message.body) > max_length:
            # As pymqi does when given a maximum length: the MQMD is filled in, the message
            # stays on the queue, and the error carries the first bytes and the full length.
            raise MQMIError(
                CMQC.MQCC_WARNING,
                CMQC.MQRC_TRUNCATED_MSG_FAILED,
                message=message.body[:max_length],
                original_length=len(message.body),
            )
        queue = self._base(opened.queue)
        queue.messages.remove(message)
        if gmo.Options & CMQC.MQGMO_SYNCPOINT:
            conn.unit.append(("get", queue.name, message))
        if opened.options & CMQC.MQOO_SAVE_ALL_CONTEXT:
            opened.saved_context = message
        return message.body

    @staticmethod
    def _describe(md: MD, message: StoredMessage) -> None:
        """Fill in the MQMD as MQGET returns it."""
        md.set(
            MsgId=message.msg_id,
            CorrelId=message.correl_id,
            Format=message.format,
            Encoding=message.encoding,
            CodedCharSetId=message.ccsid,
            Persistence=message.persistence,
            Priority=message.priority,
            BackoutCount=message.backout_count,
            PutDate=message.put_date,
            PutTime=message.put_time,
            PutApplType=message.put_appl_type,
            PutApplName=message.put_appl_name,
            UserIdentifier=message.user_identifier,
        )

    @_locked
    def put(self, conn: _Connection, handle: int, body: bytes, md: MD, pmo: PMO) -> None:
        self.call(conn, "MQPUT")
        if not isinstance(body, bytes):
            raise TypeError(f"Message type is {type(body)}. Convert to bytes.")
        md.check_packable()
        pmo.check_packable()
        opened = conn.handles[handle]
        if not opened.options & CMQC.MQOO_OUTPUT:
            raise _fail(CMQC.MQRC_NOT_OPEN_FOR_OUTPUT)
        if len(body) > conn.max_message_length:
            raise _fail(CMQC.MQRC_DATA_LENGTH_ERROR)
        queue = self._base(opened.queue)
        if queue.put_inhibited:
            raise _fail(CMQC.MQRC_PUT_INHIBITED)
        if len(queue.messages) + self._uncommitted_puts(queue.name) >= queue.max_depth:
            raise _fail(CMQC.MQRC_Q_FULL)
        msg_id = md.MsgId.ljust(24, b"\0")
        if pmo.Options & CMQC.MQPMO_NEW_MSG_ID or msg_id == CMQC.MQMI_NONE:
            msg_id = self._new_msg_id()
        persistence = md.Persistence
        if persistence == CMQC.MQPER_PERSISTENCE_AS_Q_DEF:
            persistence = CMQC.MQPER_NOT_PERSISTENT  # DEFPSIST(NO), the MQ default
        if pmo.Options & CMQC.MQPMO_PASS_ALL_CONTEXT:
            if not opened.options & CMQC.MQOO_PASS_ALL_CONTEXT:
                raise _fail(CMQC.MQRC_NOT_OPEN_FOR_PASS_ALL)
            source = conn.handles.get(pmo.Context)
            if source is None or source.saved_context is None:
                raise _fail(CMQC.MQRC_CONTEXT_HANDLE_ERROR)
            context = source.saved_context
            put_date, put_time = context.put_date, context.put_time
            appl_type, appl_name = context.put_appl_type, context.put_appl_name
            user_identifier = context.user_identifier
        else:
            put_date, put_time = self._tick()
            appl_type, appl_name = CMQC.MQAT_UNIX, b"fake-pymqi".ljust(28)
            user_identifier = (conn.user or "fake").encode("ascii").ljust(12)
        self._seq += 1
        message = StoredMessage(
            body=body,
            msg_id=msg_id,
            seq=self._seq,
            correl_id=md.CorrelId.ljust(24, b"\0"),
            format=md.Format.ljust(8, b" "),
            encoding=md.Encoding,
            ccsid=md.CodedCharSetId,
            persistence=persistence,
            priority=0 if md.Priority < 0 else md.Priority,
            put_date=put_date,
            put_time=put_time,
            put_appl_type=appl_type,
            put_appl_name=appl_name,
            user_identifier=user_identifier,
        )
        if pmo.Options & CMQC.MQPMO_SYNCPOINT:
            conn.unit.append(("put", queue.name, message))
        else:
            self._insert(queue, message)
        # pymqi unpacks the MQMD MQPUT returns: the caller sees the id and context used.
        md.set(MsgId=msg_id, PutDate=put_date, PutTime=put_time, BackoutCount=0)

    @_locked
    def inquire_queue(self, conn: _Connection, handle: int, selector: int) -> int | bytes:
        self.call(conn, "MQINQ")
        opened = conn.handles[handle]
        if not opened.options & CMQC.MQOO_INQUIRE:
            raise _fail(CMQC.MQRC_NOT_OPEN_FOR_INQUIRE)
        queue = self.queues[opened.queue]
        if queue.alias_of is not None:
            raise _fail(CMQC.MQRC_SELECTOR_ERROR)  # alias queues have no BOTHRESH/BOQNAME
        if selector == CMQC.MQIA_BACKOUT_THRESHOLD:
            return queue.backout_threshold
        if selector == CMQC.MQCA_BACKOUT_REQ_Q_NAME:
            return _blank_padded(queue.backout_queue, 48)
        raise _fail(CMQC.MQRC_SELECTOR_ERROR)

    @_locked
    def inquire_qmgr(self, conn: _Connection, selector: int) -> int | bytes:
        self.call(conn, "MQINQ")
        if selector == CMQC.MQCA_DEAD_LETTER_Q_NAME:
            return _blank_padded(self.dead_letter_queue, 48)
        if selector == CMQC.MQCA_Q_MGR_NAME:
            return _blank_padded(self.name, 48)
        raise _fail(CMQC.MQRC_SELECTOR_ERROR)

    @_locked
    def commit(self, conn: _Connection) -> None:
        self.call(conn, "MQCMIT")
        self._end_unit(conn, commit=True)

    @_locked
    def backout(self, conn: _Connection) -> None:
        self.call(conn, "MQBACK")
        self._end_unit(conn, commit=False)

    @_locked
    def disconnect(self, conn: _Connection) -> None:
        if conn.broken is None:
            if conn.unit:
                # A normal MQDISC commits the unit of work (MQDISC usage notes).
                self.disconnects_committing_a_unit += 1
                self._end_unit(conn, commit=True)
            conn.broken = CMQC.MQRC_HCONN_ERROR
        conn.handles.clear()

    @_locked
    def pcf(self, conn: _Connection, command: str, args: dict[int, Any]) -> list[Any]:
        """The few PCF commands on local queues the conformance registry sends."""
        self.call(conn, command)
        for key, value in args.items():
            if isinstance(value, str):
                raise TypeError(f'In Python 3 use bytes, not str (found "{key}":"{value}")')
        name = _text(args.get(CMQC.MQCA_Q_NAME, b""))
        threshold = args.get(CMQC.MQIA_BACKOUT_THRESHOLD)
        backout_queue = args.get(CMQC.MQCA_BACKOUT_REQ_Q_NAME)
        if command == "MQCMD_CREATE_Q":
            if args.get(CMQC.MQIA_Q_TYPE) != CMQC.MQQT_LOCAL:
                raise NotImplementedError("the fake defines local queues only")
            if name in self.queues:
                raise _fail(CMQCFC.MQRCCF_OBJECT_ALREADY_EXISTS)
            self.define_queue(name)
        elif name not in self.queues:
            raise _fail(CMQC.MQRC_UNKNOWN_OBJECT_NAME)
        if command in ("MQCMD_CREATE_Q", "MQCMD_CHANGE_Q"):
            queue = self.queues[name]
            if threshold is not None:
                queue.backout_threshold = threshold
            if backout_queue is not None:
                queue.backout_queue = _text(backout_queue)
        elif command == "MQCMD_DELETE_Q":
            if self.queues[name].messages and args.get(CMQCFC.MQIACF_PURGE) != CMQCFC.MQPO_YES:
                raise _fail(2055)  # MQRC_Q_NOT_EMPTY
            del self.queues[name]
        else:
            raise NotImplementedError(f"the fake does not implement {command}")
        return []

    # -- internals -----------------------------------------------------------------

    def _base(self, name: str) -> FakeQueue:
        queue = self.queues[name]
        return self.queues[queue.alias_of] if queue.alias_of is not None else queue

    def _first_match(self, name: str, md: MD, gmo: GMO) -> StoredMessage | None:
        want_msg_id = md.MsgId.ljust(24, b"\0")
        want_correl_id = md.CorrelId.ljust(24, b"\0")
        for message in self._base(name).messages:
            if (
                gmo.MatchOptions & CMQC.MQMO_MATCH_MSG_ID
                and want_msg_id != CMQC.MQMI_NONE
                and message.msg_id != want_msg_id
            ):
                continue
            if (
                gmo.MatchOptions & CMQC.MQMO_MATCH_CORREL_ID
                and want_correl_id != CMQC.MQCI_NONE
                and message.correl_id != want_correl_id
            ):
                continue
            return message
        return None

    def _wait_for_match(
        self, conn: _Connection, name: str, md: MD, gmo: GMO
    ) -> StoredMessage | None:
        """Wait (releasing the lock) until a matching message is visible or the wait ends."""
        wait = gmo.WaitInterval / 1000 if gmo.WaitInterval >= 0 else float("inf")
        deadline = time.monotonic() + wait
        message = None
        while message is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._changed.wait(min(remaining, 3600.0))
            if conn.broken is not None:
                raise _fail(conn.broken)  # a waiting MQGET sees its connection break
            message = self._first_match(name, md, gmo)
        return message

    def _end_unit(self, conn: _Connection, commit: bool) -> None:
        unit, conn.unit = conn.unit, []
        for kind, name, message in unit:
            queue = self.queues[name]
            if kind == "put" and commit:
                self._insert(queue, message)
            elif kind == "get" and not commit:
                message.backout_count += 1
                self._insert(queue, message)

    def _insert(self, queue: FakeQueue, message: StoredMessage) -> None:
        queue.messages.append(message)
        queue.messages.sort(key=lambda m: m.seq)  # backed-out messages regain their place
        self._changed.notify_all()

    def _uncommitted_puts(self, name: str) -> int:
        return sum(
            1 for c in self._connections for kind, q, _ in c.unit if kind == "put" and q == name
        )

    def _break(self, conn: _Connection, reason: int) -> None:
        conn.broken = reason
        self._end_unit(conn, commit=False)
        self._changed.notify_all()

    def _new_msg_id(self) -> bytes:
        self._seq += 1
        return b"AMQ " + self.name.encode("ascii").ljust(12)[:12] + self._seq.to_bytes(8, "big")

    def _tick(self) -> tuple[bytes, bytes]:
        if self._clock is not None:
            now = self._clock().astimezone(UTC)
        else:
            self._now += timedelta(milliseconds=10)
            now = self._now
        hundredths = now.microsecond // 10_000
        return (
            now.strftime("%Y%m%d").encode("ascii"),
            (now.strftime("%H%M%S") + f"{hundredths:02d}").encode("ascii"),
        )


# -- the pymqi surface ------------------------------------------------------------------


class QueueManager:
    """pymqi.QueueManager: QueueManager(None) defers the connection to connect_with_options."""

    def __init__(
        self, server: FakeQueueManagerServer, name: str | None, disconnect_on_exit: bool
    ) -> None:
        self._server = server
        self._conn: _Connection | None = None
        self.disconnect_on_exit = disconnect_on_exit
        if name is not None:
            raise NotImplementedError("the fake has no local bindings; use QueueManager(None)")

    def connect_with_options(self, name: str | bytes, *args: Any, **kwargs: Any) -> None:
        if len(args) > 2:
            raise TypeError(f"Invalid options: {args}")
        if args:
            kwargs["cd"] = args[0]
        if len(args) == 2:
            kwargs["sco"] = args[1]
        user, password = kwargs.get("user"), kwargs.get("password")
        if user and password is None:
            raise ValueError("Password must not be None if user is provided")
        if user is not None and not (
            isinstance(user, str | bytes) and isinstance(password, str | bytes)
        ):
            raise ValueError("Both user and password must be instances of str or bytes")
        self._conn = self._server.connect(
            _text(name),
            kwargs.get("cd", CD()),
            kwargs.get("sco", SCO()),
            kwargs.get("opts", CMQC.MQCNO_NONE),
            _text(user) if user else None,
            _text(password) if user and password is not None else None,
            self.disconnect_on_exit,
        )

    connectWithOptions = connect_with_options  # noqa: N815  (pymqi's alias)

    def connection(self) -> _Connection:
        if self._conn is None:
            raise PYIFError("not connected")
        return self._conn

    def get_handle(self) -> int:
        return self.connection().number

    def commit(self) -> None:
        self._server.commit(self.connection())

    def backout(self) -> None:
        self._server.backout(self.connection())

    def inquire(self, attribute: int) -> int | bytes:
        return self._server.inquire_qmgr(self.connection(), attribute)

    def disconnect(self) -> None:
        conn = self.connection()
        self._conn = None
        self._server.disconnect(conn)


class Queue:
    """pymqi.Queue(qmgr, q_desc, open_opts): opened at once when open options are given."""

    def __init__(self, qmgr: QueueManager, *opts: Any) -> None:
        if len(opts) > 2:
            raise TypeError("Too many args")
        self._qmgr = qmgr
        self._handle: int | None = None
        self._name = ""
        if opts:
            q_desc = opts[0]
            self._name = _text(q_desc if isinstance(q_desc, str | bytes) else q_desc.ObjectName)
        if len(opts) == 2:
            self._handle = qmgr._server.open(qmgr.connection(), self._name, opts[1])

    def _opened(self) -> int:
        if self._handle is None:
            raise PYIFError("the fake only supports queues opened with explicit options")
        return self._handle

    def get(self, max_length: int | None = None, *opts: Any) -> bytes:
        md = opts[0] if opts and opts[0] is not None else MD()
        gmo = opts[1] if len(opts) > 1 and opts[1] is not None else GMO()
        return self._qmgr._server.get(self._qmgr.connection(), self._opened(), md, gmo, max_length)

    def put(self, msg: bytes, *opts: Any) -> None:
        md = opts[0] if opts and opts[0] is not None else MD()
        pmo = opts[1] if len(opts) > 1 and opts[1] is not None else PMO()
        self._qmgr._server.put(self._qmgr.connection(), self._opened(), msg, md, pmo)

    def inquire(self, attribute: int) -> int | bytes:
        return self._qmgr._server.inquire_queue(self._qmgr.connection(), self._opened(), attribute)

    def get_handle(self) -> int | None:
        return self._handle

    def close(self, options: int = CMQC.MQCO_NONE) -> None:
        handle = self._opened()
        self._handle = None
        self._qmgr._server.close(self._qmgr.connection(), handle)


class PCFExecute:
    """pymqi.PCFExecute(qmgr): `pcf.MQCMD_X(args)` sends PCF command X on qmgr's connection."""

    def __init__(self, name: QueueManager, **_options: Any) -> None:
        self._qmgr = name

    def __getattr__(self, command: str) -> Callable[..., list[Any]]:
        if not command.startswith("MQCMD_"):
            raise AttributeError(command)
        qmgr = self._qmgr

        def execute(args: dict[int, Any] | None = None) -> list[Any]:
            return qmgr._server.pcf(qmgr.connection(), command, args or {})

        return execute

    def disconnect(self) -> None:
        """Closes the reply queue in pymqi; the connection stays."""


class FakePymqi:
    """Stands in for the pymqi module, bound to one fake queue manager:
    `IbmMqQueue(..., pymqi_module=FakePymqi(server))`."""

    __version__ = "fake"
    CMQC = CMQC
    CMQCFC = CMQCFC
    Error = Error
    MQMIError = MQMIError
    PYIFError = PYIFError
    MD = MD
    GMO = GMO
    PMO = PMO
    OD = OD
    CD = CD
    SCO = SCO
    Queue = Queue
    PCFExecute = PCFExecute

    def __init__(self, server: FakeQueueManagerServer) -> None:
        self.server = server

    def QueueManager(  # noqa: N802  (pymqi's class name)
        self, name: str | None = "", disconnect_on_exit: bool = True
    ) -> QueueManager:
        return QueueManager(self.server, name, disconnect_on_exit)


# -- message formats for tests ----------------------------------------------------------


def build_rfh2(
    folders: list[str],
    *,
    next_format: bytes = CMQC.MQFMT_NONE,
    next_encoding: int = CMQC.MQENC_NATIVE,
    next_ccsid: int = 1208,
    big_endian: bool = False,
    name_value_ccsid: int = 1208,
) -> bytes:
    """An MQRFH2 version 2 header carrying `folders`, integers in the byte order the MQMD's
    Encoding announces (MQENC_INTEGER_NORMAL = big-endian), each folder padded with blanks to
    a multiple of four bytes."""
    order = ">" if big_endian else "<"
    codec = "utf-16-be" if name_value_ccsid == 1200 and big_endian else "utf-8"
    if name_value_ccsid == 1200 and not big_endian:
        codec = "utf-16-le"
    parts = []
    for folder in folders:
        data = folder.encode(codec)
        data += b" " * (-len(data) % 4)
        parts.append(struct.pack(order + "i", len(data)) + data)
    length = CMQC.MQRFH_STRUC_LENGTH_FIXED_2 + sum(len(p) for p in parts)
    fixed = (
        CMQC.MQRFH_STRUC_ID
        + struct.pack(order + "4i", CMQC.MQRFH_VERSION_2, length, next_encoding, next_ccsid)
        + next_format
        + struct.pack(order + "2i", 0, name_value_ccsid)
    )
    return fixed + b"".join(parts)


_DLH_LAYOUT = struct.Struct("<4sii48s48sii8si28s8s8s")


def read_dead_letter_header(data: bytes) -> dict[str, Any]:
    """Split an MQDLH (version 1, little-endian as on x86) off a dead-lettered message."""
    fields = _DLH_LAYOUT.unpack_from(data)
    names = (
        "StrucId",
        "Version",
        "Reason",
        "DestQName",
        "DestQMgrName",
        "Encoding",
        "CodedCharSetId",
        "Format",
        "PutApplType",
        "PutApplName",
        "PutDate",
        "PutTime",
    )
    header = dict(zip(names, fields, strict=True))
    header["DestQName"] = _text(header["DestQName"])
    header["DestQMgrName"] = _text(header["DestQMgrName"])
    header["data"] = data[_DLH_LAYOUT.size :]
    return header
