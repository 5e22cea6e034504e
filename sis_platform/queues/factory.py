"""Build a queue source: from the settings' record of it (`open_configured`, what sis-live and
the code location's resources open: the one mapping from settings to a source's constructor),
or from a URL an operator typed (`open_source`, e.g. `sis-feed --to`):

    embedded:///abs/dir[?queue=NAME&backout_threshold=N&backout_queue=NAME]
    stomp://[user[:password]@]host[:port]/queue/NAME[?selector=..&prefetch=N
        &backout_threshold=N&backout_queue=NAME&redelivery_counts=/abs/file.db
        &heartbeats=OUT,IN&vhost=..&tls=true|false&ca_file=/abs/ca.pem
        &cert_file=/abs/client.pem&key_file=/abs/client.key
        &allow_plaintext_credentials=true]
    ibmmq://[user@]host[:port][,host2[:port2]...]/QMGR/QUEUE?channel=CHANNEL
        [&cipher_spec=..&key_repository=..&certificate_label=..&ssl_peer_name=..]
    ibmmq:                      (everything from the settings' IBM MQ record, `ibmmq=`)

`backout_threshold` defaults to DEFAULT_BACKOUT_THRESHOLD (10) on every source; 0 turns it off.
A STOMP broker not on this host is reached over TLS unless `tls=false`, and a password is not
sent to it in clear without `allow_plaintext_credentials=true` (queues/stomp/source.py); a client
key's password is the `key_password` keyword, never part of a URL.

`open_source` reads nothing from the environment: it is given everything. A login comes from
the `user`/`password` keywords, else the URL, else `fallback` (per field; IBM MQ takes a
fallback password only for a user). `open_source_from_environment` is the entry point for a URL
an operator typed (`sis-feed --to`): its fallback is SIS_STOMP_USER / SIS_STOMP_PASSWORD, or
SIS_IBMMQ_PASSWORD, and `ibmmq:` gets the SIS_IBMMQ_* settings, all through
sis_platform/settings/. A password may be given in the URL, but the intended places are the
`password` keyword (a resource field set from an EnvVar) and the environment. Error messages
never include one. Extra keyword options go to the source's constructor (e.g.
`connect_attempts=1`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, unquote, urlsplit

from sis_platform import settings
from sis_platform.queues.base import QueueSource
from sis_platform.queues.embedded import EmbeddedQueue
from sis_platform.queues.ibmmq import IbmMqQueue
from sis_platform.queues.stomp import StompQueue
from sis_platform.settings import (
    DEFAULT_STOMP_PORT,
    Credentials,
    EmbeddedSourceSettings,
    IbmMqSourceSettings,
    SourceSettings,
    StompSourceSettings,
)

IBMMQ_DEFAULT_PORT = 1414  # the MQ listener's own default


class _Given(NamedTuple):
    """What the caller gave besides the URL: fallbacks, and the constructor's keywords."""

    fallback: Credentials
    ibmmq: IbmMqSourceSettings | None
    options: dict[str, Any]


def open_source(
    url: str,
    *,
    fallback: Credentials | None = None,
    ibmmq: IbmMqSourceSettings | None = None,
    **options: Any,
) -> QueueSource:
    """The queue source `url` names (constructed only: nothing connects until asked).
    `fallback`: the login for a URL that names none; `ibmmq`: the settings an `ibmmq:` URL
    stands for."""
    scheme = _scheme(url)
    builder = _BUILDERS.get(scheme)
    if builder is None:
        raise ValueError(
            f"unsupported queue URL {_redact(url)!r}: scheme must be one of"
            f" {', '.join(sorted(_BUILDERS))}"
        )
    return builder(url, _Given(fallback or Credentials(), ibmmq, options))


def open_source_from_environment(
    url: str, env: Mapping[str, str] | None = None, **options: Any
) -> QueueSource:
    """`open_source` for a URL an operator gave, with the environment's login as the fallback
    (settings.url_credentials) and, for `ibmmq:`, the SIS_IBMMQ_* settings. A configuration
    error is a ValueError naming the variables."""
    ibmmq = settings.ibmmq_settings(env) if _names_no_queue_manager(url) else None
    return open_source(
        url, fallback=settings.url_credentials(_scheme(url), env), ibmmq=ibmmq, **options
    )


