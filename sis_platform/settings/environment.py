"""The one module of the platform that reads the process environment: typed reads of the
`SIS_*` variables (over the profile file `SIS_SETTINGS_FILE` names), secrets, the
fault-injection hooks, and the environment handed to child processes."""

from __future__ import annotations

import importlib.util
import os
import re
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sis_platform.settings.records import ConfigurationError, is_local_master
from sis_platform.settings.variables import (
    FAULT_INJECTION_VARIABLES,
    SECRET_VARIABLES,
    SETTINGS_FILE_VARIABLE,
    SPARK_CONNECT_TOKEN_VARIABLE,
    SPARK_SECRET_KEY_EXCEPTIONS,
    SPARK_SECRET_KEY_PATTERN,
    VARIABLES,
)

# -- reading ------------------------------------------------------------------------------


class Reader:
    """Typed reads of one mapping of variables; an unset or empty variable is its default."""

    def __init__(self, variables: Mapping[str, str]) -> None:
        self.variables = variables

    def text(self, name: str, default: str) -> str:
        return self.optional(name) or default

    def optional(self, name: str) -> str | None:
        return self.variables.get(name, "").strip() or None

    def whole(self, name: str, default: int) -> int:
        raw = self.text(name, str(default))
        try:
            return int(raw)
        except ValueError:
            raise ConfigurationError(f"{name}={raw!r} is not a whole number") from None

    def number(self, name: str, default: float) -> float:
        raw = self.text(name, str(default))
        try:
            return float(raw)
        except ValueError:
            raise ConfigurationError(f"{name}={raw!r} is not a number") from None

    def flag(self, name: str, default: bool) -> bool:
        """`true` or `false` (unset: `default`)."""
        raw = self.optional(name)
        if raw is None:
            return default
        if raw not in ("true", "false"):
            raise ConfigurationError(f"{name}={raw!r}: expected true or false")
        return raw == "true"

    def choice(self, name: str, choices: tuple[str, ...], default: str | None = None) -> str:
        """One of `choices` (default: the first)."""
        value = self.text(name, default or choices[0])
        if value not in choices:
            raise ConfigurationError(f"{name}={value!r}: expected one of {', '.join(choices)}")
        return value

    def at_least_number(self, name: str, default: float, least: float) -> float:
        value = self.number(name, default)
        if value < least:
            raise ConfigurationError(f"{name}={value:g} must be at least {least:g}")
        return value

    def at_least(self, name: str, default: int, least: int) -> int:
        value = self.whole(name, default)
        if value < least:
            raise ConfigurationError(f"{name}={value} must be at least {least}")
        return value


