"""The "What holds at CPU scale" tables: every claim the CPU-scale reports test, one row each.

Each report writes its verdicts beside its figures (`reports/<stem>/verdicts.json`: `record`), and this module
joins those of the CPU-scale sweeps (`CPU_SCALE`) into two markdown tables between markers: a short one in
README.md (claim, verdict, difference, report; the sanity checks against random init folded into one row) and
the full one in docs/cpu_scale.md (the paper's numbers, each arm's pre-training, seeds). Both show each claim's
verdict under each named CPU preset side by side (`PRESETS`: `cpu_regime`, a 2k vocabulary and 64-token
sequences; `cpu_regime_30k`, BERT's 30k vocabulary and 128-token sequences), so that a reader sees which verdicts
depend on the vocabulary; a preset none of whose reports is committed yet adds no columns. Every verdict names
its instrument, the tasks its GLUE mean averages over: each preset's README column in its header ('`cpu_regime`
(SST-2)', the task set most of its reports use), a cell measured on other tasks in the cell, each cell of the full
table in its difference ('... on GLUE-5: CoLA, SST-2, MRPC, STS-B, RTE'), with each task's verdict beside the GLUE
one where a report recorded them; a record written before instruments were recorded is read for its claims' tasks.
The report generator refreshes both whenever it writes one of those reports into the repository's `reports/`;
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
from electra_ablate.report import multibootstrap as mb
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


def _numbers(d: mb.Difference | None) -> dict:
    keys = ("estimate", "low", "high", "p_sign")
    if d is None:
        return dict.fromkeys(keys)
    return dict(zip(keys, (round(x, 4) for x in (d.estimate, d.low, d.high, d.sign_probability))))


def record(spec: SweepSpec, results: Sequence[vd.Verdict], scale: Mapping[str, dict | None],
           problems: Sequence[str] = (), tasks: Sequence[str] = (), skipped: Sequence[str] = ()) -> dict:
    """What one report concluded, as data: its verdicts (on the GLUE mean of each claim's `tasks`, and per task:
    `per_task`, with each task's dev-set noise, ±1.96 sd of the difference over example-only resamples), each
    compared arm's pre-training per run (`scale`: arms.numbers; None for an arm without pre-training), how many jobs
    of its grid are missing or failed (`problems`: the report's list; the table marks such a report incomplete),
    the instrument (`tasks`: what the report's GLUE scores average over) and the tasks skipped for want of local
    data (`skipped`)."""
    claims = []
    for v in results:
        c, d = v.claim, v.difference
        arms = list(dict.fromkeys(c.better + c.worse))
        per_task = {t: {**_numbers(tv.difference), "verdict": tv.verdict, "seeds": tv.seeds, "examples": tv.examples,
                        "dev_noise": None if tv.difference is None or not tv.examples else
                        round(mb.z_score() * tv.difference.sd_examples, 4)} for t, tv in v.per_task.items()}
        claims.append({
            "claim": c.text, "figure": c.figure, "paper": c.paper, "better": list(c.better), "worse": list(c.worse),
            "tasks": list(v.tasks), "verdict": v.verdict, "resolve": v.resolve, "note": v.note, **_numbers(d),
            "groups": dict(v.groups), "runs": dict(v.runs), "per_task": per_task,
            "arms": [{"label": a, "pretraining": scale.get(a), "pretrained": vd.pretrained(spec.variant(a))}
                     for a in arms],
        })
    return {"sweep": spec.name, "scale": spec.scale, "report": f"{spec.report_name}.md", "claims": claims,
            "missing_or_failed": len(problems), "tasks": list(tasks), "skipped_tasks": list(skipped)}


def write_record(path: Path, spec: SweepSpec, results: Sequence[vd.Verdict], scale: Mapping[str, dict | None],
                 problems: Sequence[str] = (), tasks: Sequence[str] = (), skipped: Sequence[str] = ()) -> None:
    text = json.dumps(record(spec, results, scale, problems, tasks, skipped), indent=1, sort_keys=True)
    write_text(path, portable(text) + "\n")


# --- instruments: the tasks a verdict's GLUE mean averages over ------------------------------------------------


def _most_common(sets: Sequence[tuple[str, ...]]) -> tuple[str, ...]:
    """The most frequent of `sets` (the first seen among equals); () when empty."""
    return max(dict.fromkeys(sets), key=sets.count) if sets else ()


def record_tasks(r: Mapping) -> tuple[str, ...]:
    """What a report's GLUE scores average over: its `tasks`, else (a record written before they were recorded)
    the tasks most of its claims were measured on."""
    if r.get("tasks"):
        return tuple(r["tasks"])
    return _most_common([tuple(c["tasks"]) for c in r["claims"] if c.get("tasks")])


def preset_tasks(records: Sequence[Mapping]) -> tuple[str, ...]:
    """A preset's instrument as its column header names it: the task set most of its committed reports use."""
    return _most_common([t for t in (record_tasks(r) for r in records if r.get("report")) if t])


def _instrument(tasks: Sequence[str]) -> str:
    return vd.instrument(tasks) if tasks else "no runs yet"


def _per_task_verdicts(c: Mapping) -> dict[str, str]:
    return {t: pt["verdict"] for t, pt in (c.get("per_task") or {}).items()}


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
    """'+2.82 [+0.69, +5.24] on SST-2': every cell names what it was measured on."""
    names = vd.instrument(c["tasks"]) if c.get("tasks") else ""
    if c.get("estimate") is None:
        return f"– (on {names})" if names else "–"
    return f"{c['estimate']:+.2f} [{c['low']:+.2f}, {c['high']:+.2f}] on {names}"


def _verdict(c: Mapping) -> str:
    """The verdict on the GLUE mean, then each task's where there are several: '**unresolved at this scale**; per
    task: **holds** on SST-2; unresolved on CoLA, RTE'."""
    if c["verdict"] in NOT_RUN:
        return c["verdict"]
    out = f"**{c['verdict']}**" + (f" ({c['note']})" if c.get("note") else "")
    by_verdict: dict[str, list[str]] = {}
    for t, v in _per_task_verdicts(c).items():
        by_verdict.setdefault(v, []).append(t)
    parts = [(f"**{v}**" if v in vd.RESOLVED else v.replace(" at this scale", "")) + " on "
             + ", ".join(vd.glue_task_names(ts)) for v, ts in by_verdict.items()]
    return out + (f"; per task: {'; '.join(parts)}" if parts else "")


def _claim_rows(records: Sequence[Mapping]) -> tuple[dict[tuple, list], list[str], list[str]]:
    """Per claim of `records`: [claim, paper, verdict, interval, pre-training, seeds, reports], keyed by the claim,
    its arms and its estimate (a claim two reports test on the same runs, with the same estimate, is one row with
    both reports); and the lines on incomplete and not yet committed reports."""
    rows: dict[tuple, list] = {}
    pending, incomplete = [], []
    for r in records:
        link = f"[{r['report']}](reports/{r['report']})" if r.get("report") else NOT_COMMITTED
        if r.get("skipped_tasks"):
            incomplete.append(f"- [{r['report']}](reports/{r['report']}): "
                              f"{', '.join(vd.glue_task_names(r['skipped_tasks']))} skipped (no local GLUE data): its "
                              f"verdicts are on {_instrument(record_tasks(r))}")
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
        out += ["", "Incomplete reports (their verdicts use the runs and tasks that finished):", "", *incomplete]
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
    # Per claim, each preset's distinct results side by side: a claim two reports of one preset measured
    # differently (other runs or other tasks) takes a row per result, never one silently for both.
    joined: dict[tuple, tuple[list, list]] = {}
    for i, preset in enumerate((rows, second)):
        for (claim, better, worse, *_), cells in preset.items():
            joined.setdefault((claim, better, worse), ([], []))[i].append(cells)
    out_rows = []
    for results in joined.values():
        # a claim that one report of the preset ran and another not yet: the results alone
        firsts, thens = ([c for c in cells if c[2] not in NOT_RUN] or cells[:1] for cells in results)
        for k in range(max(len(firsts), len(thens))):
            first, then = (cells[k] if k < len(cells) else None for cells in (firsts, thens))
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


def _summary_rows(records: Sequence[Mapping], on: tuple[str, ...] = ()) -> tuple[dict[tuple, list], list | None, int]:
    """One preset's README cells: (claim, better, worse) -> [verdict, interval, reports], and the sanity checks
    against random init folded into one [claim, verdict counts, spread, reports]. `on`: the instrument the preset's
    column header names; a result measured on other tasks names its own, and a claim that two reports measured
    differently (other runs or other tasks) shows each result with its report, never one silently for both."""
    results: dict[tuple, list[dict]] = {}
    sanity: dict[tuple, tuple[str, float | None, tuple]] = {}  # (arm, tasks, estimate) -> (verdict, estimate, tasks)
    sanity_links: list[str] = []
    for r in records:
        link = f"[{r['report']}](reports/{r['report']})" if r.get("report") else ""  # pending: said under the table
        for c in r["claims"]:
            tasks = tuple(c.get("tasks") or ())
            if c["claim"].startswith(SANITY):
                if c["verdict"] not in NOT_RUN:  # else the note under the table names the sweep
                    sanity[(tuple(c["better"]), tasks, c.get("estimate"))] = (c["verdict"], c.get("estimate"), tasks)
                    sanity_links += [link] if link not in sanity_links else []
                continue
            entries = results.setdefault((c["claim"], tuple(c["better"]), tuple(c["worse"])), [])
            same = (tasks, c["verdict"], c.get("estimate"), c.get("low"), c.get("high"))
            match = next((e for e in entries if e["same"] == same), None)
            if match is None:
                entries.append({"same": same, "claim": c, "links": [link] if link else []})
            elif c.get("estimate") is not None and link and link not in match["links"]:
                match["links"].append(link)
    rows = {key: _summary_cells(entries, on) for key, entries in results.items()}
    if not sanity:
        return rows, None, 0
    groups: dict[tuple, list[str]] = {}  # (tasks, verdict) -> arms
    for (better, _, _), (verdict, _, tasks) in sanity.items():
        groups.setdefault((tasks, verdict), []).append("/".join(better))
    instruments = list(dict.fromkeys(tasks for tasks, _ in groups))
    named = instruments != [on]  # another instrument than the header's, or several: each group names its own

    def where(tasks: tuple) -> str:
        return f" on {_instrument(tasks)}" if named else ""
    said = "; ".join(f"**{v}** for {len(arms)}" + (f" ({', '.join(arms)})" if len(arms) <= 2 else "") + where(tasks)
                     for (tasks, v), arms in sorted(groups.items(), key=lambda kv: len(kv[1])))
    spreads = []
    for tasks in instruments:
        estimates = [e for _, e, t in sanity.values() if t == tasks and e is not None]
        if estimates:
            spreads.append(f"{min(estimates):+.1f} to {max(estimates):+.1f}" + where(tasks))
    return rows, [said, "; ".join(spreads) or "–", ", ".join(sanity_links)], len(sanity)


def _summary_cells(entries: Sequence[Mapping], on: tuple[str, ...]) -> list[str]:
    """[verdict, interval, reports] of one claim under one preset from its distinct results (`entries`): those run,
    else the first not run; each names its instrument where it is not the header's (`on`)."""
    shown = [e for e in entries if e["claim"]["verdict"] not in NOT_RUN] or list(entries[:1])
    verdicts, intervals = [], []
    for e in shown:
        c = e["claim"]
        if c["verdict"] in NOT_RUN:
            verdicts.append(c["verdict"])
            intervals.append("–")
            continue
        split = vd.resolved_elsewhere(c["verdict"], _per_task_verdicts(c))
        tasks = tuple(c.get("tasks") or ())
        where = f" on {_instrument(tasks)}" if tasks and (tasks != on or len(shown) > 1) else ""
        verdict = f"**{c['verdict']}**" + (f" ({split})" if split else "")
        if c.get("estimate") is None:
            verdicts.append(verdict + where)
            intervals.append("–")
        else:
            verdicts.append(verdict)
            intervals.append(f"{c['estimate']:+.1f} [{c['low']:+.1f}, {c['high']:+.1f}]{where}")
    if len(shown) > 1:  # say which report found which
        verdicts = [f"{v} ({', '.join(e['links'])})" for v, e in zip(verdicts, shown)]
    links = list(dict.fromkeys(link for e in shown for link in e["links"]))
    return ["; ".join(verdicts), "; ".join(intervals), ", ".join(links)]


def _sanity_claim(counts: Sequence[tuple[int, str | None]]) -> str:
    """The folded sanity row's claim: how many comparisons it folds, per preset where there are two."""
    said = ", ".join(f"{n} comparison{'s' if n != 1 else ''}" + (f" at `{preset}`" if preset else "")
                     for n, preset in counts)
    return f"{SANITY} (each pre-trained arm against random init of its shape: {said})"


def summary_table(records: Sequence[Mapping], other: Sequence[Mapping] = ()) -> list[str]:
    """The README's table: claim, verdict, difference and report, one row per claim; with `other` (the second
    preset's records, at least one report committed), each claim's verdict and difference under both presets. Each
    preset's header names its instrument (`preset_tasks`: 'SST-2', 'GLUE-5: CoLA, SST-2, MRPC, STS-B, RTE')."""
    on = preset_tasks(records)
    first, sane, n = _summary_rows(records, on)
    if not any(r.get("report") for r in other):
        rows = [[key[0], *cells] for key, cells in first.items()]
        rows += [[_sanity_claim([(n, None)]), *sane]] if sane else []
        head = ["claim", f"verdict ({_instrument(on)})" if on else "verdict", "Δ points [95% interval]", "report"]
        return markdown_table(head, rows).splitlines() + _pending_note(records)
    on2 = preset_tasks(other)
    second, sane2, n2 = _summary_rows(other, on2)
    rows = []
    for key in dict.fromkeys([*first, *second]):
        a, b = first.get(key, ["not in its sweeps", "–", ""]), second.get(key, ["not in its sweeps", "–", ""])
        rows.append([key[0], a[0], a[1], b[0], b[1], ", ".join(x for x in (a[2], b[2]) if x)])
    (p1, _, _), (p2, _, _) = PRESETS
    if sane or sane2:
        a, b = sane or ["–", "–", ""], sane2 or ["–", "–", ""]
        rows.append([_sanity_claim([(n, p1), (n2, p2)]), a[0], a[1], b[0], b[1],
                     ", ".join(x for x in (a[2], b[2]) if x)])
    head = ["claim", f"`{p1}`" + (f" ({_instrument(on)})" if on else ""), "Δ [95% interval]",
            f"`{p2}`" + (f" ({_instrument(on2)})" if on2 else ""), "Δ [95% interval]", "reports"]
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
