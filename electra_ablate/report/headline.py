"""The long run's headline, in the words README.md and docs/findings.md give it: written from its report's record.

`reports/cpu_long/verdicts.json` (report/holds_record.py) holds the main table's medians and every verdict with its
per-task verdicts and its difference without each task (report/carries.py). This module turns them into a few lines
that report/holds.py writes between the `long-run` markers of docs/findings.md (`lines`, the long run in full) and
between the `headline` markers of README.md (`summary`, one paragraph that links the findings page), so no number of
the long run is typed by hand: re-rendering the report and running `python -m electra_ablate.report.holds` rewrites
them.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

from electra_ablate.report import carries, verdicts

START = "<!-- long-run: written by `python -m electra_ablate.report.holds` from reports/cpu_long; do not edit by hand -->"


END = "<!-- /long-run -->"


REPORT = "reports/cpu_long.md"


SUMMARY_START = ("<!-- headline: written by `python -m electra_ablate.report.holds` from reports/cpu_long; "
                 "do not edit by hand -->")


SUMMARY_END = "<!-- /headline -->"


FINDINGS = "docs/findings.md"


# The long run's finals under the cut recipe and the paper's protocol (sweeps/cpu_long_protocol.yaml): its record's
# `recipes` and `agreement` (report/recipes.py) say whether each verdict survives the cuts.
PROTOCOL = "cpu_long_protocol"
PROTOCOL_REPORT = f"reports/{PROTOCOL}.md"


WIDTH = 120  # the docs' line width


def _difference(c: Mapping) -> str:
    return f"{c['estimate']:+.1f} [{c['low']:+.1f}, {c['high']:+.1f}]"


def _short(verdict: str) -> str:
    return verdict.replace(" at this scale", "")


def _carried(c: Mapping) -> str:
    """'; reversed on CoLA; without STS-B reversed, -3.7 [-6.1, -1.0]': where the tasks disagree with the mean."""
    split = verdicts.resolved_elsewhere(c["verdict"], {t: pt["verdict"] for t, pt in (c.get("per_task") or {}).items()})
    out = [split] if split else []
    out += [f"without {verdicts.glue_task_names([t])[0]} {_short(w['verdict'])}, {_difference(w)}"
            for t, w in carries.recorded_deciding(c).items()]
    return "".join(f"; {x}" for x in out)


def _glue(record: Mapping) -> str:
    medians: Mapping[str, Mapping[str, float]] = record.get("medians") or {}
    return ", ".join(f"{v} {m['glue']:.1f}" for v, m in sorted(medians.items(), key=lambda kv: -kv[1].get("glue", 0))
                     if "glue" in m)


def protocol_text(record: Mapping | None, link: str = PROTOCOL_REPORT) -> str:
    """One paragraph: the long run's GLUE medians and first verdict under each recipe of the protocol check, whether
    the verdicts agree and which task moves most; '' before its report is committed."""
    if not record or len(record.get("recipes") or {}) < 2:
        return ""
    recipes = record["recipes"]
    missing = {name: r["missing_or_failed"] for name, r in recipes.items() if r.get("missing_or_failed")}
    if missing:  # a recipe still running: its means are over other tasks than the first's, so only the verdicts
        state = "; ".join(f"`{name}` incomplete, {n} grid line(s) missing or failed" for name, n in missing.items())
    else:
        state = "; ".join(f"`{name}` GLUE-{len(r.get('tasks') or [])} {_glue(r)}" for name, r in recipes.items())
    said = []
    for a in (record.get("agreement") or [])[:1]:
        each = []
        for name, r in recipes.items():
            c = next((c for c in r.get("claims") or [] if c["claim"] == a["claim"]), None)
            if c is not None:
                each.append(f"**{_short(c['verdict'])}** under `{name}`"
                            + (f", {_difference(c)}" if c.get("estimate") is not None else ""))
        moved = f"; moved most by {a['moved_most']}" if a.get("moved_most") not in (None, "–") else ""
        on = next((c["tasks"] for r in recipes.values() for c in r.get("claims") or [] if c["claim"] == a["claim"]), [])
        said.append(f"{a['claim']}, on {verdicts.glue_label(on)}: {'; '.join(each)}"
                    f" ({'the same verdict' if a['same'] else 'not the same verdict'}{moved})")
    return (f"The same finals under the cut recipe and under the paper's fine-tuning protocol ([{link}]({link}); "
            f"{state}): " + " ".join(s + "." for s in said))


def lines(record: Mapping | None, link: str = REPORT, protocol: Mapping | None = None,
          protocol_link: str = PROTOCOL_REPORT) -> list[str]:
    """The headline as markdown lines: the arms' GLUE medians, each verdict with what carries it, and the link."""
    if not record or not record.get("claims"):
        return [f"The long run's report is not committed yet ([{link}]({link}) once rendered)."]
    medians: Mapping[str, Mapping[str, float]] = record.get("medians") or {}
    tasks: Sequence[str] = record.get("tasks") or []
    names = ", ".join(verdicts.glue_task_names(tasks))
    arms = ", ".join(f"{v} {m['glue']:.1f}" for v, m in sorted(medians.items(), key=lambda kv: -kv[1].get("glue", 0))
                     if "glue" in m)
    per_task = "; ".join(f"{name} " + " / ".join(f"{medians[v][t]:.1f}" for v in medians if t in medians[v])
                         for t, name in zip(tasks, verdicts.glue_task_names(tasks)))
    seeds = min((n for c in record["claims"] for n in (c.get("runs") or {}).values()), default=0)
    out = [f"GLUE-{len(tasks)} ({names}) medians over {seeds} fine-tuning seeds at the final checkpoints: {arms}; per task "
           f"({' / '.join(medians)}): {per_task}. One pre-training seed per arm: the intervals cover fine-tuning seeds "
           "and dev examples, not pre-training. Verdicts (95% multi-bootstrap interval, points), with the tasks that "
           "disagree and any task whose leaving out alone changes the verdict:", ""]
    for c in record["claims"]:
        if c.get("estimate") is None:
            out.append(f"- {c['claim']}: {c['verdict']}")
            continue
        out.append(f"- {c['claim']}: **{c['verdict']}**, {_difference(c)}{_carried(c)}")
    out += ["", f"Read through the `cpu_glue` fine-tuning recipe (STS-B cut to 2,500 pairs and 3 epochs); the full "
                f"report, learning curves per task and how it was made: [{link}]({link})."]
    checked = protocol_text(protocol, protocol_link)
    out += ["", checked or ("Whether these verdicts survive the paper's fine-tuning protocol (whole training sets, "
                            "10 epochs for STS-B and RTE) is the check `sweep=cpu_long_protocol`; its report "
                            f"([{protocol_link}]({protocol_link})) is not committed yet.")]
    return [w for line in out for w in (textwrap.wrap(line, WIDTH, subsequent_indent="  " if line.startswith("- ") else "",
                                                      break_on_hyphens=False) or [""])]