def _environment(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def variables_in_effect(env: Mapping[str, str] | None) -> Reader:
    """The variables in effect: the environment over the profile file it names, if any."""
    env = _environment(env)
    path = env.get(SETTINGS_FILE_VARIABLE, "").strip()
    if not path:
        return Reader(env)
    from_file = read_settings_file(Path(path))
    return Reader({**from_file, **{k: v for k, v in env.items() if v.strip()}})


def read_settings_file(path: Path) -> dict[str, str]:
    """A profile file's variables: `SIS_NAME=value` lines (blank lines and `#` comments
    skipped; no quoting: the value is the rest of the line, stripped). A secret, an unknown
    name or a malformed line is an error."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise ConfigurationError(f"{SETTINGS_FILE_VARIABLE}={str(path)!r}: {error}") from None
    variables: dict[str, str] = {}
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        where = f"{SETTINGS_FILE_VARIABLE}={str(path)!r} line {number}"
        name, sep, value = text.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ConfigurationError(f"{where}: expected SIS_NAME=value")
        if is_secret(name):
            raise ConfigurationError(
                f"{where}: {name} is a secret; secrets are taken from the environment only"
            )
        if name not in VARIABLES or name == SETTINGS_FILE_VARIABLE:
            raise ConfigurationError(f"{where}: {name} is not a setting of the platform")
        variables[name] = value.strip()
    return variables


def is_secret(name: str) -> bool:
    """Whether variable `name` holds a secret (a password, token or other secret)."""
    return name in SECRET_VARIABLES or name.endswith(("_PASSWORD", "_TOKEN", "_SECRET"))


def is_secret_spark_key(key: str) -> bool:
    """Whether the Spark or Hadoop setting `key` holds a secret (SPARK_SECRET_KEY_PATTERN)."""
    return re.search(SPARK_SECRET_KEY_PATTERN, key) is not None and (
        re.search(SPARK_SECRET_KEY_EXCEPTIONS, key) is None
    )


# -- read at call time ----------------------------------------------------------------------

# libpq's own variables that choose the server a connection reaches. libpq reads them itself;
# the serving store reads them only to know whether that server is this host (serving/location.py).
LIBPQ_HOST_VARIABLES = ("PGHOST", "PGHOSTADDR", "PGSERVICE")


def libpq_host_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The set (non-empty) LIBPQ_HOST_VARIABLES of `env` (default: this process's)."""
    source = os.environ if env is None else env
    return {name: source[name] for name in LIBPQ_HOST_VARIABLES if source.get(name)}


def secret(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The secret variable `name` (e.g. SIS_STOMP_PASSWORD) from the environment, or None if it
    is unset or empty. Never from a profile file, never kept in `Settings`."""
    if not is_secret(name):
        raise ValueError(f"{name} is not a secret variable")
    return _environment(env).get(name) or None


SPARK_SECRET_CONF = "SIS_SPARK_SECRET_CONF"
HADOOP_PREFIX = "spark.hadoop."


def spark_secret_conf(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """SIS_SPARK_SECRET_CONF: secret Spark SQL or Hadoop settings (an object store's keys),
    `key=value` pairs separated by whitespace, from the environment only.

    Read by the process that builds the Spark session, and applied to the session after its JVM
    has started (`spark.conf.set`): never part of the code location's configuration nor of the
    JVM's command line. Spark SQL copies a session's settings, verbatim, into the Hadoop
    configuration every read and write uses (SessionState.newHadoopConf), so a Hadoop setting is
    given by its Hadoop name; a `spark.hadoop.` prefix is dropped for it. A malformed pair is an
    error that names the key, never the value.
    """
    conf: dict[str, str] = {}
    for pair in (_environment(env).get(SPARK_SECRET_CONF) or "").split():
        key, sep, value = pair.partition("=")
        if not sep or not key or not value:
            shown = key if sep else "(a pair without '=')"
            raise ConfigurationError(f"{SPARK_SECRET_CONF}: {shown}: expected key=value pairs")
        conf[key.removeprefix(HADOOP_PREFIX)] = value
    return conf


def spark_connect_token(env: Mapping[str, str] | None = None) -> str | None:
    """Spark Connect's shared-secret token (SPARK_CONNECT_AUTHENTICATE_TOKEN), or None."""
    return secret(SPARK_CONNECT_TOKEN_VARIABLE, env)


def ensure_spark_connect_token() -> None:
    """Give this process, and so every child it starts, a fresh random Spark Connect token
    unless the operator set one: what sis-run does before it starts a Spark Connect server
    beside the Dagster processes whose runs connect to it (they inherit it)."""
    if spark_connect_token() is None:
        os.environ[SPARK_CONNECT_TOKEN_VARIABLE] = secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Credentials:
    """A login for a queue URL that names none (the password is left out of the repr)."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)


def url_credentials(scheme: str, env: Mapping[str, str] | None = None) -> Credentials:
    """The environment's login for a queue URL of `scheme` that names none: SIS_STOMP_USER and
    SIS_STOMP_PASSWORD for `stomp`, SIS_IBMMQ_PASSWORD for `ibmmq` (its user is the URL's or
    the settings'); nothing for another scheme."""
    if scheme == "stomp":
        return Credentials(
            variables_in_effect(env).optional("SIS_STOMP_USER"), secret("SIS_STOMP_PASSWORD", env)
        )
    if scheme == "ibmmq":
        return Credentials(None, secret("SIS_IBMMQ_PASSWORD", env))
    return Credentials()


def fault_injection(variable: str) -> str | None:
    """A fault-injection hook's variable (FAULT_INJECTION_VARIABLES), read each time it is
    asked, so a test sets it per child process; None when unset or empty."""
    if variable not in FAULT_INJECTION_VARIABLES:
        raise ValueError(f"{variable} is not a fault-injection variable")
    return os.environ.get(variable) or None


def cache_home() -> Path:
    """The user's cache folder: $XDG_CACHE_HOME, else ~/.cache."""
    return Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache"))


def config_home() -> Path:
    """The user's config folder: $XDG_CONFIG_HOME, else ~/.config (the process's, like
    `cache_home`: it is the user's, not a setting of the platform)."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config"))


def dagster_home() -> str | None:
    """$DAGSTER_HOME (where Dagster's instance, its runs and their tags, is configured), or
    None when it is unset: a console script then has no Dagster instance to read."""
    return os.environ.get("DAGSTER_HOME") or None


def spark_home() -> Path | None:
    """The Spark distribution a local driver runs from, whose jars are on its class path:
    $SPARK_HOME when it is set, else the installed pyspark package's own folder (PySpark's
    rule), found without importing pyspark; None if there is neither."""
    if home := os.environ.get("SPARK_HOME"):
        return Path(home)
    spec = importlib.util.find_spec("pyspark")
    return Path(spec.origin).parent if spec and spec.origin else None


def python_workers_use_this_interpreter() -> None:
    """Make PySpark start its Python workers with this interpreter unless the operator chose one.

    PySpark takes the workers' interpreter from $PYSPARK_PYTHON when the session starts (else
    whatever `python3` is first on PATH); in local mode it must be the platform's own (its
    virtualenv holds pandas, pyarrow, lxml and the platform). The Spark settings
    `spark.pyspark.python` and `spark.pyspark.driver.python` do not replace it: pyspark 4.2
    started from Python reads only the environment variable (tried: a local session with
    `spark.pyspark.python` set ran its Arrow workers on the `python3` of PATH).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


# Where a local driver's listeners bind unless the operator sets SPARK_LOCAL_IP.
LOOPBACK = "127.0.0.1"


def local_driver_listens_on_loopback(master: str) -> None:
    """Make a local driver's web UI (SIS_SPARK_UI) listen on loopback unless the operator set
    SPARK_LOCAL_IP.

    Spark 4.2's UI binds the address in $SPARK_LOCAL_IP, read from the JVM's environment, else
    every interface (WebUI.initServer: "0.0.0.0"); spark.driver.bindAddress does not reach it,
    and Spark has no setting for it. PySpark starts the JVM with this process's environment.
    Not for a cluster master, whose executors connect back to the driver's own address.
    """
    if is_local_master(master):
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)


def child_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process that runs a local Spark driver (the Spark Connect
    server): `env` (default: this process's), with PYSPARK_PYTHON this interpreter and
    SPARK_LOCAL_IP loopback (see local_driver_listens_on_loopback) unless set."""
    child = dict(_environment(env))
    child.setdefault("PYSPARK_PYTHON", sys.executable)
    child.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    return child
