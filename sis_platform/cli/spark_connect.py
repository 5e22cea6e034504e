"""`sis-spark-connect`: a long-lived local Spark Connect server with Delta, for the runs.

    sis-spark-connect [--host 127.0.0.1] [--port 15002]

Under the Dagster daemon every run is a new process, and with a local driver (the default) each
starts a JVM of its own and pays its warm-up, which is most of a small batch's run
(BENCHMARKS.md has the figures). Runs pointed at it
(`SIS_SPARK_MASTER=sc://localhost:15002`) share one warm driver and connect in under a second.

The server runs in the foreground until stopped (scripts/run.sh starts it beside Dagster with
SIS_SPARK=connect). Its driver is configured like the runs' local drivers (SIS_SPARK_DRIVER_MEMORY,
SIS_SPARK_SHUFFLE_PARTITIONS, SIS_SPARK_UI, SIS_SPARK_JARS_DIR, SIS_SPARK_CONF, the class-data
archive) and its Python workers run this interpreter, which has the platform installed: the
fold's and the model's Arrow functions run there.

A Spark Connect client runs any code it likes in the server's Python workers, as the server's
user, so the server requires a shared-secret token from every client: Spark's own
SPARK_CONNECT_AUTHENTICATE_TOKEN, from the environment of the server (which Spark reads when
spark.connect.authenticate.token is unset, so the token is on no command line) and of every
client (PySpark's client reads it too). It refuses to start without one; sis-run generates one
for the server it starts and the Dagster processes beside it (docs/spark-connect.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from sis_platform.lake.driver.scratch import driver_scratch, with_scratch
from sis_platform.runtime.private import private_files
from sis_platform.settings import (
    SPARK_CONNECT_TOKEN_VARIABLE,
    child_environment,
    spark_connect_token,
    spark_settings,
)

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"

# The runs of a deployment share one server session (config.shared_spark_session), and a
# closed session's id cannot be used again: the server keeps it while the server lives, whether
# idle overnight or not (Spark's default closes a session after an hour without a request).
SESSION_TIMEOUT = "3650d"


def server_command(
    host: str, port: int, env: Mapping[str, str], scratch: Path | None = None
) -> list[str]:
    """The spark-submit command line of the server, with the Spark settings of `env`, and its
    scratch files in the folder `scratch` (lake/driver/scratch.py; None: Spark's own)."""
    # Imported here: sis_platform.resources.config imports Dagster (with pyspark: 1.3 s measured),
    # which
    # `start` in a parent process and `--help` never need.
    import pyspark

    from sis_platform.resources.config import spark_config

    conf = spark_config(spark_settings(env), "local[*]", long_lived=True)
    if scratch is not None:
        conf = with_scratch(conf, scratch)
    conf.update(
        {
            "spark.app.name": "sis-platform Spark Connect",
            "spark.connect.grpc.binding.address": host,
            "spark.connect.grpc.binding.port": str(port),
            "spark.connect.session.manager.defaultSessionTimeout": SESSION_TIMEOUT,
        }
    )
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    args = [str(submit), "--class", SERVER_CLASS]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return [*args, "spark-internal"]


# What the server logs once it listens.
READY = "Spark Connect server started at"


def start(
    port: int,
    *,
    host: str = "127.0.0.1",
    env: Mapping[str, str] | None = None,
    log: IO[str] | None = None,
) -> subprocess.Popen[str]:
    """Start the server as a child process (in a process group of its own: stop it with
    os.killpg) and return once it listens, as its own log line says; its output goes on to
    `log` (or nowhere). Raises RuntimeError, with the output, if it exits first."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sis_platform.cli.spark_connect",
            "--host",
            host,
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_environment(env),
        start_new_session=True,
    )
    assert proc.stdout is not None
    seen: list[str] = []
    for line in proc.stdout:
        seen.append(line)
        if log is not None:
            log.write(line)
        if READY in line:
            break
    else:
        raise RuntimeError(
            f"the Spark Connect server exited ({proc.wait()}):\n{''.join(seen[-100:])}"
        )

    def drain(out: IO[str]) -> None:  # the server must never block on a full pipe
        for line in out:
            if log is not None:
                log.write(line)

    threading.Thread(target=drain, args=(proc.stdout,), daemon=True).start()
    return proc


def main(argv: list[str] | None = None) -> int:
    private_files()
    parser = argparse.ArgumentParser(
        prog="sis-spark-connect",
        description="Run a local Spark Connect server with Delta for the platform's runs "
        "(SIS_SPARK_MASTER=sc://HOST:PORT).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=15002, help="port to listen on")
    args = parser.parse_args(argv)
    # Python workers (the fold's and the model's Arrow functions) run this interpreter.
    env = child_environment()
    if spark_connect_token(env) is None:
        print(
            f"sis-spark-connect: {SPARK_CONNECT_TOKEN_VARIABLE} is not set. Every client of the "
            "server runs code as this user, so the server requires a token: set it in the "
            "environment of the server and of its clients (the Dagster processes), e.g. "
            f"export {SPARK_CONNECT_TOKEN_VARIABLE}=$(python3 -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'); SIS_SPARK=connect ./scripts/run.sh makes one",
            file=sys.stderr,
        )
        return 2
    try:
        scratch_dir = spark_settings(env).scratch_dir
        # The server execs its JVM: the folder is this process's, which becomes the driver.
        scratch = driver_scratch(Path(scratch_dir)) if scratch_dir else None
        command = server_command(args.host, args.port, env, scratch)
    except ValueError as error:  # settings.ConfigurationError: a bad SIS_SPARK_* setting
        print(f"sis-spark-connect: {error}", file=sys.stderr)
        return 2
    client_host = "localhost" if args.host in ("127.0.0.1", "::1", "localhost") else args.host
    print(
        f"Spark Connect server for sis-platform on {args.host}:{args.port} "
        f"(clients: sc://{client_host}:{args.port} with {SPARK_CONNECT_TOKEN_VARIABLE})",
        flush=True,
    )
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    sys.exit(main())
