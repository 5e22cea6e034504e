"""The package's layout as docs/design.md and docs/layout.md describe it: nothing loose at the
package's root, a docstring on every module, and the generated layout tables equal to what the
docstrings say (scripts/layout_table.py)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sis_platform"


def test_only_the_package_marker_and_the_code_location_sit_at_the_root() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "definitions.py"]


def test_every_module_says_what_it_owns() -> None:
    silent = [
        str(p.relative_to(ROOT))
        for p in sorted(PACKAGE.rglob("*.py"))
        if not ast.get_docstring(ast.parse(p.read_text()))
    ]
    assert silent == []


def test_the_layout_tables_match_the_docstrings() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "layout_table.py")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
