"""The code-layout tables of the docs, generated from the package's docstrings.

docs/design.md's "Code layout" holds one row per package (its `__init__` docstring's first
paragraph); docs/layout.md one row per module (its docstring's first sentence). Both sit between
`<!-- layout:... -->` markers. `python scripts/layout_table.py --write` rewrites them;
tests/test_layout.py fails when they differ from the code, so they cannot drift.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sis_platform"
DESIGN = ROOT / "docs" / "design.md"
LAYOUT = ROOT / "docs" / "layout.md"


def docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def first_paragraph(text: str) -> str:
    return one_line(text.split("\n\n")[0])


def first_sentence(text: str) -> str:
    paragraph = first_paragraph(text)
    match = re.match(r"(.+?\.)\s+(?=[A-Z`(\"])", paragraph)
    return match.group(1) if match else paragraph


def packages() -> list[Path]:
    return sorted(p.parent for p in PACKAGE.rglob("__init__.py"))


def package_table() -> str:
    rows = ["| package | what it owns |", "|---|---|"]
    for package in packages():
        name = package.relative_to(PACKAGE).as_posix()
        label = "`sis_platform/`" if name == "." else f"`{name}/`"
        rows.append(f"| {label} | {first_paragraph(docstring(package / '__init__.py'))} |")
    rows.append(f"| `definitions.py` | {first_paragraph(docstring(PACKAGE / 'definitions.py'))} |")
    return "\n".join(rows)


def module_table() -> str:
    rows = ["| module | what it is |", "|---|---|"]
    for module in sorted(PACKAGE.rglob("*.py")):
        if module.name == "__init__.py":
            continue
        name = module.relative_to(PACKAGE).as_posix()
        rows.append(f"| `{name}` | {first_sentence(docstring(module))} |")
    return "\n".join(rows)


def replaced(text: str, marker: str, table: str) -> str:
    start, end = f"<!-- layout:{marker} start -->", f"<!-- layout:{marker} end -->"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"no {start} ... {end} markers")
    return pattern.sub(lambda _: f"{start}\n{table}\n{end}", text)


def generated() -> dict[Path, str]:
    return {
        DESIGN: replaced(DESIGN.read_text(), "packages", package_table()),
        LAYOUT: replaced(LAYOUT.read_text(), "modules", module_table()),
    }


def main() -> int:
    stale = [path for path, text in generated().items() if path.read_text() != text]
    if "--write" in sys.argv[1:]:
        for path, text in generated().items():
            path.write_text(text)
        return 0
    for path in stale:
        print(
            f"{path.relative_to(ROOT)}: the layout table differs from the docstrings;"
            " run python scripts/layout_table.py --write"
        )
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
