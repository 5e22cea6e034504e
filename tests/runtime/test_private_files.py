"""Every console script makes what it writes private to its user (sis_platform/runtime/private.py):
umask 077 from the first line of its `main`, whatever umask it inherited. What the code
location and its runs write is checked on a real run in tests/resources/test_secure_driver.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# In a child process: each script's main, asked for --help, with umask 022 before it.
SCRIPT = textwrap.dedent(
    """
    import importlib, os, sys
    for name, target in (arg.split("=", 1) for arg in sys.argv[1:]):
        module, function = target.split(":")
        main = getattr(importlib.import_module(module), function)
        os.umask(0o022)
        try:
            main(["--help"])
        except SystemExit:
            pass
        print("UMASK", name, oct(os.umask(0o022)), flush=True)
    """
)


def test_every_console_script_creates_files_without_group_or_other_access():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "sis-run" in scripts and "sis-live" in scripts
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *(f"{name}={target}" for name, target in scripts.items())],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    umasks = dict(x.split()[1:] for x in done.stdout.splitlines() if x.startswith("UMASK "))
    assert umasks == {name: "0o77" for name in scripts}


def test_a_private_folder_is_made_0700_under_any_umask_and_an_existing_one_is_left_alone(
    tmp_path,
):
    """`make_private_folder` (the serving store's folder, the doorbells): a new folder is 0700
    although the umask would allow more; an operator's existing folder keeps its mode; a file
    in its place is refused."""
    import os

    from sis_platform.runtime.private import make_private_folder

    before = os.umask(0o022)
    try:
        made = tmp_path / "new" / "store"
        make_private_folder(made)
        assert made.stat().st_mode & 0o777 == 0o700
        shared = tmp_path / "shared"
        shared.mkdir(mode=0o755)
        make_private_folder(shared)
        assert shared.stat().st_mode & 0o777 == 0o755
        (tmp_path / "file").write_text("")
        with pytest.raises(FileExistsError):
            make_private_folder(tmp_path / "file")
    finally:
        os.umask(before)
