"""The "What holds at CPU scale" tables: every claim the CPU-scale reports test, one row each.

Each report writes its verdicts beside its figures (`reports/<stem>/verdicts.json`: `record`), and this module
joins those of the CPU-scale sweeps (`CPU_SCALE`) into two markdown tables between markers: a short one in
README.md (claim, verdict, difference, report; the sanity checks against random init folded into one row) and
the full one in docs/cpu_scale.md (the paper's numbers, each arm's pre-training, seeds). Both show each claim's
verdict under each named CPU preset side by side (`PRESETS`: `cpu_regime`, a 2k vocabulary and 64-token
sequences; `cpu_regime_30k`, BERT's 30k vocabulary and 128-token sequences), so that a reader sees which verdicts
depend on the vocabulary; a preset none of whose reports is committed yet adds no columns. The report generator
refreshes both whenever it writes one of those reports into the repository's `reports/`;
`python -m electra_ablate.report.holds` rewrites them from the committed files, and `--check` only says whether
they are current (tests/test_holds.py runs that check). A CPU-scale sweep whose report is not committed yet
still lists its claims, as not run, with the command that runs them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from electra_ablate.common.io import write_text
from electra_ablate.common.portable import portable
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
DETAIL_START = START.replace("what-holds-at-cpu-scale:", "what-holds-at-cpu-scale-in-full:")
DETAIL_END = END.replace("what-holds-at-cpu-scale", "what-holds-at-cpu-scale-in-full")
DETAIL_DOC = "docs/cpu_scale.md"
SANITY = "Pre-training beats no pre-training"
NOT_RUN = ("not run yet", "not run")
NOT_COMMITTED = "not committed yet"
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
    write_text(path, portable(json.dumps(record(spec, results, scale, problems), indent=1, sort_keys=True)) + "\n")


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
    if c["verdict"] in NOT_RUN:
        return c["verdict"]
    return f"**{c['verdict']}**" + (f" ({c['note']})" if c.get("note") else "")


def _claim_rows(records: Sequence[Mapping]) -> tuple[dict[tuple, list], list[str], list[str]]:
    """Per claim of `records`: [claim, paper, verdict, interval, pre-training, seeds, reports], keyed by the claim,
    its arms and its estimate (a claim two reports test on the same runs, with the same estimate, is one row with
    both reports); and the lines on incomplete and not yet committed reports."""
    rows: dict[tuple, list] = {}
    pending, incomplete = [], []
    for r in records:
        link = f"[{r['report']}](reports/{r['report']})" if r.get("report") else NOT_COMMITTED
        if r.get("missing_or_failed"):
            link += " (incomplete)"
            incomplete.append(f"- [{r['report']}](reports/{r['report']}): {r['missing_or_failed']} jobs of its grid "
                              f"missing or failed (the report lists them); `{_command(r['sweep'], r['scale'])}` "
                              "runs what is missing")
        if not r.get("report"):
            pending.append(f"- {_sweep_label(r)}: `{r['command']}`")
        for c in r["claims"]:
            key = (c["claim"], tuple(c["better"]), tuple(c["worse"]), c.get("estimate"), c.get("low"), c.get("high"))
            if key in rows and c.get("estimate") is not None:
                rows[key][-1] += f", {link}"
                continue
            paper = c["figure"] + (f": {c['paper']}" if c.get("paper") else "")
            rows[key] = [c["claim"], paper, _verdict(c), _interval(c),
                         _arms(c["arms"]) if c.get("arms") else "–", _seeds(c) if c.get("runs") else "–", link]
    return rows, pending, incomplete


def _sweep_label(r: Mapping) -> str:
    """'`table5_efficiency` at scale `cpu_30k`' (the sweep alone at its default scale)."""
    return f"`{r['sweep']}`" + ("" if r["scale"] is None else f" at scale `{r['scale']}`")


def _notes(pending: Sequence[str], incomplete: Sequence[str]) -> list[str]:
    out = []
    if incomplete:
        out += ["", "Incomplete reports (their verdicts use the runs that finished):", "", *incomplete]
    if pending:
        out += ["", f"Not run yet (each resumes where it stopped; what each preset's sweeps cost is in {DETAIL_DOC}'s "
                "section on that preset):", "", *pending]
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
                         ", ".join(link for link in (pair[0][6], pair[1][6]) if link not in ("–", NOT_COMMITTED))
                         or NOT_COMMITTED])
    (p1, what1, _), (p2, what2, _) = PRESETS
    head = ["claim", "paper (GLUE)", f"verdict: `{p1}` ({what1})", "Δ points [95% interval]",
            f"verdict: `{p2}` ({what2})", "Δ points [95% interval]", f"pre-training per run ({p1}; {p2})",
            f"runs, pre-training x fine-tuning seeds ({p1}; {p2})", "reports"]
    return markdown_table(head, out_rows).splitlines() + _notes([*pending, *pending2], [*incomplete, *incomplete2])


def preset_records(report_dir: Path = REPO_ROOT / "reports") -> tuple[list[dict], list[dict]]:
    """Each preset's records (PRESETS, in order) from the reports committed in `report_dir`."""
    (_, _, first), (_, _, second) = PRESETS
    return load_records(report_dir, first), load_records(report_dir, second)


