"""The paper's published numbers: electra_ablate/report/paper_results.yaml, the one place they live, and the
row and GLUE number each variant of a sweep is compared with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path

import numpy as np
import yaml

from electra_ablate.common.cli import CONF_DIR
from electra_ablate.common.variants import option_class

PAPER_RESULTS = Path(__file__).with_name("paper_results.yaml")
# The config groups whose options are classes that name themselves (`display_name`).
VARIANT_GROUPS = ("objective", "generator", "sharing", "weighting", "algorithm")


@cache
def _paper_results(path: str) -> dict:
    return yaml.safe_load(Path(path).read_text())


def load_paper_results(path: str | Path | None = None) -> dict:
    """electra_ablate/report/paper_results.yaml: {section: {source, rows: {row: {label, glue | <task>: score}}}}."""
    return _paper_results(str(path or PAPER_RESULTS))


def display_name(variant) -> str | None:
    """What the classes a variant's pre-training selects call themselves (their `display_name`, e.g. ELECTRA
    for objective=electra), joined over the variant groups it sets; None when it sets none."""
    names = []
    for group in VARIANT_GROUPS:
        option = variant.pretrain.get(group)
        cls = option_class(CONF_DIR, group, str(option)) if option is not None else None
        if cls is not None and getattr(cls, "display_name", None):
            names.append(cls.display_name)
    return ", ".join(names) or None


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
