"""What the console scripts share: the platform's configured resources, and a Spark session
started without burying the command's own output.

Dagster and pyspark are heavy imports, and `--help` or a bad argument needs neither: the
commands call these only once their arguments are parsed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from argparse import Namespace
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sis_platform.resources.spark import DeltaSparkResource

EXIT_USAGE = 2  # bad arguments or configuration, for every command


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> Namespace | int:
    """The parsed arguments, or the exit status argparse chose (0 for --help, EXIT_USAGE for bad
    arguments), returned rather than exited so `main` stays callable from tests."""
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE


def configured_resources(program: str) -> dict[str, Any] | None:
    """The platform's resources as the settings configure them (sis_platform.resources.config), or
    None after saying on stderr what is wrong with the configuration."""
    # Imported here: sis_platform.resources.config imports Dagster (1.3 s measured), which `--help`
    # and a bad argument never need.
    from sis_platform.resources import config

    try:
        return config.resources()
    except config.ConfigurationError as exc:
        print(f"{program}: configuration error: {exc}", file=sys.stderr)
        return None


def spark_session(resource: DeltaSparkResource) -> Any:
    """The configured Spark session, its start-up output kept off the command's own output
    (see _startup_output_captured) and its log level at ERROR once started."""
    with _startup_output_captured():
        session = resource.spark_session
    if "spark.remote" not in resource.spark_config:  # Spark Connect: the server's logs, not ours
        session.sparkContext.setLogLevel("ERROR")
    return session


@contextmanager
def _startup_output_captured() -> Iterator[None]:
    """Spark's JVM inherits this process's stdout and stderr when it starts; its banner, Ivy's
    dependency report and log4j's start-up warnings would bury the report (and corrupt --json
    on stdout). They go to a temporary file instead, replayed on stderr only if start-up fails.
    Once started, the log level is ERROR, and a failing query raises in Python with the Java
    error attached, so nothing the operator needs is lost."""
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile() as sink:
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        ok = False
        try:
            for fd in saved:
                os.dup2(sink.fileno(), fd)
            yield
            ok = True
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            if not ok:
                sink.seek(0)
                sys.stderr.write(sink.read().decode("utf-8", "replace"))