def _summary_rows(records: Sequence[Mapping]) -> tuple[dict[tuple, list], list | None, int]:
    """One preset's README cells: (claim, better, worse) -> [verdict, interval, reports] (a claim on the same runs
    once), and the sanity checks against random init folded into one [claim, verdict counts, spread, reports]."""
    rows: dict[tuple, list] = {}
    sanity: dict[tuple, tuple[str, float | None]] = {}  # (arm, estimate) -> (verdict, estimate)
    sanity_links: list[str] = []
    for r in records:
        link = f"[{r['report']}](reports/{r['report']})" if r.get("report") else ""  # pending: said under the table
        for c in r["claims"]:
            if c["claim"].startswith(SANITY):
                if c["verdict"] not in NOT_RUN:  # else the note under the table names the sweep
                    sanity[(tuple(c["better"]), c.get("estimate"))] = (c["verdict"], c.get("estimate"))
                    sanity_links += [link] if link not in sanity_links else []
                continue
            key = (c["claim"], tuple(c["better"]), tuple(c["worse"]))
            if key in rows:
                if c.get("estimate") is not None and link not in rows[key][-1]:
                    rows[key][-1] = ", ".join(x for x in (rows[key][-1], link) if x)
                continue
            interval = "–" if c.get("estimate") is None else \
                f"{c['estimate']:+.1f} [{c['low']:+.1f}, {c['high']:+.1f}]"
            rows[key] = [c["verdict"] if c["verdict"] in NOT_RUN else f"**{c['verdict']}**", interval, link]
    if not sanity:
        return rows, None, 0
    counts: dict[str, list[str]] = {}
    for (better, _), (verdict, _) in sanity.items():
        counts.setdefault(verdict, []).append("/".join(better))
    said = "; ".join(f"**{v}** for {len(arms)}" + (f" ({', '.join(arms)})" if len(arms) <= 2 else "")
                     for v, arms in sorted(counts.items(), key=lambda kv: len(kv[1])))
    estimates = [e for _, e in sanity.values() if e is not None]
    spread = f"{min(estimates):+.1f} to {max(estimates):+.1f}" if estimates else "–"
    return rows, [said, spread, ", ".join(sanity_links)], len(sanity)


def _sanity_claim(counts: Sequence[tuple[int, str | None]]) -> str:
    """The folded sanity row's claim: how many comparisons it folds, per preset where there are two."""
    said = ", ".join(f"{n} comparison{'s' if n != 1 else ''}" + (f" at `{preset}`" if preset else "")
                     for n, preset in counts)
    return f"{SANITY} (each pre-trained arm against random init of its shape: {said})"


