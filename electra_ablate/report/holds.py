"""The README's "What holds at CPU scale" table: every claim the CPU-scale reports test, one row each.

Each report writes its verdicts beside its figures (`reports/<stem>/verdicts.json`: `record`), and this module
joins those of the CPU-scale sweeps (`CPU_SCALE`) into one markdown table between two markers in README.md.
Its verdicts stand under each named CPU preset side by side (`PRESETS`: `cpu_regime`, a 2k vocabulary and
64-token sequences; `cpu_regime_30k`, BERT's 30k vocabulary and 128-token sequences), so that a reader sees which
verdicts depend on the vocabulary; a preset none of whose reports is committed yet adds no columns.
The report generator refreshes it whenever it writes one of those reports into the repository's `reports/`;
`python -m electra_ablate.report.holds` rewrites it from the committed files, and `--check` only says whether
it is current (tests/test_holds.py runs that check). A CPU-scale sweep whose report is not committed yet
still lists its claims, as not run, with the command that runs them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from electra_ablate.common.io import write_text
from electra_ablate.report import verdicts as vd
from electra_ablate.report.paper import load_paper_results
from electra_ablate.report.tables import table as markdown_table
from electra_ablate.sweep.spec import REPO_ROOT, SweepSpec, load_sweep

# (sweep, scale) of the reports the table joins, in the order it lists them: the regime's own evidence first
# (the floor every table stands on), then the paper's ablation tables at CPU scale.
CPU_SCALE: tuple[tuple[str, str | None], ...] = (
    ("cpu_regime", None),  # None: the file's default scale
    ("table5_efficiency", "cpu"),
    ("weight_sharing", "cpu"),
    ("generator_size", "cpu"),
    ("training_algorithms", "cpu"),
)
# The same sweeps on the preset at the paper's vocabulary (conf/experiment/cpu_regime_30k.yaml).
CPU_SCALE_30K: tuple[tuple[str, str | None], ...] = (
    ("cpu_regime_30k", None),
    ("table5_efficiency", "cpu_30k"),
    ("weight_sharing", "cpu_30k"),
    ("generator_size", "cpu_30k"),
    ("training_algorithms", "cpu_30k"),
)
# (preset, what sets it apart, its reports), in the order of the table's columns.
PRESETS = (("cpu_regime", "2k vocabulary, sequence 64", CPU_SCALE),
           ("cpu_regime_30k", "30k vocabulary, sequence 128", CPU_SCALE_30K))
START = "<!-- what-holds-at-cpu-scale: written by `python -m electra_ablate.report.holds`; do not edit by hand -->"
END = "<!-- /what-holds-at-cpu-scale -->"
RECORD = "verdicts.json"


class HoldsError(ValueError):
    """The README has no place for the table, or a record cannot be read."""


def record(spec: SweepSpec, results: Sequence[vd.Verdict], scale: Mapping[str, dict | None],
           problems: Sequence[str] = ()) -> dict:
    """What one report concluded, as data: its verdicts, each compared arm's pre-training per run (`scale`:
    arms.numbers; None for an arm without pre-training) and how many jobs of its grid are missing or failed
    (`problems`: the report's list; the table marks such a report incomplete)."""
    claims = []
    for v in results:
        c, d = v.claim, v.difference
        arms = list(dict.fromkeys(c.better + c.worse))
        claims.append({
            "claim": c.text, "figure": c.figure, "paper": c.paper, "better": list(c.better), "worse": list(c.worse),
            "tasks": list(v.tasks), "verdict": v.verdict, "resolve": v.resolve, "note": v.note,
            "estimate": None if d is None else round(d.estimate, 4),
            "low": None if d is None else round(d.low, 4),
            "high": None if d is None else round(d.high, 4),
            "p_sign": None if d is None else round(d.sign_probability, 4),
            "groups": dict(v.groups), "runs": dict(v.runs),
            "arms": [{"label": a, "pretraining": scale.get(a), "pretrained": vd.pretrained(spec.variant(a))}
                     for a in arms],
        })
    return {"sweep": spec.name, "scale": spec.scale, "report": f"{spec.report_name}.md", "claims": claims,
            "missing_or_failed": len(problems)}


def write_record(path: Path, spec: SweepSpec, results: Sequence[vd.Verdict], scale: Mapping[str, dict | None],
                 problems: Sequence[str] = ()) -> None:
    write_text(path, json.dumps(record(spec, results, scale, problems), indent=1, sort_keys=True) + "\n")


def _command(name: str, scale: str | None) -> str:
    return (f"OMP_NUM_THREADS=1 python -m electra_ablate.sweep sweep={name}{_scale_arg(scale)} "
            "hydra/launcher=joblib hydra.launcher.n_jobs=2")


def _scale_arg(scale: str | None) -> str:
    return "" if scale is None else f" scale={scale}"


def _pending(name: str, scale: str | None) -> dict:
    """A record for a sweep whose report is not committed: its claims, none of them run."""
    spec = load_sweep(name, scale)
    claims = [{"claim": c.text, "figure": c.figure, "paper": c.paper, "better": list(c.better),
               "worse": list(c.worse), "verdict": "not run yet"} for c in vd.sweep_claims(spec, load_paper_results())]
    return {"sweep": spec.name, "scale": scale, "report": None, "claims": claims, "command": _command(name, scale)}


def load_records(report_dir: Path, sweeps: Sequence[tuple[str, str | None]] = CPU_SCALE) -> list[dict]:
    out = []
    for name, scale in sweeps:
        stem = load_sweep(name, scale).report_name
        path = report_dir / stem / RECORD
        if not (report_dir / f"{stem}.md").is_file() or not path.is_file():
            out.append(_pending(name, scale))
            continue
        try:
            out.append(json.loads(path.read_text()))
        except json.JSONDecodeError as e:
            raise HoldsError(f"{path} is not JSON ({e}); re-make it with `python -m electra_ablate.report "
                             f"sweep={name}{_scale_arg(scale)}`") from e
    return out


def _tokens(n: float) -> str:
    return f"{n / 1e6:.1f}M"


def _arms(arms: Sequence[Mapping]) -> str:
    """'electra 40.5M tokens, bert 49.2M tokens; 2e+14 FLOPs each' (FLOPs once when they agree to 2 digits)."""
    pre = [a["pretraining"] for a in arms if a["pretraining"]]
    flops = {f"{n['flops']:.2g}" for n in pre if n.get("flops")}
    parts = [f"{a['label']} {_tokens(a['pretraining']['tokens'])} tokens" if a["pretraining"] else
             f"{a['label']} not run yet" if a.get("pretrained", False) else f"{a['label']} not pre-trained" for a in arms]
    if len(flops) == 1 and all(n.get("flops") for n in pre):
        return ", ".join(parts) + f"; {flops.pop()} FLOPs" + (" each" if len(pre) > 1 else "")
    return ", ".join(p + (f" ({a['pretraining']['flops']:.2g} FLOPs)" if (a["pretraining"] or {}).get("flops") else "")
                     for p, a in zip(parts, arms))


def _seeds(c: Mapping) -> str:
    """'3 x 5' (pre-training x fine-tuning seeds) per pre-trained arm, the run count of an arm without
    pre-training (each of its runs draws its own encoder); once when every arm has the same."""
    parts = []
    for a in c["arms"]:
        label, groups, runs = a["label"], c["groups"].get(a["label"]), c["runs"].get(a["label"])
        if groups is None or runs is None:
            return "–"
        parts.append(f"{groups} x {runs // groups}" if a["pretraining"] else f"{runs} runs")
    return parts[0] if len(set(parts)) == 1 else " / ".join(parts)


def _interval(c: Mapping) -> str:
    if c.get("estimate") is None:
        return "–"
    names = ", ".join(vd.glue_task_names(c["tasks"]))
    return f"{c['estimate']:+.2f} [{c['low']:+.2f}, {c['high']:+.2f}] on {names}"


def _verdict(c: Mapping) -> str:
    if c["verdict"] in ("not run yet", "not run"):
        return c["verdict"]
    return f"**{c['verdict']}**" + (f" ({c['note']})" if c.get("note") else "")


def _claim_rows(records: Sequence[Mapping]) -> tuple[dict[tuple, list], list[str], list[str]]:
    """Per claim of `records`: [claim, paper, verdict, interval, pre-training, seeds, reports], keyed by the claim,
    its arms and its estimate (a claim two reports test on the same runs, with the same estimate, is one row with
    both reports); and the lines on incomplete and not yet committed reports."""
    rows: dict[tuple, list] = {}
    pending, incomplete = [], []
    for r in records:
        link = f"[{r['report']}](reports/{r['report']})" if r.get("report") else "not committed yet"
        if r.get("missing_or_failed"):
            link += " (incomplete)"
            incomplete.append(f"- [{r['report']}](reports/{r['report']}): {r['missing_or_failed']} jobs of its grid "
                              f"missing or failed (the report lists them); `{_command(r['sweep'], r['scale'])}` "
                              "runs what is missing")
        if not r.get("report"):
            at = "" if r["scale"] is None else f" at scale `{r['scale']}`"
            pending.append(f"- `{r['sweep']}`{at}: `{r['command']}`")
        for c in r["claims"]:
            key = (c["claim"], tuple(c["better"]), tuple(c["worse"]), c.get("estimate"), c.get("low"), c.get("high"))
            if key in rows and c.get("estimate") is not None:
                rows[key][-1] += f", {link}"
                continue
            paper = c["figure"] + (f": {c['paper']}" if c.get("paper") else "")
            rows[key] = [c["claim"], paper, _verdict(c), _interval(c),
                         _arms(c["arms"]) if c.get("arms") else "–", _seeds(c) if c.get("runs") else "–", link]
    return rows, pending, incomplete


def _notes(pending: Sequence[str], incomplete: Sequence[str]) -> list[str]:
    out = []
    if incomplete:
        out += ["", "Incomplete reports (their verdicts use the runs that finished):", "", *incomplete]
    if pending:
        out += ["", "Not run yet (each sized at about 3 hours of two cores on its own, longer beside other work; "
                "it resumes where it stopped):", "", *pending]
    return out


def table(records: Sequence[Mapping], other: Sequence[Mapping] = ()) -> list[str]:
    """The markdown between the markers: one row per claim. `records` are the first preset's (PRESETS); with
    `other`, the second preset's, of which at least one report is committed, each claim's verdict under both
    presets side by side (a claim is the same where its text and arms are)."""
    rows, pending, incomplete = _claim_rows(records)
    if not any(r.get("report") for r in other):
        head = ["claim", "paper (GLUE)", "verdict here", "Δ points [95% interval]", "pre-training per run",
                "runs (pre-training x fine-tuning seeds)", "report"]
        return markdown_table(head, list(rows.values())).splitlines() + _notes(pending, incomplete)
    second, pending2, incomplete2 = _claim_rows(other)
    joined: dict[tuple, list] = {}
    for (claim, better, worse, *_), cells in rows.items():
        joined.setdefault((claim, better, worse), [cells, None])
    for (claim, better, worse, *_), cells in second.items():
        slot = joined.setdefault((claim, better, worse), [None, None])
        if slot[1] is None:
            slot[1] = cells
    out_rows = []
    for first, then in joined.values():
        base = first or then
        pair = [c or [None, None, "not in its sweeps", "–", "–", "–", "–"] for c in (first, then)]
        out_rows.append([base[0], base[1], pair[0][2], pair[0][3], pair[1][2], pair[1][3],
                         f"{pair[0][4]}; {pair[1][4]}", f"{pair[0][5]}; {pair[1][5]}",
                         ", ".join(link for link in (pair[0][6], pair[1][6]) if link != "–")])
    (p1, what1, _), (p2, what2, _) = PRESETS
    head = ["claim", "paper (GLUE)", f"verdict: `{p1}` ({what1})", "Δ points [95% interval]",
            f"verdict: `{p2}` ({what2})", "Δ points [95% interval]", f"pre-training per run ({p1}; {p2})",
            f"runs, pre-training x fine-tuning seeds ({p1}; {p2})", "reports"]
    return markdown_table(head, out_rows).splitlines() + _notes([*pending, *pending2], [*incomplete, *incomplete2])


def current(report_dir: Path = REPO_ROOT / "reports") -> list[str]:
    """The table of every preset's reports committed in `report_dir`."""
    (_, _, first), (_, _, second) = PRESETS
    return table(load_records(report_dir, first), load_records(report_dir, second))


def replace_section(text: str, lines: Sequence[str], where: str = "README.md") -> str:
    """`text` with what lies between START and END replaced by `lines`."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise HoldsError(f"{where} needs one `{START}` line and, after it, one `{END}` line around the table")
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    return head + START + "\n" + "\n".join(lines) + "\n" + END + tail


def sync(readme: Path = REPO_ROOT / "README.md", report_dir: Path = REPO_ROOT / "reports") -> bool:
    """Rewrite the README's table from the reports in `report_dir`; True when it changed."""
    text = readme.read_text()
    new = replace_section(text, current(report_dir), str(readme))
    if new != text:
        write_text(readme, new)
    return new != text


def is_cpu_scale(spec: SweepSpec) -> bool:
    """Whether `spec`'s report is one the table joins (same sweep, same report file)."""
    return any(spec.name == name and spec.report_name == load_sweep(name, scale).report_name
               for _, _, sweeps in PRESETS for name, scale in sweeps)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m electra_ablate.report.holds", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether README.md's table is current (exit 1 if not)")
    args = parser.parse_args(argv)
    readme, reports = REPO_ROOT / "README.md", REPO_ROOT / "reports"
    try:
        if args.check:
            is_current = replace_section(readme.read_text(), current(reports)) == readme.read_text()
            print("README.md: 'What holds at CPU scale' is current" if is_current else
                  "README.md: 'What holds at CPU scale' is out of date; run `python -m electra_ablate.report.holds`")
            return 0 if is_current else 1
        print(f"README.md: 'What holds at CPU scale' {'rewritten' if sync(readme, reports) else 'already current'}")
    except HoldsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
