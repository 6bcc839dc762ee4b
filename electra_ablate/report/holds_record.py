"""What each CPU-scale report concluded, as data, and which reports the "What holds" tables join (report/holds.py).

A report writes its verdicts beside its figures (`reports/<stem>/verdicts.json`: `record`); `load_records` reads
them back per preset (`PRESETS`: a preset's sweeps, in the order of the tables' columns), a sweep whose report is
not committed yet as its claims, not run, with the command that runs them; and each record's instrument (the
tasks its GLUE mean averages over)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from electra_ablate.common.io import write_text
from electra_ablate.common.portable import portable
from electra_ablate.report import multibootstrap as mb
from electra_ablate.report import verdicts as vd
from electra_ablate.report.paper import load_paper_results
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


# The long run: `cpu_regime_30k`'s encoder pre-trained for 250M tokens (sweeps/cpu_long.yaml), one sweep.
CPU_LONG: tuple[tuple[str, str | None], ...] = (("cpu_long", None),)


class Preset(NamedTuple):
    """A column group of the tables: a CPU preset (or run length), what sets it apart, and its reports."""

    name: str
    what: str
    sweeps: tuple[tuple[str, str | None], ...]
    # A run that tests a few claims at length rather than every ablation: the README gives it one column (its
    # verdict and difference in one cell, empty for the claims it does not test), so the table stays readable.
    focused: bool = False


# In the order of the tables' columns.
PRESETS = (Preset("cpu_regime", "2k vocabulary, sequence 64", CPU_SCALE),
           Preset("cpu_regime_30k", "30k vocabulary, sequence 128", CPU_SCALE_30K),
           Preset("cpu_long", "250M tokens, 30k vocabulary", CPU_LONG, focused=True))


DETAIL_DOC = "docs/findings.md"  # the results page: both tables, and the long run's headline


PRESETS_DOC = "docs/presets.md"  # what each preset is and what its sweeps cost


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
           problems: Sequence[str] = (), tasks: Sequence[str] = (), skipped: Sequence[str] = (),
           medians: Mapping[str, Mapping[str, float]] | None = None) -> dict:
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
            "without": {t: {**_numbers(d), "verdict": vd.verdict_of(d)} for t, d in v.without.items()},
            "arms": [{"label": a, "pretraining": scale.get(a), "pretrained": vd.pretrained(spec.variant(a))}
                     for a in arms],
        })
    return {"sweep": spec.name, "scale": spec.scale, "report": f"{spec.report_name}.md", "claims": claims,
            "missing_or_failed": len(problems), "tasks": list(tasks), "skipped_tasks": list(skipped),
            # the main table's medians (variant -> task -> median x 100, and "glue"), read by report/headline.py
            "medians": {v: {t: round(float(x), 4) for t, x in m.items()} for v, m in (medians or {}).items()}}


def write_record(path: Path, spec: SweepSpec, results: Sequence[vd.Verdict], scale: Mapping[str, dict | None],
                 problems: Sequence[str] = (), tasks: Sequence[str] = (), skipped: Sequence[str] = (),
                 medians: Mapping[str, Mapping[str, float]] | None = None, extra: Mapping | None = None) -> None:
    """`record` as JSON at `path`, with `extra`'s keys beside (a sweep of several recipes: report/recipes.py)."""
    content = {**record(spec, results, scale, problems, tasks, skipped, medians), **(extra or {})}
    text = json.dumps(content, indent=1, sort_keys=True)
    write_text(path, portable(text) + "\n")


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


def preset_records(report_dir: Path = REPO_ROOT / "reports") -> list[list[dict]]:
    """Each preset's records (PRESETS, in order) from the reports committed in `report_dir`."""
    return [load_records(report_dir, p.sweeps) for p in PRESETS]


def _sweep_label(r: Mapping) -> str:
    """'`table5_efficiency` at scale `cpu_30k`' (the sweep alone at its default scale)."""
    return f"`{r['sweep']}`" + ("" if r["scale"] is None else f" at scale `{r['scale']}`")


def _by_arms(keys: Sequence[tuple]) -> list[tuple]:
    """`keys` ((claim, better, worse, ...)) with the claims on the same arms next to each other, where the first of
    them stands: the long run's Table 1 claim (ELECTRA-Small beats BERT-Small) under Table 5's ELECTRA beats BERT."""
    first: dict[tuple, int] = {}
    for i, (_, better, worse, *_) in enumerate(keys):
        first.setdefault((better, worse), i)
    return sorted(keys, key=lambda k: first[(k[1], k[2])])  # stable: the rest keep their order


def is_cpu_scale(spec: SweepSpec) -> bool:
    """Whether `spec`'s report is one the table joins (same sweep, same report file)."""
    return any(spec.name == name and spec.report_name == load_sweep(name, scale).report_name
               for preset in PRESETS for name, scale in preset.sweeps)
