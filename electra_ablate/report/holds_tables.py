"""The two "What holds at CPU scale" tables (report/holds.py) from each preset's records (report/holds_record.py):
the full one (`table`: the paper's numbers, every verdict with its interval and instrument, each arm's
pre-training, seeds) and the short one (`summary_table`: verdict and difference per preset, the
sanity checks against random init folded into one row), each claim under every preset side by side; both are
docs/findings.md's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from electra_ablate.report import carries
from electra_ablate.report import verdicts as vd
from electra_ablate.report.holds_record import (NOT_COMMITTED, NOT_RUN, PRESETS, PRESETS_DOC, SANITY, Preset,
                                                _by_arms, _command, _instrument, _per_task_verdicts, _sweep_label,
                                                preset_tasks, record_tasks)
from electra_ablate.report.tables import table as markdown_table

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


def _notes(pending: Sequence[str], incomplete: Sequence[str]) -> list[str]:
    out = []
    if incomplete:
        out += ["", "Incomplete reports (their verdicts use the runs and tasks that finished):", "", *incomplete]
    if pending:
        out += ["", f"Not run yet (each resumes where it stopped; what each preset's sweeps cost is in "
                f"[{PRESETS_DOC}](../{PRESETS_DOC})):", "", *pending]
    return out


NOT_IN = [None, None, "not in its sweeps", "–", "–", "–", "–"]  # a claim a preset's sweeps do not test


def table(*presets: Sequence[Mapping]) -> list[str]:
    """The markdown between the markers: one row per claim. Each of `presets` is one preset's records (PRESETS, in
    order); with several, each claim's verdict under every preset side by side (a claim is the same where its text
    and arms are), 'not in its sweeps' where a preset's sweeps do not test it, 'not run yet' where they do and its
    report is not committed."""
    rows, pending, incomplete = _claim_rows(presets[0] if presets else ())
    if len(presets) <= 1:
        head = ["claim", "paper (GLUE)", "verdict here", "Δ points [95% interval]", "pre-training per run",
                "runs (pre-training x fine-tuning seeds)", "report"]
        return markdown_table(head, list(rows.values())).splitlines() + _notes(pending, incomplete)
    per_preset = [rows]
    for records in presets[1:]:
        more, pending_more, incomplete_more = _claim_rows(records)
        per_preset.append(more)
        pending, incomplete = [*pending, *pending_more], [*incomplete, *incomplete_more]
    # Per claim, each preset's distinct results side by side: a claim two reports of one preset measured
    # differently (other runs or other tasks) takes a row per result, never one silently for both.
    joined: dict[tuple, list[list]] = {}
    for i, preset in enumerate(per_preset):
        for (claim, better, worse, *_), cells in preset.items():
            joined.setdefault((claim, better, worse), [[] for _ in per_preset])[i].append(cells)
    out_rows = []
    for key in _by_arms(list(joined)):
        # a claim that one report of the preset ran and another not yet: the results alone
        shown = [[c for c in cells if c[2] not in NOT_RUN] or cells[:1] for cells in joined[key]]
        for k in range(max(len(cells) for cells in shown)):
            picked = [cells[k] if k < len(cells) else None for cells in shown]
            base = next(c for c in picked if c is not None)
            cols = [c or NOT_IN for c in picked]
            out_rows.append([base[0], base[1], *(x for c in cols for x in (c[2], c[3])),
                             "; ".join(c[4] for c in cols), "; ".join(c[5] for c in cols),
                             ", ".join(c[6] for c in cols if c[6] not in ("–", NOT_COMMITTED)) or NOT_COMMITTED])
    names = "; ".join(p.name for p in PRESETS[:len(presets)])
    head = ["claim", "paper (GLUE)",
            *(x for p in PRESETS[:len(presets)] for x in (f"verdict: `{p.name}` ({p.what})", "Δ points [95% interval]")),
            f"pre-training per run ({names})", f"runs, pre-training x fine-tuning seeds ({names})", "reports"]
    return markdown_table(head, out_rows).splitlines() + _notes(pending, incomplete)


def _summary_rows(records: Sequence[Mapping], on: tuple[str, ...] = ()) -> tuple[dict[tuple, list], list | None, int]:
    """One preset's README cells: (claim, better, worse) -> [verdict, interval, reports, verdict and interval in
    one], and the sanity checks against random init folded into one [verdict counts, spread, reports, counts and
    spread in one] ('not run yet' when its sweeps have such checks and none ran; None when they have none), with
    how many ran. `on`: the instrument the preset's
    column header names; a result measured on other tasks names its own, and a claim that two reports measured
    differently (other runs or other tasks) shows each result with its report, never one silently for both."""
    results: dict[tuple, list[dict]] = {}
    sanity: dict[tuple, tuple[str, float | None, tuple]] = {}  # (arm, tasks, estimate) -> (verdict, estimate, tasks)
    sanity_links: list[str] = []
    waiting = False  # a sanity check of a sweep not run yet
    for r in records:
        link = f"[{r['report']}](reports/{r['report']})" if r.get("report") else ""  # pending: said under the table
        for c in r["claims"]:
            tasks = tuple(c.get("tasks") or ())
            if c["claim"].startswith(SANITY):
                if c["verdict"] not in NOT_RUN:  # else the note under the table names the sweep
                    sanity[(tuple(c["better"]), tasks, c.get("estimate"))] = (c["verdict"], c.get("estimate"), tasks)
                    sanity_links += [link] if link not in sanity_links else []
                waiting = waiting or c["verdict"] in NOT_RUN
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
        return rows, ["not run yet", "–", "", "not run yet"] if waiting else None, 0
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
    spread = "; ".join(spreads) or "–"
    return rows, [said, spread, ", ".join(sanity_links), said + (f" ({spread})" if spreads else "")], len(sanity)


def _summary_cells(entries: Sequence[Mapping], on: tuple[str, ...]) -> list[str]:
    """[verdict, interval, reports, verdict and interval in one] of one claim under one preset from its distinct
    results (`entries`): those run, else the first not run; each names its instrument where it is not the
    header's (`on`)."""
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
        notes = [split] if split else []
        rests = list(carries.recorded_deciding(c))
        if rests:  # leaving this task out alone changes the verdict (report/carries.py)
            notes.append(f"rests on {', '.join(vd.glue_task_names(rests))}")
        if c.get("groups") and min(c["groups"].values()) == 1:  # the interval leaves pre-training variance out
            notes.insert(0, "one pre-training seed")
        verdict = f"**{c['verdict']}**" + (f" ({'; '.join(notes)})" if notes else "")
        if c.get("estimate") is None:
            verdicts.append(verdict + where)
            intervals.append("–")
        else:
            verdicts.append(verdict)
            intervals.append(f"{c['estimate']:+.1f} [{c['low']:+.1f}, {c['high']:+.1f}]{where}")
    if len(shown) > 1:  # say which report found which
        verdicts = [f"{v} ({', '.join(e['links'])})" for v, e in zip(verdicts, shown)]
    links = list(dict.fromkeys(link for e in shown for link in e["links"]))
    both = "; ".join(v if i == "–" else f"{v}, {i}" for v, i in zip(verdicts, intervals))
    return ["; ".join(verdicts), "; ".join(intervals), ", ".join(links), both]


