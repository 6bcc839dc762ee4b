"""What a report says, in a screen of plain text: the command that writes the report prints it at its end (the
main table, the tasks skipped for want of local data, the warnings about arms that learned nothing, each verdict on
one line under the tasks it was measured on, with the tasks that resolve it otherwise, and the report's path), from
the same tables and verdicts the markdown is rendered from.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

from electra_ablate.report import carries, markdown, verdicts
from electra_ablate.report.collect import SweepData
from electra_ablate.report.stats import Summary

WIDTH = 110  # a warning's paragraph, wrapped for a terminal
_MARKUP = re.compile(r"\*\*|`")  # bold and code marks; a lone * is the tables' "derived" mark
_LINK = re.compile(r"\[([^\]]+)\]\([^)]+\)")


def plain(text: str) -> str:
    """Markdown bold, code marks and links as plain text."""
    return _MARKUP.sub("", _LINK.sub(r"\1", text))


def aligned(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """A table as aligned text columns, two spaces apart."""
    cells = [[plain(str(c)) for c in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]


def verdict_line(v: verdicts.Verdict, measured_on: Sequence[str] = ()) -> str:
    """'holds       <claim>: +2.8 [+0.7, +5.2]' on the instrument the header names (`measured_on`), else with its own
    ('... on SST-2'), and the tasks that resolve it otherwise ('; holds on SST-2'); or why there is no number."""
    name = v.verdict.replace(" at this scale", "")
    if v.difference is None:
        return f"{name:<11} {v.claim.text}: {v.note or 'needs ' + v.resolve}"
    d = v.difference
    on = "" if tuple(v.tasks) == tuple(measured_on) else f" on {verdicts.instrument(v.tasks)}"
    split = verdicts.resolved_elsewhere(v.verdict, {t: tv.verdict for t, tv in v.per_task.items()})
    rests = carries.phrase(v.verdict, v.without)
    return (f"{name:<11} {v.claim.text}: {d.estimate:+.1f} [{d.low:+.1f}, {d.high:+.1f}]{on}"
            + (f"; {split}" if split else "") + (f"; {rests}" if rests else ""))


def measured_on(results: Sequence[verdicts.Verdict], tasks: Sequence[str]) -> tuple[str, ...]:
    """The tasks most verdicts average over (else the report's tasks): what the console's verdict header names."""
    sets = [tuple(v.tasks) for v in results if v.tasks]
    return max(dict.fromkeys(sets), key=sets.count) if sets else tuple(tasks)


def lines(data: SweepData, summary: Summary, health: Mapping, paper: Mapping, results: Sequence[verdicts.Verdict],
          report: Path) -> list[str]:
    spec = data.ctx.spec
    out = [f"{spec.name} (scale {spec.scale_name}): {spec.description}"]
    if summary.tasks:
        out += [f"{verdicts.glue_label(summary.tasks)} dev, median over fine-tuning seeds:", ""]
        out += ["  " + row for row in aligned(*markdown.glue_table(spec, summary, health, paper))]
    else:
        out.append("No fine-tuning run of a final checkpoint has finished yet.")
    if data.skipped:
        out.append(f"skipped {', '.join(markdown.TASK_NAMES[t] for t in data.skipped)}: no local GLUE data under "
                   f"{data.glue_dir}")
    out += [""] + [textwrap.fill(plain(w), WIDTH, subsequent_indent="  ")
                   for w in markdown.degenerate_warnings(data, health) if w]
    if results:
        on = measured_on(results, summary.tasks)
        out += [f"verdicts{f' on {verdicts.instrument(on)}' if on else ''} (95% multi-bootstrap interval, points):"]
        out += ["  " + verdict_line(v, on) for v in results]
        if len(spec.pretrain_seeds) < 2:  # what the intervals can and cannot say
            out.append(textwrap.fill("one pre-training seed per arm: the intervals cover fine-tuning seeds and dev "
                                     "examples, not pre-training; a verdict is about these networks, not their "
                                     "objectives", WIDTH, initial_indent="  ", subsequent_indent="  "))
    if data.problems:
        out.append(f"{len(data.problems)} failed or missing run(s): listed in the report")
    return out + [f"report: {report}"]
