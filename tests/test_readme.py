"""The README's first screen: a quick start of 40 lines or fewer that holds the set-up and main-job commands,
and an outcome block whose every number is in the committed report of that job."""

from __future__ import annotations

import re

from electra_ablate.common.portable import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end != -1 else len(README)]


def test_the_quick_start_fits_a_screen_and_holds_both_commands():
    quick = section("Quick start")
    assert len(quick.rstrip("\n").splitlines()) <= 40, "the README's Quick start is over 40 lines"
    assert "bash setup.sh && . .venv/bin/activate\npython -m electra_ablate.sweep sweep=quick\n" in quick


def test_the_outcome_shown_is_the_committed_report_of_the_main_job():
    (block,) = re.findall(r"```text\n(quick \(scale tiny\).*?)```", section("Quick start"), re.S)
    report = (REPO_ROOT / "reports" / "quick.md").read_text()
    numbers = re.findall(r"[-+]?\d+\.\d+", block)
    assert numbers, block
    missing = [n for n in numbers if n not in report]
    assert not missing, f"numbers in the README's outcome that reports/quick.md does not hold: {missing}"
    assert block.rstrip().endswith("report: reports/quick.md")
