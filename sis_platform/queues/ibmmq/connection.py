"""One MQ client connection: the channel definition (MQCD, TLS in the MQSCO, connection
authentication, the MQCNO reconnect option), MQCONNX, the queue handles it opens, and the
queue's backout attributes (BOTHRESH/BOQNAME) and the queue manager's dead-letter queue.

Reconnecting is the source's (IbmMqQueue.open_connection); getting under syncpoint is the
session's; moving a message aside is moves.py's. This class is the MQI calls they share.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from sis_platform.queues.ibmmq.mqi import MQRC_SELECTOR_ERROR, Opening, mq_name, reason_of

if TYPE_CHECKING:
    from sis_platform.queues.ibmmq.source import IbmMqQueue

log = logging.getLogger(__name__)

# MQ's largest message length (100 MiB). Offered in the MQCD so the channel's limit is the
# server-connection channel's MAXMSGL; the MQCD default (4 MiB) would cap it below that.
_MQ_MAX_MESSAGE_LENGTH = 104_857_600


class BackoutAttributes(NamedTuple):
    """A queue's BOTHRESH and BOQNAME; (0, "") where it has none."""

    threshold: int
    queue: str


class ChannelDefinition(NamedTuple):
    """What MQCONNX is given besides the queue manager name."""

    cd: Any  # pymqi.CD: channel, connection name, TLS cipher spec
    sco: Any  # pymqi.SCO: key repository and certificate label
    options: int  # MQCNO reconnect option
    credentials: dict[str, str]  # user and password for the MQCSP, or empty
    # The SSLPEER bytes the MQCD's SSLPeerNamePtr points at (None: no peer name). Both
    # bindings hand the packed MQCD to MQCONNX as it is, and the client copies the name
    # there, so this buffer must stay referenced until MQCONNX returns.
    peer_name: ctypes.Array[ctypes.c_char] | None


def channel_definition(source: IbmMqQueue) -> ChannelDefinition:
    """The client channel, TLS and authentication settings of `source` as pymqi structures;
    keep the result referenced until MQCONNX has returned (`peer_name`)."""
    pymqi = source.pymqi
    cmqc = pymqi.CMQC
    cd = pymqi.CD()
    cd.ChannelName = source.channel.encode("ascii")
    cd.ConnectionName = source.conn_name.encode("ascii")
    cd.ChannelType = cmqc.MQCHT_CLNTCONN
    cd.TransportType = cmqc.MQXPT_TCP
    cd.MaxMsgLength = _MQ_MAX_MESSAGE_LENGTH
    sco = pymqi.SCO()
    if source.cipher_spec:
        cd.SSLCipherSpec = source.cipher_spec.encode("ascii")
    if source.key_repository:
        sco.KeyRepository = source.key_repository.encode("utf-8")
    if source.certificate_label:
        sco.CertificateLabel = source.certificate_label.encode("utf-8")
    peer_name = None
    if source.ssl_peer_name:
        # Neither binding takes the peer name as a field of its own: the MQCD holds a pointer
        # and a length, which point at this buffer.
        encoded = source.ssl_peer_name.encode("utf-8")
        peer_name = ctypes.create_string_buffer(encoded, len(encoded))
        cd.SSLPeerNamePtr = ctypes.addressof(peer_name)
        cd.SSLPeerNameLength = len(encoded)
    options = {
        "disabled": cmqc.MQCNO_RECONNECT_DISABLED,
        "as_def": cmqc.MQCNO_RECONNECT_AS_DEF,
        "any": cmqc.MQCNO_RECONNECT,
        "qmgr": cmqc.MQCNO_RECONNECT_Q_MGR,
    }[source.client_reconnect]
    password = source.reveal_password()
    credentials: dict[str, str] = {}
    if source.user and password is not None:
        credentials = {"user": source.user, "password": password}
        _warn_if_in_clear(source)
    return ChannelDefinition(cd, sco, options, credentials, peer_name)


# The channels already warned about (a source connects again and again; one warning each).
_warned_in_clear: set[tuple[str, str, str]] = set()


