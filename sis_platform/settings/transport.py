"""Where a broker connection goes and how it is protected: whether a host is this machine
(loopback), the TLS files a client uses (the CA that vouches for the broker, the client's own
certificate and key), and an IBM MQ channel's SSL peer name. Checked when the settings are
read (sis_platform/settings/loading.py) and used by the sources that connect
(sis_platform/queues/).

DESIGN.md invariant 9: a broker connection that leaves the host uses TLS with a verified
certificate, and a password never crosses the network in clear unless an operator says so.
"""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass, field
from pathlib import Path


def is_loopback(host: str) -> bool:
    """`localhost` (RFC 6761 reserves it and its subdomains for loopback) or a loopback IP
    address (127.0.0.0/8, ::1). The name is not resolved: what DNS says about another name
    can change after the check, so any other name counts as leaving the host."""
    name = host.strip().strip("[]").lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def listen_address(text: str) -> tuple[str, int] | None:
    """A listener's `HOST:PORT` (`[v6]:PORT` for an IPv6 address) as (host, port); `off`: None.
    ValueError says what is wrong."""
    text = text.strip()
    if text.lower() == "off":
        return None
    host, sep, port = text.rpartition(":")
    host = host.strip("[]") if host.startswith("[") else host
    if not sep or not host or ("[" in host or "]" in host):
        raise ValueError("expected HOST:PORT (e.g. 127.0.0.1:9464, [::1]:9464) or off")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"port {port!r} is not 1 to 65535")
    return host, int(port)


@dataclass(frozen=True)
class TlsFiles:
    """A TLS client's files. `ca_file` (PEM) holds the certificates the broker's must chain to
    (None: the system's trust store); `cert_file` and `key_file` (PEM) are the client's own
    certificate and key for a broker that asks for one (both or neither; a file holding both
    may be named twice); `key_password` decrypts an encrypted key. The broker's certificate and
    host name are always verified: there is no switch to turn that off."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    key_password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError(
                "a client certificate needs its key and a key its certificate: give both"
                f" (certificate {self.cert_file!r}, key {self.key_file!r})"
            )
        for what, path in (("CA", self.ca_file), ("certificate", self.cert_file)):
            if path is not None and not Path(path).is_file():
                raise ValueError(f"TLS {what} file {path!r} is not a file")
        if self.key_file is not None and not Path(self.key_file).is_file():
            raise ValueError(f"TLS key file {self.key_file!r} is not a file")

    def context(self) -> ssl.SSLContext:
        """The client context these files make, as stomp.py builds it for a connection
        (PROTOCOL_TLS_CLIENT: certificate and host name verified, TLS 1.2 at least). Building
        it checks the files' contents; ValueError says which one is unusable."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            if self.ca_file is not None:
                context.load_verify_locations(self.ca_file)
            else:
                context.load_default_certs()
        except (ssl.SSLError, OSError) as e:
            raise ValueError(
                f"TLS CA file {self.ca_file!r} holds no usable certificate: {e}"
            ) from None
        if self.cert_file is not None:
            try:
                # Without a password an encrypted key must fail here, not make OpenSSL ask
                # for one on the terminal.
                context.load_cert_chain(
                    self.cert_file, self.key_file, self.key_password or _no_password
                )
            except (ssl.SSLError, OSError) as e:
                raise ValueError(
                    f"TLS client certificate {self.cert_file!r} with key {self.key_file!r}"
                    f" cannot be loaded (wrong key, or a key password missing or wrong): {e}"
                ) from None
        return context


def _no_password() -> str:
    return ""


# MQ_SSL_PEER_NAME_LENGTH: the longest SSLPEER a channel takes.
MAX_SSL_PEER_NAME_LENGTH = 1024


def check_ssl_peer_name(peer_name: str | None, cipher_spec: str | None) -> None:
    """An SSLPEER is a distinguished-name pattern ("CN=QM1,O=SIS"), only meaningful on a TLS
    channel; a bad one is refused here (ValueError) rather than by the MQ client library at
    the first connect."""
    if not peer_name:
        return
    if not cipher_spec:
        raise ValueError(
            "an SSL peer name (SSLPEER) pins the queue manager's TLS certificate and needs a "
            "cipher spec (SIS_IBMMQ_CIPHER_SPEC)"
        )
    if len(peer_name.encode("utf-8")) > MAX_SSL_PEER_NAME_LENGTH:
        raise ValueError(f"the SSL peer name is longer than MQ's {MAX_SSL_PEER_NAME_LENGTH} bytes")
    if any(ord(c) < 0x20 for c in peer_name) or "=" not in peer_name:
        raise ValueError(
            f"the SSL peer name {peer_name!r} is not a distinguished name such as "
            "'CN=QM1,O=SIS,C=GB'"
        )
