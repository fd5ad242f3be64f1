"""Documentation limits: module docstrings stay short, the README stays a front page.

A module docstring says what the module is and its contract, in a screenful at most; design
reasoning and measurements belong in ``docs/`` (the design pages) and ``BENCHMARKS.md``. The
README is a front page: at most ``README_MAX_LINES`` lines, its quick start names the two
commands that set everything up, and its code blocks fit an 80-column terminal. The site itself
(``mkdocs build --strict``: broken links, the generated pages) is built by scripts/test.sh.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("gspo", "server", "learner", "contract", "redisq", "clients")
MAX_DOCSTRING_LINES = 25
README_MAX_LINES = 250
README_CODE_COLUMNS = 80
QUICK_START_COMMANDS = ("bash scripts/up.sh", "bash scripts/test.sh")

def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")
                  if "__pycache__" not in p.parts)


def _docstring_lines(path: Path) -> int:
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
    return len(doc.splitlines()) if doc else 0


@pytest.mark.parametrize("path", _modules(),
                         ids=lambda p: p.relative_to(REPO).as_posix())
def test_module_docstring_fits_a_screen(path: Path) -> None:
    n = _docstring_lines(path)
    assert n <= MAX_DOCSTRING_LINES, (
        f"{path.relative_to(REPO)}: module docstring of {n} lines (at most "
        f"{MAX_DOCSTRING_LINES}); keep what the module is and its contract, move the design "
        "reasoning and measurements to docs/design/ or BENCHMARKS.md")


def _readme() -> list[str]:
    return (REPO / "README.md").read_text().splitlines()


def test_readme_is_a_front_page() -> None:
    n = len(_readme())
    assert n <= README_MAX_LINES, (
        f"README.md has {n} lines (at most {README_MAX_LINES}): move details into docs/")


def test_readme_quick_start_names_the_setup_commands() -> None:
    lines = _readme()
    start = next(i for i, line in enumerate(lines) if line.strip() == "## Quick start")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
               len(lines))
    section = "\n".join(lines[start:end])
    for command in QUICK_START_COMMANDS:
        assert command in section, f"the README's quick start no longer names {command!r}"
        assert (REPO / command.split()[-1]).is_file()


def test_readme_code_blocks_fit_80_columns() -> None:
    inside, wide = False, []
    for number, line in enumerate(_readme(), 1):
        if line.lstrip().startswith("```"):
            inside = not inside
        elif inside and len(line) > README_CODE_COLUMNS:
            wide.append(f"README.md:{number}: {len(line)} columns")
    assert not wide, "\n".join(wide)


def test_readme_links_resolve() -> None:
    text = "\n".join(_readme())
    missing = [target for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
               if "://" not in target and not (REPO / target).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_the_math_tutorial_prints_the_shipped_data() -> None:
    """Its `head -2` block shows the file's first two lines as they are."""
    text = (REPO / "docs" / "tutorials" / "math.md").read_text()
    shown = text.split("head -2 clients/examples/math/one_step.jsonl")[1].split("```json\n")[1]
    first = (REPO / "clients" / "examples" / "math" / "one_step.jsonl").read_text()
    assert shown.split("```")[0].splitlines() == first.splitlines()[:2]