def _warn_if_in_clear(source: IbmMqQueue) -> None:
    """A password over a channel without TLS crosses the network readable by anyone on the
    path: allowed (a queue manager on the same host, or a network the operator trusts), but
    said loudly, once per channel."""
    key = (source.conn_name, source.channel, source.user or "")
    if source.cipher_spec or key in _warned_in_clear:
        return
    _warned_in_clear.add(key)
    log.warning(
        "IBM MQ channel %s to %s: user %s's password is sent without TLS (no "
        "SIS_IBMMQ_CIPHER_SPEC), readable on the network: set a cipher spec and a key "
        "repository (docs/ibmmq.md, TLS)",
        source.channel,
        source.conn_name,
        source.user,
    )


class Connection:
    """One client connection (MQCONNX) with the source's queue open.

    For input the queue is opened for shared input, inquire (BOTHRESH/BOQNAME) and saving
    context (so a moved message keeps its original identity and origin context).
    """

    def __init__(self, source: IbmMqQueue, opening: Opening) -> None:
        self.source = source
        pymqi = source.pymqi
        self.pymqi = pymqi
        self.cmqc = cmqc = pymqi.CMQC
        self.backout_threshold = 0
        self.backout_queue = ""
        self.dead_letter_queue = ""
        self._outputs: dict[str, Any] = {}
        self.queue: Any = None

        channel = channel_definition(source)
        # disconnect_on_exit=False: pymqi would otherwise MQDISC from __del__, and MQDISC
        # commits an open unit of work; a session dropped without close() must not commit.
        self.qmgr = pymqi.QueueManager(None, disconnect_on_exit=False)
        try:
            self.qmgr.connect_with_options(
                source.queue_manager,
                cd=channel.cd,
                sco=channel.sco,
                opts=channel.options,
                **channel.credentials,
            )
        except pymqi.MQMIError as exc:
            if source.is_transient(exc):
                raise
            raise source.error("MQCONNX", f"queue manager {source.queue_manager}", exc) from exc

        try:
            if opening == "input":
                self._open_input()
            elif opening == "output":
                self.queue = self._open(
                    source.queue, cmqc.MQOO_OUTPUT | cmqc.MQOO_FAIL_IF_QUIESCING
                )
        except BaseException:
            self.close(backout=False)
            raise

    def _open(self, name: str, options: int) -> Any:
        try:
            return self.pymqi.Queue(
                self.qmgr, self.pymqi.OD(ObjectName=name.encode("ascii")), options
            )
        except self.pymqi.MQMIError as exc:
            if self.source.is_transient(exc):
                raise
            raise self.source.error("MQOPEN", f"queue {name}", exc) from exc

    def _open_input(self) -> None:
        cmqc, source = self.cmqc, self.source
        self.queue = self._open(
            source.queue,
            cmqc.MQOO_INPUT_AS_Q_DEF
            | cmqc.MQOO_INQUIRE
            | cmqc.MQOO_SAVE_ALL_CONTEXT
            | cmqc.MQOO_FAIL_IF_QUIESCING,
        )
        attributes = self._inquire_backout_attributes()
        if attributes.threshold > 0:
            self.backout_threshold, origin = attributes.threshold, "BOTHRESH"
        else:
            self.backout_threshold = source.backout_threshold
            origin = "the platform's threshold: the queue has none"
        self.backout_queue = attributes.queue or source.backout_queue or ""
        # The dead-letter queue is the fallback when there is no backout queue or it refuses a
        # message; over-size messages need it too, whatever the threshold.
        try:
            self.dead_letter_queue = mq_name(self.qmgr.inquire(cmqc.MQCA_DEAD_LETTER_Q_NAME))
        except self.pymqi.MQMIError as exc:
            if source.is_transient(exc):
                raise
            log.warning(
                "%s: cannot inquire the dead-letter queue name: %s (%d)",
                source.description,
                source.reason_name(reason_of(exc)),
                reason_of(exc),
            )
        self._log_backout_policy(origin)

    def _log_backout_policy(self, origin: str) -> None:
        """Say once per connection where messages over the backout threshold will go."""
        description = self.source.description
        if self.backout_threshold <= 0:
            log.warning(
                "%s: no backout threshold (BOTHRESH 0 and SIS_BACKOUT_THRESHOLD 0): a message "
                "that kills its consumer before it is landed comes back for ever",
                description,
            )
        elif self.backout_queue:
            log.info(
                "%s: messages backed out %d times (%s) are moved to %s",
                description,
                self.backout_threshold,
                origin,
                self.backout_queue,
            )
        elif self.dead_letter_queue:
            log.warning(
                "%s: backout threshold %d (%s) but BOQNAME is blank: such messages go to the "
                "dead-letter queue %s; define BOQNAME on the queue",
                description,
                self.backout_threshold,
                origin,
                self.dead_letter_queue,
            )
        else:
            log.error(
                "%s: backout threshold %d (%s) but neither BOQNAME nor a dead-letter queue is "
                "defined: messages over the threshold keep being delivered and the platform's "
                "redelivery limit must dead-letter them; define BOQNAME on the queue",
                description,
                self.backout_threshold,
                origin,
            )

    def _inquire_backout_attributes(self) -> BackoutAttributes:
        """The queue's BOTHRESH and BOQNAME; (0, "") where it has none."""
        cmqc, source = self.cmqc, self.source
        try:
            threshold = int(self.queue.inquire(cmqc.MQIA_BACKOUT_THRESHOLD))
            backout_queue = mq_name(self.queue.inquire(cmqc.MQCA_BACKOUT_REQ_Q_NAME))
        except self.pymqi.MQMIError as exc:
            if source.is_transient(exc):
                raise
            if reason_of(exc) != MQRC_SELECTOR_ERROR:
                raise source.error("MQINQ", f"queue {source.queue}", exc) from exc
            # 2067: the queue has no such attributes (an alias or remote queue definition).
            log.warning(
                "%s: the queue has no BOTHRESH/BOQNAME (alias or remote definition?): the "
                "platform's backout threshold applies",
                source.description,
            )
            return BackoutAttributes(0, "")
        return BackoutAttributes(max(0, threshold), backout_queue)

    def output(self, name: str) -> Any:
        """A handle on queue `name` opened for output passing all context, opened once per
        connection (the backout and dead-letter queues)."""
        queue = self._outputs.get(name)
        if queue is None:
            cmqc = self.cmqc
            queue = self._open(
                name,
                cmqc.MQOO_OUTPUT | cmqc.MQOO_PASS_ALL_CONTEXT | cmqc.MQOO_FAIL_IF_QUIESCING,
            )
            self._outputs[name] = queue
        return queue

    def put(self, body: bytes, msg_id: bytes) -> bytes:
        """Put a persistent message with MsgId `msg_id` outside syncpoint; its MsgId."""
        cmqc = self.cmqc
        md = self.pymqi.MD()
        md.MsgId = msg_id
        md.Format = cmqc.MQFMT_NONE  # a JMS BytesMessage: plain bytes, no MQRFH2
        md.Persistence = cmqc.MQPER_PERSISTENT  # a feed message must survive a restart
        pmo = self.pymqi.PMO()
        # The id is always chosen here (never MQPMO_NEW_MSG_ID), so a put retried after a
        # broken connection repeats the same id and the platform can recognise the duplicate.
        pmo.Options = cmqc.MQPMO_NO_SYNCPOINT | cmqc.MQPMO_FAIL_IF_QUIESCING
        self.queue.put(body, md, pmo)
        return bytes(md.MsgId)

    def commit(self) -> None:
        self.qmgr.commit()

    def backout(self) -> None:
        self.qmgr.backout()

    def close(self, backout: bool) -> None:
        """Best effort: the connection may already be broken, and then the queue manager
        has backed the unit out itself."""
        handles = [*self._outputs.values(), self.queue]
        self._outputs.clear()
        if backout:
            # MQDISC commits an open unit of work (MQDISC usage notes), so back out first.
            try:
                self.qmgr.backout()
            except self.pymqi.MQMIError as exc:
                if not self.source.is_transient(exc):
                    # The unit is still open: MQDISC now would commit it. Leave the
                    # connection to end with the process, which backs the unit out.
                    log.error(
                        "%s: MQBACK failed (%s, %d); not disconnecting, so as not to commit",
                        self.source.description,
                        self.source.reason_name(reason_of(exc)),
                        reason_of(exc),
                    )
                    return
        for queue in handles:
            if queue is not None:
                self._quietly("MQCLOSE", queue.close)
        self._quietly("MQDISC", self.qmgr.disconnect)

    def _quietly(self, call: str, action: Callable[[], object]) -> None:
        try:
            action()
        except self.pymqi.Error as exc:
            log.debug("%s: %s during cleanup failed: %s", self.source.description, call, exc)
