"""`sis-run`: the platform's processes under one supervisor (what `scripts/run.sh` execs).

    sis-run [--host 127.0.0.1] [--port 3000] [--workspace workspace.yaml]
            [--spark local|connect] [--spark-connect-port 15002]
            [--sim-messages 12000] [--sim-rate 4.2|backlog] [--sim-seed 1] [--grace 20]

Starts, each in a session of its own (sis_platform/runtime/supervisor.py): `sis-live` when
SIS_INTAKE is live (the default), watched through its heartbeat (restarted when it makes no
progress for SIS_LIVE_STALL_SECONDS); the feed simulator publishing into the embedded queue (a
one-shot; none with `--sim-messages 0` or when the source is not the embedded queue); the Spark
Connect server when `--spark connect` (Dagster starts once it listens; the runs must have
SIS_SPARK_MASTER=sc://localhost:PORT in their environment, which run.sh exports, and share the
server's SPARK_CONNECT_AUTHENTICATE_TOKEN, made here unless set); the Dagster
webserver, and the daemon once the webserver is up. Every line they write goes to stderr
prefixed with its name. SIGTERM, SIGINT or SIGHUP stop them all, run workers included. The
settings (SIS_INTAKE, the data folder, the source) come from sis_platform.settings; the children
inherit the environment.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from sis_platform.cli.spark_connect import READY as SPARK_CONNECT_READY
from sis_platform.runtime.private import private_files, private_folder
from sis_platform.runtime.supervisor import (
    Endpoint,
    Liveness,
    Program,
    Supervisor,
    SupervisorSettings,
)
from sis_platform.settings import (
    ConfigurationError,
    EmbeddedSourceSettings,
    Settings,
    ensure_spark_connect_token,
    load_settings,
)

# What dagster-webserver logs just before it binds its port (dagster_webserver/cli.py).
WEBSERVER_STARTING = "Serving dagster-webserver on"
# The daemon's lines of every scheduler tick that say nothing happened: each sensor's "checking"
# before its result (which is shown: a run requested, or why not), and the run queue's
# "nothing to launch" while a run is in flight (every 5 s). The UI's sensor and run-queue pages
# show the same ticks.
DAEMON_TICKS = (
    "Checking for new runs for sensor:",
    "runs are currently in progress. Maximum is",
    "Priority sorting and checking tag concurrency limits for queued runs.",
)


@dataclass(frozen=True)
class RunOptions:
    """What `sis-run` was asked for on its command line."""

    host: str = "127.0.0.1"
    port: int = 3000
    workspace: Path = Path("workspace.yaml")
    spark: str = "local"
    spark_connect_port: int = 15002
    sim_messages: int = 12000
    sim_rate: str = "4.2"
    sim_seed: int = 1
    grace_seconds: float = 20.0


def tool(name: str) -> str:
    """A console script of this virtualenv (next to its interpreter), else `name` on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else name


def simulator_program(options: RunOptions, settings: Settings) -> Program | None:
    source = settings.source
    if options.sim_messages <= 0 or not isinstance(source, EmbeddedSourceSettings):
        return None
    pace = ("--backlog",) if options.sim_rate == "backlog" else ("--rate", options.sim_rate)
    argv = (
        tool("sis-feed"),
        "publish",
        "--to",
        f"embedded://{source.path}",
        "--messages",
        str(options.sim_messages),
        "--seed",
        str(options.sim_seed),
        "--duplicates",
        "0.01",
        "--invalid",
        "not-well-formed=0.002",
        "--invalid",
        "schema-invalid=0.002",
        *pace,
    )
    return Program("sis-feed", argv, one_shot=True)