def open_configured(
    source: SourceSettings,
    *,
    password: str | None = None,
    key_password: str | None = None,
    **options: Any,
) -> QueueSource:
    """The queue a settings record describes: the one mapping from a source's settings
    (sis_platform/settings/records.py) to its constructor, for sis-live and the code location's
    resources alike. `password` and `key_password` are the secrets the record only says are
    set; `options` go to the constructor as they are (e.g. `connect_attempts=1`)."""
    threshold, backout_queue = source.backout.threshold, source.backout.queue
    if isinstance(source, EmbeddedSourceSettings):
        return EmbeddedQueue(
            Path(source.path),
            queue=source.queue,
            backout_threshold=threshold,
            backout_queue=backout_queue,
            **options,
        )
    if isinstance(source, StompSourceSettings):
        return StompQueue(
            source.host,
            source.port,
            source.destination,
            user=source.user,
            password=password,
            heartbeats=source.heartbeats,
            selector=source.selector,
            prefetch=source.prefetch,
            redelivery_counts=Path(source.redelivery_counts) if source.redelivery_counts else None,
            vhost=source.vhost,
            tls=source.tls,
            ca_file=source.ca_file,
            cert_file=source.cert_file,
            key_file=source.key_file,
            key_password=key_password,
            allow_plaintext_credentials=source.allow_plaintext_credentials,
            backout_threshold=threshold,
            backout_queue=backout_queue,
            **options,
        )
    return IbmMqQueue(
        queue_manager=source.queue_manager,
        channel=source.channel,
        conn_name=source.conn_name,
        queue=source.queue,
        user=source.user,
        password=password if source.user else None,
        cipher_spec=source.cipher_spec,
        key_repository=source.key_repository,
        certificate_label=source.certificate_label,
        ssl_peer_name=source.ssl_peer_name,
        client_reconnect=source.client_reconnect,
        max_get_bytes=source.max_get_bytes,
        backout_threshold=threshold,
        backout_queue=backout_queue,
        **options,
    )


def open_configured_from_environment(source: SourceSettings, **options: Any) -> QueueSource:
    """`open_configured` with the secrets taken from the environment (sis-live's way): the
    source's password (SIS_STOMP_PASSWORD, SIS_IBMMQ_PASSWORD) and a STOMP client key's
    (SIS_STOMP_KEY_PASSWORD)."""
    if isinstance(source, EmbeddedSourceSettings):
        return open_configured(source, **options)
    if isinstance(source, StompSourceSettings):
        key_password = (
            settings.secret("SIS_STOMP_KEY_PASSWORD") if source.has_key_password else None
        )
        return open_configured(
            source,
            password=settings.secret("SIS_STOMP_PASSWORD"),
            key_password=key_password,
            **options,
        )
    return open_configured(source, password=settings.secret("SIS_IBMMQ_PASSWORD"), **options)


def _scheme(url: str) -> str:
    return url.split(":", 1)[0].lower() if ":" in url else ""


def _names_no_queue_manager(url: str) -> bool:
    """`ibmmq:` or `ibmmq://`: the whole IBM MQ configuration is in the settings."""
    if _scheme(url) != "ibmmq":
        return False
    parts = urlsplit(url)
    return not parts.netloc and not parts.path.strip("/")


