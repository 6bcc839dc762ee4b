"""The README's first screen: a quick start of 40 lines or fewer that holds the set-up and main-job commands,
an outcome table whose every cell is the committed report's, and a README of 80 lines or fewer whose results are
the generated headline that links docs/findings.md."""

from __future__ import annotations

import re

from electra_ablate.common.portable import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end != -1 else len(README)]


def markdown_rows(text: str) -> dict[str, list[str]]:
    """A markdown table's rows by their first cell, each row's cells stripped of emphasis."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
            rows.setdefault(cells[0], cells)
    return rows


def test_the_readme_fits_80_lines_and_links_the_results_page():
    assert len(README.rstrip("\n").splitlines()) <= 80, "README.md is over 80 lines: move the detail to docs/"
    assert "](docs/findings.md)" in section("What holds at CPU scale")


def test_the_quick_start_fits_a_screen_and_holds_both_commands():
    quick = section("Quick start")
    assert len(quick.rstrip("\n").splitlines()) <= 40, "the README's Quick start is over 40 lines"
    assert "bash setup.sh && . .venv/bin/activate\npython -m electra_ablate.sweep sweep=quick\n" in quick
    assert "`python -m pytest -q`" in quick


def test_the_outcome_shown_is_the_committed_report_of_the_main_job():
    """Cell by cell: each row of the README's console table is the report's row of the same variant."""
    (block,) = re.findall(r"```text\n(.*?)```", section("Quick start"), re.S)
    lines = block.rstrip().splitlines()
    assert lines[-1] == "report: reports/quick.md"
    head, *rows = [re.split(r" {2,}", line.strip()) for line in lines[:-1]]
    report = markdown_rows((REPO_ROOT / "reports" / "quick.md").read_text())
    assert head == report["variant"], (head, report["variant"])
    assert rows, block
    for cells in rows:
        assert cells == report.get(cells[0]), f"the README's row differs from reports/quick.md's: {cells}"