def platform_programs(options: RunOptions, settings: Settings) -> list[Program]:
    """The supervised programs, in start order: the live path first (it needs neither Spark nor
    Dagster), then the Spark Connect server if any, then Dagster. A gate holds back what follows
    it until it is ready: the Spark Connect server, so that no run starts before it listens;
    and the webserver, so that the daemon starts once the webserver has created a fresh
    instance's SQLite storage (the two creating it at once left two alembic heads, and the
    daemon's code location failed to load)."""
    workspace = str(options.workspace.resolve())
    cwd = options.workspace.resolve().parent
    programs = []
    if settings.intake == "live":
        liveness = Liveness(settings.live.heartbeat_file, settings.live.stall_seconds)
        programs.append(Program("sis-live", (tool("sis-live"),), cwd=cwd, liveness=liveness))
    simulator = simulator_program(options, settings)
    if simulator is not None:
        programs.append(simulator)
    if options.spark == "connect":
        programs.append(
            Program(
                "spark-connect",
                (tool("sis-spark-connect"), "--port", str(options.spark_connect_port)),
                ready_line=SPARK_CONNECT_READY,
                ready_message=f"Spark Connect on sc://localhost:{options.spark_connect_port}",
                gate=True,
            )
        )
    url = f"http://{options.host}:{options.port}"
    webserver = (tool("dagster-webserver"), "-w", workspace)
    programs.append(
        Program(
            "webserver",
            (*webserver, "-h", options.host, "-p", str(options.port)),
            ready_line=WEBSERVER_STARTING,
            ready_port=Endpoint(options.host, options.port),
            ready_message=f"Dagster UI: {url}   (data under {settings.data_dir}; "
            "Ctrl-C stops everything)",
            gate=True,
            cwd=cwd,
        )
    )
    daemon = (tool("dagster-daemon"), "run", "-w", workspace)
    programs.append(Program("daemon", daemon, cwd=cwd, quiet=DAEMON_TICKS))
    return programs


def parse(argv: list[str] | None) -> RunOptions:
    defaults = RunOptions()
    parser = argparse.ArgumentParser(
        prog="sis-run",
        description="Run the platform's processes (Dagster webserver and daemon, sis-live, the "
        "feed simulator, optionally a Spark Connect server) under one supervisor.",
    )
    parser.add_argument("--host", default=defaults.host, help="where the Dagster UI listens")
    parser.add_argument("--port", type=int, default=defaults.port, help="the Dagster UI's port")
    parser.add_argument("--workspace", type=Path, default=defaults.workspace)
    parser.add_argument("--spark", choices=("local", "connect"), default=defaults.spark)
    parser.add_argument("--spark-connect-port", type=int, default=defaults.spark_connect_port)
    parser.add_argument(
        "--sim-messages",
        type=int,
        default=defaults.sim_messages,
        help="messages the feed simulator publishes (0: no simulator)",
    )
    parser.add_argument(
        "--sim-rate", default=defaults.sim_rate, help="messages per second, or backlog"
    )
    parser.add_argument("--sim-seed", type=int, default=defaults.sim_seed)
    parser.add_argument(
        "--grace",
        type=float,
        default=defaults.grace_seconds,
        help="seconds between SIGTERM and SIGKILL when stopping",
    )
    args = parser.parse_args(argv)
    if args.sim_rate != "backlog":
        try:
            if float(args.sim_rate) <= 0:
                raise ValueError
        except ValueError:
            parser.error(f"--sim-rate {args.sim_rate}: expected a positive number or backlog")
    return RunOptions(
        host=args.host,
        port=args.port,
        workspace=args.workspace,
        spark=args.spark,
        spark_connect_port=args.spark_connect_port,
        sim_messages=args.sim_messages,
        sim_rate=args.sim_rate,
        sim_seed=args.sim_seed,
        grace_seconds=args.grace,
    )


def main(argv: list[str] | None = None) -> int:
    private_files()
    options = parse(argv)
    try:
        settings = load_settings()
    except ConfigurationError as error:
        print(f"sis-run: {error}", file=sys.stderr)
        return 2
    # Before its children start: Dagster's instance and the lake go under it.
    private_folder(settings.data_dir, create=True)
    if options.spark == "connect":
        # The server requires a token and the runs send it: every child inherits this one.
        ensure_spark_connect_token()
    programs = platform_programs(options, settings)
    supervisor = Supervisor(programs, SupervisorSettings(grace_seconds=options.grace_seconds))
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
