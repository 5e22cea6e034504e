"""Where a serving store is: its URL parsed and checked, with no connection made.

`sqlite:///relative/path.db` or `sqlite:////absolute/path.db` (as SQLAlchemy reads them: the
path is what follows the third slash), or `postgresql://user@host:port/dbname[?params]` (a libpq
URL; the host may be a Unix socket folder, `%2F`-encoded or as `?host=/folder`). A password in
the URL is refused: it comes from SIS_SERVING_PASSWORD. A PostgreSQL host that is neither
loopback nor a socket gets `sslmode=verify-full` unless the URL names an sslmode.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

PASSWORD_VARIABLE = "SIS_SERVING_PASSWORD"
SQLITE_PREFIX = "sqlite:///"
POSTGRES_SCHEMES = ("postgresql", "postgres")


@dataclass(frozen=True)
class SqliteLocation:
    path: Path


@dataclass(frozen=True)
class PostgresLocation:
    url: str  # the libpq URL to connect with (no password; sslmode added where needed)
    shown: str  # the URL as given, for messages


def shown_url(url: str) -> str:
    """`url` with any password (in the login or a `password=` parameter) masked, for messages
    and logs."""
    try:
        parts = urlsplit(url)
        has_password = parts.password is not None
    except ValueError:
        return "(a malformed URL)"
    if has_password:
        login, _, host = parts.netloc.rpartition("@")
        parts = parts._replace(netloc=f"{login.partition(':')[0]}:***@{host}")
    if parts.query:
        params = [
            (k, "***" if k == "password" else v)
            for k, v in parse_qsl(parts.query, keep_blank_values=True)
        ]
        parts = parts._replace(query=urlencode(params, quote_via=quote, safe="/*"))
    return urlunsplit(parts)


def parse_location(url: str) -> SqliteLocation | PostgresLocation:
    """The store `url` names; ValueError (naming the URL, password-free) if it is not one."""
    scheme = url.partition(":")[0].lower()
    if scheme == "sqlite":
        return _sqlite(url)
    if scheme in POSTGRES_SCHEMES:
        return _postgres(url)
    raise ValueError(
        f"serving store URL {shown_url(url)!r}: unknown scheme {scheme!r}; expected "
        "sqlite:///<path> or postgresql://user@host:port/dbname"
    )


def _sqlite(url: str) -> SqliteLocation:
    if not url.startswith(SQLITE_PREFIX) or "?" in url or "#" in url:
        raise ValueError(
            f"serving store URL {url!r}: expected sqlite:///relative/path or "
            "sqlite:////absolute/path (no host, no parameters)"
        )
    path = unquote(url[len(SQLITE_PREFIX) :])
    if not path or path.endswith("/"):
        raise ValueError(f"serving store URL {url!r}: names no database file")
    return SqliteLocation(Path(path))


def _postgres(url: str) -> PostgresLocation:
    shown = shown_url(url)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (parsing the port raises on a malformed one)
    except ValueError as exc:
        raise ValueError(f"serving store URL {shown!r}: {exc}") from None
    if parts.password is not None:
        raise ValueError(
            f"serving store URL {shown!r} holds a password: leave it out and set "
            f"{PASSWORD_VARIABLE} instead"
        )
    if not parts.path.strip("/") or parts.fragment:
        raise ValueError(
            f"serving store URL {shown!r}: expected postgresql://user@host:port/dbname"
        )
    params = dict(parse_qsl(parts.query, keep_blank_values=True))
    if "password" in params:
        raise ValueError(
            f"serving store URL {shown!r} holds a password parameter: set "
            f"{PASSWORD_VARIABLE} instead"
        )
    if "sslmode" not in params and not all(_is_local(h) for h in _hosts(parts.netloc, params)):
        params["sslmode"] = "verify-full"
    query = urlencode(params, quote_via=quote, safe="/")
    return PostgresLocation(urlunsplit(parts._replace(query=query)), shown)


def _hosts(netloc: str, params: dict[str, str]) -> list[str]:
    """The hosts libpq would connect to: `?host=` over the URL's (several, comma-separated)."""
    if "host" in params:
        return params["host"].split(",")
    hostport = netloc.rpartition("@")[2]
    hosts = []
    for entry in hostport.split(","):
        host = unquote(entry)
        if host.startswith("["):  # [IPv6]:port
            host = host[1 : host.find("]")]
        elif not host.startswith("/"):
            host = host.rpartition(":")[0] if ":" in host else host
        hosts.append(host)
    return hosts


def _is_local(host: str) -> bool:
    """No host (libpq's default socket), a Unix socket folder, or a loopback name or address."""
    if not host or host.startswith("/") or host.startswith("@") or host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
