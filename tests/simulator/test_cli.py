"""The sis-feed command: generate, publish (to the embedded queue) and stats."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import date
from pathlib import Path

import pytest

from sis_platform.queues.factory import open_source
from sis_platform.simulator.cli import Pacer, main
from sis_platform.simulator.feedfile import read_feed, write_feed
from sis_platform.simulator.generator import generate_feed


def _drain(url: str) -> list[tuple[str, bytes]]:
    received = []
    with open_source(url).connect() as session:
        while (message := session.get()) is not None:
            received.append((message.message_id, message.body))
        session.commit()
    return received


def test_generate_writes_exactly_the_feed_of_the_api(tmp_path: Path) -> None:
    out = tmp_path / "feed.jsonl"
    argv = ["generate", "--seed", "3", "--messages", "500", "--out", str(out)]
    argv += ["--invalid", "not-well-formed=0.02", "--invalid", "orphan-update=0.01"]
    argv += ["--duplicates", "0.04", "--start", "2026-12-26"]
    assert main(argv) == 0
    expected = generate_feed(
        3,
        500,
        invalid={"not-well-formed": 0.02, "orphan-update": 0.01},
        duplicates=0.04,
        start=date(2026, 12, 26),
    )
    assert list(read_feed(out)) == list(expected)


def test_generate_twice_gives_identical_files(tmp_path: Path) -> None:
    for name in ("a.jsonl", "b.jsonl"):
        assert main(["generate", "--messages", "300", "--out", str(tmp_path / name)]) == 0
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_generate_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--messages", "5", "--out", "-"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 5
    assert "wrote 5 messages" in captured.err


def test_stats_counts_messages_by_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "feed.jsonl"
    main(["generate", "--messages", "1000", "--duplicates", "0.05", "--out", str(out)])
    capsys.readouterr()
    assert main(["stats", str(out)]) == 0
    report = capsys.readouterr().out
    kinds = Counter(m.kind for m in read_feed(out))
    assert "messages        1000" in report
    for kind, count in kinds.items():
        assert any(line.split()[:2] == [kind, str(count)] for line in report.splitlines())
    assert f"message ids     {1000 - kinds['duplicate']}" in report


def test_publish_from_a_file_puts_every_message_with_its_id(tmp_path: Path) -> None:
    feed = tmp_path / "feed.jsonl"
    write_feed(generate_feed(5, 60, duplicates=0.1), feed)
    url = f"embedded://{tmp_path / 'queue'}"
    assert main(["publish", "--to", url, "--from-file", str(feed), "--backlog"]) == 0
    sent = [(m.message_id, m.body) for m in read_feed(feed)]
    assert _drain(url) == sent
    # The redelivered duplicates reach the queue under their original's id.
    assert len({message_id for message_id, _ in sent}) == 54


def test_publish_generates_when_no_file_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"embedded://{tmp_path / 'queue'}"
    assert main(["publish", "--to", url, "--seed", "2", "--messages", "40"]) == 0
    assert _drain(url) == [(m.message_id, m.body) for m in generate_feed(2, 40)]
    assert "published 40/40 messages" in capsys.readouterr().err


def test_publish_at_a_rate_waits_for_each_message_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Sleeping is recorded, not done, so the real clock stands nearly still: each wait asked
    # for is then the time until that message's deadline, start + index / rate. Only this
    # thread's sleeps are recorded: threads left running by earlier tests (a sensor's poll loop,
    # a broker client) sleep for real, or they would spin and flood the record (seen in CI).
    naps: list[float] = []
    caller = threading.get_ident()
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        if threading.get_ident() == caller:
            naps.append(seconds)
        else:
            real_sleep(seconds)

    monkeypatch.setattr("time.sleep", sleep)
    url = f"embedded://{tmp_path / 'queue'}"
    assert main(["publish", "--to", url, "--messages", "30", "--rate", "10"]) == 0
    assert len(_drain(url)) == 30
    assert 20 <= len(naps) <= 29
    assert all(a < b for a, b in zip(naps, naps[1:], strict=False))
    assert 2.0 < naps[-1] <= 2.9


class _FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.naps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.naps.append(seconds)
        self.now += seconds * 1.5  # oversleeps by half every time


def test_pacer_deadlines_come_from_the_start_so_lateness_does_not_accumulate() -> None:
    clock = _FakeClock()
    pacer = Pacer(4.0, clock=clock, sleep=clock.sleep)
    for index in range(9):
        pacer.wait(index)
        clock.now += 0.05  # each put takes 50 ms
    # Message 8 was due at start + 2 s; despite oversleeping it went out by then + one nap.
    assert clock.now - 100.0 < 2.0 + 0.25 * 1.5 + 0.05 + 1e-9
    assert all(nap <= 0.25 + 1e-9 for nap in clock.naps)


def test_pacer_in_backlog_mode_never_sleeps() -> None:
    clock = _FakeClock()
    pacer = Pacer(None, clock=clock, sleep=clock.sleep)
    for index in range(100):
        pacer.wait(index)
    assert clock.naps == []


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["generate", "--out", "x", "--invalid", "bogus=0.1"], "unknown reason 'bogus'"),
        (["generate", "--out", "x", "--invalid", "too-large"], "expected REASON=SHARE"),
        (["generate", "--out", "x", "--invalid", "too-large=2"], "within [0, 1]"),
        (["generate", "--out", "x", "--messages", "-5"], "must be >= 0"),
        (["generate", "--out", "x", "--messages", "lots"], "not a whole number"),
        (["generate", "--out", "x", "--start", "21/11/2026"], "not a date"),
        (["generate", "--out", "x", "--max-bytes", "100"], "max_bytes must be at least"),
        (
            ["generate", "--out", "x", "--invalid", "too-large=0.7", "--duplicates", "0.7"],
            "more than 1",
        ),
        (
            ["generate", "--out", "x", "--invalid", "too-large=0.1", "--invalid", "too-large=0.2"],
            "given twice",
        ),
        (["generate"], "--out"),
        (["publish", "--to", "embedded:///tmp/q", "--rate", "0"], "positive number"),
        (["publish", "--to", "embedded:///tmp/q", "--rate", "5", "--backlog"], "not allowed"),
        (["publish", "--to", "nowhere://x", "--messages", "1"], "unsupported queue URL"),
        (["publish", "--to", "embedded:///tmp/q", "--from-file", "/no/such.jsonl"], "no such"),
        (["stats", "/no/such/feed.jsonl"], "no such file"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_arguments_are_usage_errors_not_tracebacks(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert error in capsys.readouterr().err


def test_from_file_cannot_be_mixed_with_generator_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    feed = tmp_path / "feed.jsonl"
    write_feed(generate_feed(1, 2), feed)
    with pytest.raises(SystemExit):
        main(
            ["publish", "--to", f"embedded://{tmp_path}/q", "--from-file", str(feed), "--seed", "4"]
        )
    assert "cannot be combined with generator options (--seed)" in capsys.readouterr().err


def test_a_corrupt_feed_file_is_reported_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    feed = tmp_path / "feed.jsonl"
    feed.write_text("{}\n", encoding="utf-8")
    assert main(["stats", str(feed)]) == 1
    assert "feed.jsonl:1: not a simulated message" in capsys.readouterr().err
