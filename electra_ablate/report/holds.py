"""The "What holds at CPU scale" tables: every claim the CPU-scale reports test, one row each.

Each report writes its verdicts beside its figures (`reports/<stem>/verdicts.json`: `record`), and this module joins
those of the CPU-scale sweeps (`CPU_SCALE`) into two markdown tables between markers of docs/findings.md, the
project's one results page: a short one (claim, verdict, difference, report; the sanity checks against random init
folded into one row) and the full one (the paper's numbers, each arm's pre-training, seeds). README.md gets only the
main job's table (`quick_outcome`) and the long run's headline, a paragraph that links that page
(report/headline.py). Both tables show each claim's verdict under each named CPU preset side by side (`PRESETS`:
`cpu_regime`, a 2k vocabulary and 64-token sequences; `cpu_regime_30k`, BERT's 30k vocabulary and 128-token
sequences; `cpu_long`, the 30k preset's encoder pre-trained for 250M tokens), so that a reader sees which verdicts
depend on the vocabulary and which on the length of pre-training; a preset whose reports are not committed yet says
'not run yet' for its claims, and the long run, which tests few claims, takes one column of the short table, empty
for the claims it does not test. Claims on the same arms (the long run's Table 1 claim, ELECTRA-Small beats
BERT-Small, and Table 5's ELECTRA beats BERT) stand next to each other. Every verdict names its instrument, the
tasks its GLUE mean averages over: each preset's column of the short table in its header ('`cpu_regime` (SST-2)',
the task set most of its reports use), a cell measured on other tasks in the cell, each cell of the full table in
its difference ('... on GLUE-5: CoLA, SST-2, MRPC, STS-B, RTE'), with each task's verdict beside the GLUE one where
a report recorded them; a record written before instruments were recorded is read for its claims' tasks.
The report generator refreshes them whenever it writes one of those reports into the repository's `reports/`;
`python -m electra_ablate.report.holds` rewrites them from the committed files, and `--check` only says whether
they are current (tests/test_holds.py runs that check). A CPU-scale sweep whose report is not committed yet
still lists its claims, as not run, with the command that runs them. The records and presets are
report/holds_record.py's, the two tables report/holds_tables.py's; this module writes them between the markers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from electra_ablate.common.io import write_text
from electra_ablate.report import headline
# The tables' parts, read through this module by the report and the tests.
from electra_ablate.report.holds_record import (  # noqa: F401
    CPU_LONG, CPU_SCALE, CPU_SCALE_30K, DETAIL_DOC, NOT_COMMITTED, NOT_RUN, PRESETS, RECORD, SANITY, HoldsError, Preset,
    is_cpu_scale, load_records, preset_records, preset_tasks, record, record_tasks, write_record)
from electra_ablate.report.holds_tables import summary_table, table
from electra_ablate.sweep.spec import REPO_ROOT

START = "<!-- what-holds-at-cpu-scale: written by `python -m electra_ablate.report.holds`; do not edit by hand -->"


END = "<!-- /what-holds-at-cpu-scale -->"


DETAIL_START = START.replace("what-holds-at-cpu-scale:", "what-holds-at-cpu-scale-in-full:")


DETAIL_END = END.replace("what-holds-at-cpu-scale", "what-holds-at-cpu-scale-in-full")


def replace_section(text: str, lines: Sequence[str], where: str = "README.md", start: str = START,
                    end: str = END) -> str:
    """`text` with what lies between `start` and `end` replaced by `lines`."""
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise HoldsError(f"{where} needs one `{start}` line and, after it, one `{end}` line around the table")
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    return head + start + "\n" + "\n".join(lines) + "\n" + end + tail


QUICK_START = ("<!-- quick: written by `python -m electra_ablate.report.holds` from reports/quick.md; "
               "do not edit by hand -->")


QUICK_END = "<!-- /quick -->"


QUICK_REPORT = "reports/quick.md"


def quick_outcome(report: Path) -> list[str]:
    """The main job's table as its console prints it (README's Quick start), read from its committed report: the
    first table under "GLUE dev", cells aligned, emphasis dropped."""
    text = report.read_text() if report.exists() else ""
    _, _, after = text.partition("\n## GLUE dev")
    rows = [[c.strip().strip("*") for c in line.strip().strip("|").split("|")]
            for line in after.split("\n## ")[0].splitlines() if line.startswith("| ")]
    if not rows:
        return [f"The main job's report is not committed yet ({QUICK_REPORT} once rendered)."]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return ["```text", *table, f"report: {QUICK_REPORT}", "```"]


def _from_docs(lines: Sequence[str]) -> list[str]:
    """The tables' links to reports/ as a page under docs/ must write them."""
    return [line.replace("](reports/", "](../reports/") for line in lines]


def rewritten(root: Path, report_dir: Path) -> dict[Path, tuple[str, str]]:
    """README.md and docs/findings.md under `root`: path -> (text now, text with the tables of `report_dir`)."""
    presets = preset_records(report_dir)
    long_run = _long_run_record(report_dir)
    protocol = _record(report_dir / headline.PROTOCOL / RECORD)
    readme, findings = root / "README.md", root / DETAIL_DOC
    sections = {
        findings: ((_from_docs(summary_table(*presets)), START, END),
                   (_from_docs(table(*presets)), DETAIL_START, DETAIL_END),
                   (headline.lines(long_run, f"../{headline.REPORT}", protocol, f"../{headline.PROTOCOL_REPORT}"),
                    headline.START, headline.END)),
        readme: ((quick_outcome(report_dir / "quick.md"), QUICK_START, QUICK_END),
                 (headline.summary(long_run, protocol=protocol), headline.SUMMARY_START, headline.SUMMARY_END)),
    }
    out = {}
    for path, parts in sections.items():
        text = new = path.read_text()
        for lines, start, end in parts:
            new = replace_section(new, lines, str(path), start, end)
        out[path] = (text, new)
    return out


def _long_run_record(report_dir: Path) -> dict | None:
    return _record(report_dir / CPU_LONG[0][0] / RECORD)


def _record(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def sync(root: Path = REPO_ROOT, report_dir: Path = REPO_ROOT / "reports") -> bool:
    """Rewrite the tables and headlines from the reports in `report_dir`; True when any changed."""
    changed = False
    for path, (text, new) in rewritten(root, report_dir).items():
        if new != text:
            write_text(path, new)
            changed = True
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m electra_ablate.report.holds", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help=f"only say whether the tables of {DETAIL_DOC} and README.md's headline are current "
                        "(exit 1 if not)")
    args = parser.parse_args(argv)
    where = f"{DETAIL_DOC} and README.md"
    try:
        if args.check:
            is_current = all(t == n for t, n in rewritten(REPO_ROOT, REPO_ROOT / "reports").values())
            print(f"{where}: 'What holds at CPU scale' is current" if is_current else
                  f"{where}: 'What holds at CPU scale' is out of date; run `python -m electra_ablate.report.holds`")
            return 0 if is_current else 1
        print(f"{where}: 'What holds at CPU scale' {'rewritten' if sync() else 'already current'}")
    except HoldsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