def _sanity_claim(counts: Sequence[tuple[int, str | None]]) -> str:
    """The folded sanity row's claim: how many comparisons it folds, per preset where there are several."""
    said = ", ".join((f"{n} comparison{'s' if n != 1 else ''}" if n or not preset else "none run yet")
                     + (f" at `{preset}`" if preset else "") for n, preset in counts)
    return f"{SANITY} (each pre-trained arm against random init of its shape: {said})"


def summary_table(*presets: Sequence[Mapping]) -> list[str]:
    """The README's table: claim, verdict, difference and report, one row per claim; with several `presets` (each
    one preset's records, PRESETS in order), each claim's verdict and difference under every preset: two columns
    for each preset, one for a `focused` one (the long run: its verdict and difference in one cell, empty for the
    claims it does not test). Each preset's header names its instrument (`preset_tasks`: 'SST-2', 'GLUE-5: CoLA,
    SST-2, MRPC, STS-B, RTE')."""
    records = presets[0] if presets else ()
    on = preset_tasks(records)
    first, sane, n = _summary_rows(records, on)
    if len(presets) <= 1:
        rows = [[key[0], *cells[:3]] for key, cells in first.items()]
        rows += [[_sanity_claim([(n, None)]), *sane[:3]]] if sane else []
        head = ["claim", f"verdict ({_instrument(on)})" if on else "verdict", "Δ points [95% interval]", "report"]
        return markdown_table(head, rows).splitlines() + _pending_note(records)
    shown = PRESETS[:len(presets)]
    ons = [preset_tasks(r) for r in presets]
    cells = [_summary_rows(r, o) for r, o in zip(presets, ons)]

    def columns(preset: Preset, found: list | None) -> list[str]:
        if preset.focused:
            return [found[3]] if found else [""]
        return found[:2] if found else ["not in its sweeps", "–"]
    rows = []
    for key in _by_arms(list(dict.fromkeys(k for rows_of, _, _ in cells for k in rows_of))):
        found = [rows_of.get(key) for rows_of, _, _ in cells]
        links = list(dict.fromkeys(link for f in found if f for link in f[2].split(", ") if link))
        rows.append([key[0], *(x for p, f in zip(shown, found) for x in columns(p, f)), ", ".join(links)])
    if any(sane for _, sane, _ in cells):
        found = [sane or (None if p.focused else ["–", "–", "", "–"]) for p, (_, sane, _) in zip(shown, cells)]
        links = list(dict.fromkeys(link for f in found if f for link in f[2].split(", ") if link))
        rows.append([_sanity_claim([(count, p.name) for p, (_, sane, count) in zip(shown, cells) if sane]),
                     *(x for p, f in zip(shown, found) for x in columns(p, f)), ", ".join(links)])
    head = ["claim"]
    for p, o in zip(shown, ons):
        if p.focused:
            head.append(f"`{p.name}` ({p.what}" + (f"; {_instrument(o)}" if o else "") + "): verdict, Δ [95% interval]")
        else:
            head += [f"`{p.name}`" + (f" ({_instrument(o)})" if o else ""), "Δ [95% interval]"]
    return markdown_table(head + ["reports"], rows).splitlines() + _pending_note([r for rs in presets for r in rs])


def _pending_note(records: Sequence[Mapping]) -> list[str]:
    """The one line under the short table on the sweeps not run yet (their commands are under the full table)."""
    pending = [_sweep_label(r) for r in records if not r.get("report")]
    if not pending:
        return []
    return ["", f"Not run yet: {', '.join(pending)}; each sweep's command is under the full table "
                "([every verdict at CPU scale](#every-verdict-at-cpu-scale))."]