def _redact(url: str) -> str:
    """The URL with any password replaced, for error messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def _query(url: str, query: str, allowed: Mapping[str, Callable[[str], Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, raw in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        convert = allowed.get(key)
        if convert is None:
            raise ValueError(
                f"unknown parameter {key!r} in {_redact(url)!r}; known: {', '.join(allowed)}"
            )
        if key in result:
            raise ValueError(f"parameter {key!r} given twice in {_redact(url)!r}")
        try:
            result[key] = convert(raw)
        except ValueError as e:
            raise ValueError(f"bad value for {key!r} in {_redact(url)!r}: {e}") from e
    return result


def _non_negative_int(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError(f"must be >= 0, got {value}")
    return value


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError(f"must be >= 1, got {value}")
    return value


def _name(raw: str) -> str:
    if not raw:
        raise ValueError("must not be empty")
    return raw


def _file(raw: str) -> Path:
    if not raw.startswith("/"):
        raise ValueError(f"must be an absolute path, got {raw!r}")
    return Path(raw)


def _flag(raw: str) -> bool:
    if raw not in ("true", "false"):
        raise ValueError(f"expected true or false, got {raw!r}")
    return raw == "true"


def _heartbeats(raw: str) -> tuple[int, int]:
    parts = raw.split(",")
    if len(parts) != 2:
        raise ValueError("expected OUT_MS,IN_MS")
    out_ms, in_ms = (_non_negative_int(p.strip()) for p in parts)
    return out_ms, in_ms


def _embedded(url: str, given: _Given) -> QueueSource:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise ValueError(
            f"embedded URL {url!r} names a host; use embedded:///absolute/folder (three slashes)"
        )
    path = unquote(parts.path)
    if not path or not path.startswith("/"):
        raise ValueError(f"embedded URL {url!r} needs an absolute folder: embedded:///abs/dir")
    if parts.fragment:
        raise ValueError(f"embedded URL {url!r} must not have a fragment")
    params = _query(
        url,
        parts.query,
        {"queue": _name, "backout_threshold": _non_negative_int, "backout_queue": _name},
    )
    return EmbeddedQueue(Path(path), **{**params, **given.options})


def _stomp(url: str, given: _Given) -> QueueSource:
    options = dict(given.options)
    try:
        parts = urlsplit(url)
        port = parts.port or DEFAULT_STOMP_PORT
    except ValueError as e:
        raise ValueError(f"bad STOMP URL {_redact(url)!r}: {e}") from e
    if not parts.hostname:
        raise ValueError(f"STOMP URL {_redact(url)!r} needs a host: stomp://host:port/queue/NAME")
    path = unquote(parts.path)
    prefix = "/queue/"
    if not path.startswith(prefix) or len(path) == len(prefix) or "/" in path[len(prefix) :]:
        raise ValueError(
            f"STOMP URL {_redact(url)!r} must name a queue: stomp://host:port/queue/NAME"
        )
    params = _query(
        url,
        parts.query,
        {
            "selector": _name,
            "prefetch": _positive_int,
            "backout_threshold": _non_negative_int,
            "backout_queue": _name,
            "redelivery_counts": _file,
            "heartbeats": _heartbeats,
            "vhost": _name,
            "tls": _flag,
            "ca_file": _file,
            "cert_file": _file,
            "key_file": _file,
            "allow_plaintext_credentials": _flag,
        },
    )
    user = options.pop("user", None) or (unquote(parts.username) if parts.username else None)
    password = options.pop("password", None)
    if password is None and parts.password is not None:
        password = unquote(parts.password)
    user = user or given.fallback.user
    if password is None:
        password = given.fallback.password
    return StompQueue(
        parts.hostname,
        port,
        path,
        user=user,
        password=password,
        **{**params, **options},
    )


def _ibmmq(url: str, given: _Given) -> QueueSource:
    options = dict(given.options)
    if _names_no_queue_manager(url):
        return _ibmmq_from_settings(given)
    parts = urlsplit(url)
    # The netloc may list several hosts (a multi-instance queue manager), which urlsplit's
    # hostname/port cannot parse, so it is split by hand.
    netloc = parts.netloc
    userinfo, _, hosts = netloc.rpartition("@")
    user, has_password, url_password = userinfo.partition(":")
    conn_names = []
    for host_port in hosts.split(","):
        host, _, port = host_port.strip().partition(":")
        if not host:
            raise ValueError(f"IBM MQ URL {_redact(url)!r} has an empty host")
        try:
            port_number = int(port) if port else IBMMQ_DEFAULT_PORT
        except ValueError as e:
            raise ValueError(f"IBM MQ URL {_redact(url)!r} has a bad port {port!r}") from e
        conn_names.append(f"{host}({port_number})")
    segments = [unquote(s) for s in parts.path.split("/") if s]
    if len(segments) != 2:
        raise ValueError(
            f"IBM MQ URL {_redact(url)!r} must be ibmmq://host:port/QMGR/QUEUE?channel=CHANNEL"
        )
    queue_manager, queue = segments
    params = _query(
        url,
        parts.query,
        {
            "channel": _name,
            "cipher_spec": _name,
            "key_repository": _name,
            "certificate_label": _name,
            "ssl_peer_name": _name,
        },
    )
    if "channel" not in params:
        raise ValueError(f"IBM MQ URL {_redact(url)!r} needs ?channel=CHANNEL")
    user_value = options.pop("user", None) or (unquote(user) if user else None)
    password = options.pop("password", None)
    if password is None and has_password:
        password = unquote(url_password)
    if password is None and user_value:
        password = given.fallback.password
    return IbmMqQueue(
        queue_manager=queue_manager,
        conn_name=",".join(conn_names),
        queue=queue,
        user=user_value,
        password=password,
        **{**params, **options},
    )


def _ibmmq_from_settings(given: _Given) -> QueueSource:
    """`ibmmq:`: the queue the settings' IBM MQ record describes, opened as sis-live opens it
    (`open_configured`); a `user` keyword replaces the record's."""
    if given.ibmmq is None:
        raise ValueError(
            "the queue URL 'ibmmq:' stands for the SIS_IBMMQ_* settings, and none were given"
        )
    options = dict(given.options)
    source = given.ibmmq
    if user := options.pop("user", None):
        source = replace(source, user=user)
    password = options.pop("password", None)
    if password is None:
        password = given.fallback.password
    return open_configured(source, password=password, **options)


_BUILDERS: dict[str, Callable[[str, _Given], QueueSource]] = {
    "embedded": _embedded,
    "stomp": _stomp,
    "ibmmq": _ibmmq,
}
