"""What formatting one log line costs in each SIS_LOG_FORMAT (sis_platform/runtime/logs.py).

    python scripts/bench_log_format.py [--repeat 5]

A line about one message (the embedded queue's backout move, with `extra=concerning(...)`),
its message id an ordinary one (48 characters) and a hostile one (1 MB from a broker header):
formatted by logging's plain Formatter (what the text format was), by TextFormatter (bounded,
escaped) and by JsonFormatter (bounded, ASCII). Figures are the best of `--repeat` rounds, in
microseconds per line, with the length of the line formatted.
"""

from __future__ import annotations

import argparse
import logging
import timeit

from sis_platform.runtime.logs import TEXT_FORMAT, JsonFormatter, TextFormatter, concerning

IDS = {"48-character id": "ID:" + "a" * 45, "1 MB id": "x" * 1_000_000}


def line_about(message_id: str) -> logging.LogRecord:
    logger = logging.getLogger("sis_platform.queues.embedded")
    return logger.makeRecord(
        logger.name,
        logging.WARNING,
        __file__,
        1,
        "embedded queue %s: message %s reached backout count %d, moving it to %s",
        ("SPORTSDATA", message_id, 2, "SPORTSDATA.BACKOUT"),
        None,
        extra=concerning(message_id=message_id),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    formatters: dict[str, logging.Formatter] = {
        "logging.Formatter": logging.Formatter(TEXT_FORMAT),
        "TextFormatter": TextFormatter(),
        "JsonFormatter": JsonFormatter(),
    }
    for shown, message_id in IDS.items():
        record = line_about(message_id)
        number = 20_000 if len(message_id) < 1000 else 200
        for name, formatter in formatters.items():
            rounds = timeit.repeat(
                lambda f=formatter, r=record: f.format(r), number=number, repeat=args.repeat
            )
            micros = min(rounds) / number * 1e6
            length = len(formatter.format(record))
            print(f"{shown:16s} {name:18s} {micros:9.1f} us/line {length:>9,} chars")


if __name__ == "__main__":
    main()