def summary_table(records: Sequence[Mapping], other: Sequence[Mapping] = ()) -> list[str]:
    """The README's table: claim, verdict, difference and report, one row per claim; with `other` (the second
    preset's records, at least one report committed), each claim's verdict and difference under both presets."""
    first, sane, n = _summary_rows(records)
    if not any(r.get("report") for r in other):
        rows = [[key[0], *cells] for key, cells in first.items()]
        rows += [[_sanity_claim([(n, None)]), *sane]] if sane else []
        return (markdown_table(["claim", "verdict", "Δ points [95% interval]", "report"], rows).splitlines()
                + _pending_note(records))
    second, sane2, n2 = _summary_rows(other)
    rows = []
    for key in dict.fromkeys([*first, *second]):
        a, b = first.get(key, ["not in its sweeps", "–", ""]), second.get(key, ["not in its sweeps", "–", ""])
        rows.append([key[0], a[0], a[1], b[0], b[1], ", ".join(x for x in (a[2], b[2]) if x)])
    (p1, _, _), (p2, _, _) = PRESETS
    if sane or sane2:
        a, b = sane or ["–", "–", ""], sane2 or ["–", "–", ""]
        rows.append([_sanity_claim([(n, p1), (n2, p2)]), a[0], a[1], b[0], b[1],
                     ", ".join(x for x in (a[2], b[2]) if x)])
    head = ["claim", f"`{p1}`", "Δ [95% interval]", f"`{p2}`", "Δ [95% interval]", "reports"]
    return markdown_table(head, rows).splitlines() + _pending_note([*records, *other])


def _pending_note(records: Sequence[Mapping]) -> list[str]:
    """The README's one line under its table on the sweeps not run yet (their commands are in the full table)."""
    pending = [_sweep_label(r) for r in records if not r.get("report")]
    if not pending:
        return []
    return ["", f"Not run yet: {', '.join(pending)}; each sweep's command is under the full table in "
                f"[{DETAIL_DOC}]({DETAIL_DOC}#every-verdict-at-cpu-scale)."]


def replace_section(text: str, lines: Sequence[str], where: str = "README.md", start: str = START,
                    end: str = END) -> str:
    """`text` with what lies between `start` and `end` replaced by `lines`."""
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise HoldsError(f"{where} needs one `{start}` line and, after it, one `{end}` line around the table")
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    return head + start + "\n" + "\n".join(lines) + "\n" + end + tail


def rewritten(root: Path, report_dir: Path) -> dict[Path, tuple[str, str]]:
    """README.md and the detail document under `root`: path -> (text now, text with the tables of `report_dir`)."""
    records, other = preset_records(report_dir)
    readme, detail = root / "README.md", root / DETAIL_DOC
    out = {}
    for path, lines, start, end in ((readme, summary_table(records, other), START, END),
                                    (detail, table(records, other), DETAIL_START, DETAIL_END)):
        text = path.read_text()
        out[path] = (text, replace_section(text, lines, str(path), start, end))
    return out


def sync(root: Path = REPO_ROOT, report_dir: Path = REPO_ROOT / "reports") -> bool:
    """Rewrite both tables from the reports in `report_dir`; True when either changed."""
    changed = False
    for path, (text, new) in rewritten(root, report_dir).items():
        if new != text:
            write_text(path, new)
            changed = True
    return changed


def is_cpu_scale(spec: SweepSpec) -> bool:
    """Whether `spec`'s report is one the table joins (same sweep, same report file)."""
    return any(spec.name == name and spec.report_name == load_sweep(name, scale).report_name
               for _, _, sweeps in PRESETS for name, scale in sweeps)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m electra_ablate.report.holds", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help=f"only say whether the tables of README.md and {DETAIL_DOC} are current (exit 1 if not)")
    args = parser.parse_args(argv)
    where = f"README.md and {DETAIL_DOC}"
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
