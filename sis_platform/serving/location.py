"""Where a serving store is: its URL parsed and checked, with no connection made.

`sqlite:///relative/path.db` or `sqlite:////absolute/path.db` (as SQLAlchemy reads them: the
path is what follows the third slash), or `postgresql://user@host:port/dbname[?params]` (a libpq
URL; the host may be a Unix socket folder, `%2F`-encoded or as `?host=/folder`). A password in
the URL is refused: it comes from SIS_SERVING_PASSWORD. A connection that can reach a server
other than this host's gets `sslmode=verify-full` unless the URL names an sslmode. Which server
that is, is decided as libpq decides it, not on the URL's text: `hostaddr` (where libpq connects;
the host name then only checks the certificate) over the host list, the URL's over PGHOSTADDR
and PGHOST, and a service (`service=` or PGSERVICE, whose file may name any host) counts as
another host.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from sis_platform.settings.environment import libpq_host_environment

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
    params = parse_qsl(parts.query, keep_blank_values=True)
    if not has_password and all(k != "password" for k, _ in params):
        # As given: urlunsplit would drop the empty host of sqlite:///path (sqlite:/path).
        return url
    if has_password:
        login, _, host = parts.netloc.rpartition("@")
        parts = parts._replace(netloc=f"{login.partition(':')[0]}:***@{host}")
    if params:
        masked = [(k, "***" if k == "password" else v) for k, v in params]
        parts = parts._replace(query=urlencode(masked, quote_via=quote, safe="/*"))
    return urlunsplit(parts)


def parse_location(
    url: str, libpq_env: Mapping[str, str] | None = None
) -> SqliteLocation | PostgresLocation:
    """The store `url` names; ValueError (naming the URL, password-free) if it is not one.
    `libpq_env`: libpq's host variables (PGHOST, PGHOSTADDR, PGSERVICE) as the connection will
    see them; by default this process's."""
    scheme = url.partition(":")[0].lower()
    if scheme == "sqlite":
        return _sqlite(url)
    if scheme in POSTGRES_SCHEMES:
        return _postgres(url, libpq_host_environment(libpq_env))
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


def _postgres(url: str, libpq_env: Mapping[str, str]) -> PostgresLocation:
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
    if "sslmode" not in params and not _reaches_this_host_only(parts.netloc, params, libpq_env):
        params["sslmode"] = "verify-full"
    query = urlencode(params, quote_via=quote, safe="/")
    return PostgresLocation(urlunsplit(parts._replace(query=query)), shown)


def _reaches_this_host_only(
    netloc: str, params: dict[str, str], libpq_env: Mapping[str, str]
) -> bool:
    """Whether every server libpq would try is on this host: for each entry of the host list,
    its `hostaddr` if it has one (a numeric address, where libpq connects), else its host."""
    if "service" in params or "PGSERVICE" in libpq_env:
        return False
    hosts = _hosts(netloc, params, libpq_env)
    hostaddr = params["hostaddr"] if "hostaddr" in params else libpq_env.get("PGHOSTADDR", "")
    addresses = hostaddr.split(",") if hostaddr else []
    for index in range(max(len(hosts), len(addresses))):
        address = addresses[index] if index < len(addresses) else ""
        host = hosts[index] if index < len(hosts) else ""
        if not (_is_loopback_address(address) if address else _is_local(host)):
            return False
    return True


def _hosts(netloc: str, params: dict[str, str], libpq_env: Mapping[str, str]) -> list[str]:
    """The hosts libpq would connect to: `?host=` over the URL's (several, comma-separated),
    and PGHOST when the URL names none."""
    if "host" in params:
        return params["host"].split(",")
    named = _netloc_hosts(netloc)
    if any(named):
        return named
    return libpq_env.get("PGHOST", "").split(",")


def _netloc_hosts(netloc: str) -> list[str]:
    """The hosts in the URL's authority (empty names where it has none)."""
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
    return _is_loopback_address(host)


def _is_loopback_address(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