def summary(record: Mapping | None, findings: str = FINDINGS, link: str = REPORT,
            protocol: Mapping | None = None) -> list[str]:
    """README's headline: the long run's GLUE medians and its first claim's verdict, then the findings page."""
    more = f"Every verdict at CPU scale, what is open and what would settle it: [{findings}]({findings})."
    if not record or not record.get("claims"):
        return textwrap.wrap(f"The long run's report is not committed yet. {more}", WIDTH, break_on_hyphens=False)
    medians: Mapping[str, Mapping[str, float]] = record.get("medians") or {}
    tasks: Sequence[str] = record.get("tasks") or []
    arms = ", ".join(f"{v} {m['glue']:.1f}" for v, m in sorted(medians.items(), key=lambda kv: -kv[1].get("glue", 0))
                     if "glue" in m)
    c = record["claims"][0]
    tokens = max((a["pretraining"]["tokens"] for a in c.get("arms") or [] if a.get("pretraining")), default=0)
    seeds = min((c.get("groups") or {}).values(), default=0)
    verdict = (f"{c['claim']}: **{c['verdict']}**, {_difference(c)}{_carried(c)}" if c.get("estimate") is not None
               else f"{c['claim']}: {c['verdict']}")
    per_arm = f"{'one' if seeds == 1 else seeds} pre-training seed{'s' if seeds != 1 else ''} per arm"
    checked = protocol_text(protocol)
    text = (f"The long run ([{link}]({link}): {tokens / 1e6:.0f}M pre-training tokens for the longest arm, {per_arm}) "
            f"scores GLUE-{len(tasks)} medians {arms} through the cut `cpu_glue` recipe. {verdict}. "
            f"{checked + ' ' if checked else ''}{more}")
    return textwrap.wrap(text, WIDTH, break_on_hyphens=False)
