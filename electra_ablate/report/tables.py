"""The one markdown table writer of the reports (markdown.py's sections, the verdicts, the README's
"What holds" table): a header row, its rule and one line per row, every cell as str(); and the cells' formats."""

from __future__ import annotations

from collections.abc import Sequence

from electra_ablate.report.collect import is_missing

TASK_NAMES = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP", "mnli": "MNLI",
              "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}


def fmt(x, digits: int = 1) -> str:
    return "–" if is_missing(x) else f"{x:.{digits}f}"


def signed(x, digits: int = 1) -> str:
    return "–" if is_missing(x) else f"{x:+.{digits}f}"


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
