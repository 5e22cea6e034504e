"""A throwaway PostgreSQL cluster for the tests, started with the distribution's binaries.

`PgCluster` runs `initdb` and `pg_ctl` (Debian's /usr/lib/postgresql/<version>/bin) in a fresh
folder under /tmp, listening on a Unix socket in that folder and, only when given a port, on
that loopback TCP port (dagster-postgres connects by host and port), with password
authentication (scram-sha-256) for the user `sis`. initdb refuses to run as root: as root the
cluster runs as the `postgres` user (or `nobody`), through `runuser`, in a folder that user owns;
as anyone else it runs as that user. `pg_ctl stop -m fast` stops it; `cluster()` is a context
manager that always stops it and removes its folder.

A test module uses it through a fixture, e.g.:

    @pytest.fixture(scope="session")
    def pg():
        with cluster() as running:
            yield running
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

USER = "sis"
PASSWORD_VARIABLE = "SIS_SERVING_PASSWORD"
PG_ROOT = Path("/usr/lib/postgresql")
# Unprivileged accounts to run the server as when the tests run as root, in order of preference.
SERVER_ACCOUNTS = ("postgres", "nobody")
PG_CTL_WAIT_SECONDS = 60


def pg_bin() -> Path:
    """The newest installed PostgreSQL's bin folder (the postgresql package provides it)."""
    versions = sorted(
        (p for p in PG_ROOT.glob("*/bin") if (p / "initdb").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if not versions:
        raise RuntimeError(
            f"no PostgreSQL server binaries under {PG_ROOT}: install the postgresql package "
            "(apt-get install postgresql) to run the serving store's PostgreSQL tests"
        )
    return versions[-1]


@dataclass
class PgCluster:
    folder: Path
    bin: Path
    run_as: str | None  # the account the server runs as; None: this process's user
    port: int | None = None  # a loopback TCP port to listen on as well; None: the socket only
    tls: bool = False  # TCP offers TLS with a certificate for 127.0.0.1 (`ca_file` verifies it)
    password: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)
    _databases: int = 0

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def socket_dir(self) -> Path:
        return self.folder

    def _command(self, *args: str) -> list[str]:
        prefix = ["runuser", "-u", self.run_as, "--"] if self.run_as else []
        return [*prefix, *args]

    def _run(self, *args: str) -> None:
        result = subprocess.run(
            self._command(*args), capture_output=True, text=True, cwd=self.folder, check=False
        )
        if result.returncode:
            log = self.folder / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(
                f"{' '.join(args[:2])} failed ({result.returncode}): {result.stderr}\n{tail}"
            )

    def init(self) -> None:
        pwfile = self.folder / "pwfile"
        pwfile.write_text(self.password + "\n")
        self._own(pwfile)
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            USER,
            "--pwfile",
            str(pwfile),
            "--auth-local=scram-sha-256",
            "--auth-host=scram-sha-256",
            "-E",
            "UTF8",
            "--no-instructions",
        )
        pwfile.unlink()

    def start(self) -> None:
        # The socket in the cluster's own folder, TCP on loopback only if asked. fsync off: a
        # test cluster need not survive a power cut, and it makes commits cheap for the suite.
        tcp = f"127.0.0.1 -p {self.port}" if self.port else "''"
        options = f"-c listen_addresses={tcp} -k {self.socket_dir} -c fsync=off"
        if self.tls:
            options += f" {self._certify()}"
        self._run(
            str(self.bin / "pg_ctl"),
            "start",
            "-D",
            str(self.data),
            "-l",
            str(self.folder / "server.log"),
            "-w",
            "-t",
            str(PG_CTL_WAIT_SECONDS),
            "-o",
            options,
        )

    @property
    def ca_file(self) -> Path:
        """The server's self-signed certificate for 127.0.0.1 (and localhost): its own CA."""
        return self.folder / "server.crt"

    def _certify(self) -> str:
        """Make the server's key and certificate; the server options that use them."""
        key = self.folder / "server.key"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
            + ["-keyout", str(key), "-out", str(self.ca_file), "-subj", "/CN=127.0.0.1"]
            + ["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
            capture_output=True,
            check=True,
        )
        key.chmod(0o600)
        self.ca_file.chmod(0o644)
        self._own(key)
        self._own(self.ca_file)
        return f"-c ssl=on -c ssl_cert_file={self.ca_file} -c ssl_key_file={key}"

    def stop(self) -> None:
        self._run(
            str(self.bin / "pg_ctl"),
            "stop",
            "-D",
            str(self.data),
            "-m",
            "fast",
            "-w",
            "-t",
            str(PG_CTL_WAIT_SECONDS),
        )

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def url(self, database: str) -> str:
        """A password-free URL of `database` over the cluster's socket."""
        # The socket's name carries the port the server listens on (5432 unless given one).
        port = f"&port={self.port}" if self.port else ""
        return f"postgresql://{USER}@/{database}?host={self.socket_dir}{port}"

    def dagster_env(self, database: str) -> dict[str, str]:
        """The variables deploy/dagster-postgres.yaml reads, for `database` over TCP (with
        TLS, which the file verifies: libpq's CA in PGSSLROOTCERT)."""
        assert self.port and self.tls, (
            "dagster-postgres connects over TCP with verified TLS: start the cluster with a "
            "port and tls"
        )
        return {
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_DB": database,
            "DAGSTER_PG_USER": USER,
            "DAGSTER_PG_PASSWORD": self.password,
            "PGSSLROOTCERT": str(self.ca_file),
        }

    def admin(self) -> psycopg.Connection:
        return psycopg.connect(self.url("postgres"), password=self.password, autocommit=True)

    def new_database(self) -> str:
        """A fresh, empty database; its name."""
        self._databases += 1
        name = f"t{os.getpid()}_{self._databases}"
        with self.admin() as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return name

    def _own(self, path: Path) -> None:
        if self.run_as:
            account = pwd.getpwnam(self.run_as)
            os.chown(path, account.pw_uid, account.pw_gid)


def _server_account() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in SERVER_ACCOUNTS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError(f"running as root and none of {SERVER_ACCOUNTS} exists to run PostgreSQL")


@contextmanager
def cluster(port: int | None = None, tls: bool = False) -> Iterator[PgCluster]:
    """A started cluster (also on loopback TCP `port` if given, offering TLS if `tls`), stopped
    and removed on exit whatever happened meanwhile."""
    # Directly under /tmp (not pytest's tmp_path, whose parents are private to this user): the
    # server's account must reach its folder; the socket path stays short (sun_path is 108).
    folder = Path(tempfile.mkdtemp(prefix="sis-pg-"))
    pg = PgCluster(folder, pg_bin(), _server_account(), port, tls)
    try:
        pg._own(folder)
        pg.init()
        pg.start()
        yield pg
    finally:
        try:
            if pg.running():
                pg.stop()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
