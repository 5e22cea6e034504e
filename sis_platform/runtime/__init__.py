"""Process-level utilities the live path, the intake and the lake share, none of them about the
feed: the per-item guard and watchdog (`guard.py`), crash points for the fault tests
(`faults.py`), private file modes (`private.py`), whether a recorded process has ended
(`processes.py`), wake-ups between processes (`doorbell.py`), SQLite WAL checkpoints off the
committing thread (`walcheckpoint.py`), how the commands log, as text or JSON lines (`logs.py`),
and the process supervisor `sis-run` runs (`supervisor.py`)."""
