"""The paper's published numbers: electra_ablate/report/paper_results.yaml, the one place they live, and the
row and GLUE number each variant of a sweep is compared with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path

import numpy as np
import yaml

PAPER_RESULTS = Path(__file__).with_name("paper_results.yaml")


@cache
def _paper_results(path: str) -> dict:
    return yaml.safe_load(Path(path).read_text())


def load_paper_results(path: str | Path | None = None) -> dict:
    """electra_ablate/report/paper_results.yaml: {section: {source, rows: {row: {label, glue | <task>: score}}}}."""
    return _paper_results(str(path or PAPER_RESULTS))


def paper_row(spec, label: str, paper: Mapping | None = None) -> tuple[dict | None, str | None]:
    """(row, source) a variant is compared with: its `expected_row`, else its label in the sweep's section."""
    paper = paper or load_paper_results()
    variant = spec.variant(label)
    if variant.expected_row:
        section, _, row = variant.expected_row.partition(".")
    elif spec.paper:
        section, row = spec.paper, label
    else:
        return None, None
    if section not in paper:
        raise KeyError(f"{spec.path}: paper section {section!r} is not in {PAPER_RESULTS.name}; it has {sorted(paper)}")
    return (paper[section].get("rows") or {}).get(row), paper[section]["source"]


def paper_glue(row: Mapping | None, tasks: Sequence[str]) -> tuple[float | None, bool]:
    """The paper's GLUE number for a row, or the mean of its per-task numbers over `tasks` (derived=True)."""
    if not row:
        return None, False
    if "glue" in row:
        return float(row["glue"]), False
    per_task = [row[t] for t in tasks if t in row]
    if per_task and len(per_task) == len(tasks):
        return float(np.mean(per_task)), True
    return None, False
