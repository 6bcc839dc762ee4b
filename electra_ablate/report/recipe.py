"""The report's fine-tuning recipe: what the runs in the tables were fine-tuned with, beside the paper's recipe,
and every setting in which they differ from it, named as a deviation; a setting the tasks were fine-tuned with
differently is shown per task, beside the named recipe's `per_task` table (conf/recipe/cpu_glue.yaml's).

The paper's values are the project's defaults, read from the config files that hold them (they cite paper
Table 7 and the reference's run_finetuning.py): conf/finetune_optim/electra.yaml, conf/task/<task>.yaml,
conf/finetune.yaml. The runs' values are their logged MLflow params.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
from omegaconf import OmegaConf

from electra_ablate.common.cli import CONF_DIR
from electra_ablate.tracking.identity import NEW_KEY_DEFAULTS


@dataclass(frozen=True)
class Setting:
    name: str
    param: str  # the fine-tuning run's MLflow param; the paper's value is _paper_defaults()[param]


SIZE_NAMES = {"tiny": "Small's, for tiny"}  # the paper has no tiny size: fine-tuning counts it as Small


def _paper_defaults(tasks: Sequence[str], sizes: Sequence[str]) -> dict[str, str]:
    optim = OmegaConf.load(CONF_DIR / "finetune_optim" / "electra.yaml")
    base = OmegaConf.load(CONF_DIR / "finetune.yaml")
    by_size = {s: optim.lr_by_size.get("small" if s == "tiny" else s) for s in sizes}
    epochs = {t: OmegaConf.load(CONF_DIR / "task" / f"{t}.yaml").epochs for t in tasks}
    return {
        "resolved.lr": " / ".join(f"{v:g} ({SIZE_NAMES.get(s, s)})" for s, v in by_size.items() if v is not None),
        "task.epochs": ", ".join(f"{e} ({t})" for t, e in epochs.items()),
        "finetune_optim.bias_correction": str(optim.bias_correction),
        "finetune_optim.loss_reduction": str(optim.loss_reduction),
        "finetune_optim.weight_decay": f"{optim.weight_decay:g}",
        "finetune_optim.warmup_fraction": f"{optim.warmup_fraction:g}",
        "glue_data.max_seq_length": str(base.glue_data.max_seq_length),
        "glue_data.batch_size": str(base.glue_data.batch_size),
        "glue_data.max_train_examples": "None",
        "pooling": str(base.pooling),
        "reinit_top_layers": str(base.reinit_top_layers),
        **{f"dropout.{k}": f"{base.dropout[k]:g}" for k in ("hidden", "attention", "classifier")},
    }


SETTINGS = (
    Setting("learning rate", "resolved.lr"),
    Setting("update rule: Adam bias correction (false = the reference's AdamWeightDecayOptimizer)",
            "finetune_optim.bias_correction"),
    Setting("loss over the batch (sum = the reference's run_finetuning.py)", "finetune_optim.loss_reduction"),
    Setting("epochs", "task.epochs"),
    Setting("training examples (None = the whole training set)", "glue_data.max_train_examples"),
    Setting("max sequence length", "glue_data.max_seq_length"),
    Setting("batch size", "glue_data.batch_size"),
    Setting("warm-up fraction", "finetune_optim.warmup_fraction"),
    Setting("weight decay", "finetune_optim.weight_decay"),
    Setting("sentence representation (cls = the final [CLS] state)", "pooling"),
    Setting("top layers re-initialised before fine-tuning", "reinit_top_layers"),
    Setting("encoder dropout, hidden", "dropout.hidden"),
    Setting("encoder dropout, attention", "dropout.attention"),
    Setting("classifier dropout", "dropout.classifier"),
)


def _values(runs: pd.DataFrame, param: str) -> list[str]:
    """The values the runs logged for `param`; a run from before an option existed had its old behaviour, the
    option's `NEW_KEY_DEFAULTS` value."""
    col = f"params.{param}"
    logged = runs[col] if col in runs else pd.Series([None] * len(runs), index=runs.index, dtype=object)
    if param in NEW_KEY_DEFAULTS:
        logged = logged.where(logged.notna(), str(NEW_KEY_DEFAULTS[param]))
    return sorted({str(v) for v in logged.dropna()})


def _same(paper: str, ours: Sequence[str]) -> bool:
    def number(text: str):
        try:
            return float(text)
        except ValueError:
            return text
    cells = [p.split(" (")[0] for p in paper.split(" / ")] if " / " in paper or " (" in paper else [paper]
    return all(number(o) in {number(c) for c in cells} for o in ours)


def _row(name: str, paper: str, shown: str, differs: bool) -> str:
    return f"| {name} | {paper} | {shown} |{' **deviation**' if differs else ''} |"


def _named(runs: pd.DataFrame, kind: str, folder: str, why: str) -> str:
    """The sentence naming the preset(s) the runs were configured from ('' without one)."""
    presets = [p for p in _values(runs, "preset") if p != "None"]
    if not presets:
        return ""
    return (f" They were configured from the named {kind} {', '.join(f'`{p}`' for p in presets)} "
            f"({', '.join(f'conf/{folder}/{p}.yaml' for p in presets)}), which says {why}.")


def _by_task(runs: pd.DataFrame, scores: pd.DataFrame, tasks: Sequence[str], param: str) -> dict[str, list[str]]:
    """Task -> the values its runs logged for `param` (a `per_task` entry sets a task's own)."""
    return {t: _values(runs[runs["run_id"].isin(set(scores[scores["task"] == t]["run_id"]))], param) for t in tasks}


def _setting_cells(s: Setting, paper: str, ours: list[str], per_task: dict[str, list[str]]) -> tuple[str, bool]:
    """(the runs' value(s), whether they differ from the paper's): per task where the tasks' values differ."""
    if s.param == "task.epochs":  # the paper's value is per task too: compare each with its own
        shown = ", ".join(f"{'/'.join(v) or '?'} ({t})" for t, v in per_task.items())
        return shown, any(v and paper.find(f"{v[0]} ({t})") < 0 for t, v in per_task.items())
    differs = bool(ours) and not _same(paper, ours)
    if len({tuple(v) for v in per_task.values() if v}) > 1:
        groups: dict[str, list[str]] = {}
        for t, v in per_task.items():
            groups.setdefault("/".join(v) or "?", []).append(t)
        return ", ".join(f"{v} ({', '.join(ts)})" for v, ts in groups.items()), differs
    return ", ".join(ours) or "not logged", differs


def recipe_per_task(preset: str) -> dict[str, dict]:
    """The `per_task` table of conf/recipe/<preset>.yaml (or of the recipe it extends): task -> its settings,
    flattened to dotted keys; {} without one."""
    path = CONF_DIR / "recipe" / f"{preset}.yaml"
    if not path.is_file():
        return {}
    cfg = OmegaConf.load(path)
    if "per_task" in cfg:
        table = OmegaConf.to_container(cfg.per_task) or {}
        return {t: _flat(entry) for t, entry in table.items()}
    extends = [d for d in cfg.get("defaults") or [] if isinstance(d, str) and d != "_self_"]
    return recipe_per_task(extends[0]) if extends else {}


def _flat(entry: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for k, v in entry.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _per_task_lines(runs: pd.DataFrame, tasks: Sequence[str]) -> list[str]:
    """The named recipe's per-task settings (its `per_task` table), for the report's tasks; [] without any."""
    out = []
    for preset in (p for p in _values(runs, "preset") if p != "None"):
        table = {t: entry for t, entry in recipe_per_task(preset).items() if t in tasks and entry}
        if not table:
            continue
        rest = [t for t in tasks if t not in table]
        out += [f"Per-task settings of `{preset}` (its `per_task` table, conf/recipe/{preset}.yaml: each merged over "
                "the recipe for that task's runs alone" + (f"; the other tasks ({', '.join(rest)}) take the recipe's own" if rest else "")
                + "):", "", "| task | setting | value |", "|---|---|---|",
                *(f"| {t} | `{k}` | {v} |" for t, entry in table.items() for k, v in entry.items()), ""]
    return out


def recipe_lines(scores: pd.DataFrame, frame: pd.DataFrame) -> list[str]:
    """The "Fine-tuning recipe" section for the report's fine-tuning runs (`scores` rows), or [] if none: each
    setting beside the paper's (per task where the tasks were fine-tuned differently), then the named recipe's
    per-task settings."""
    if not len(scores) or not len(frame):
        return []
    runs = frame[frame["run_id"].isin(set(scores["run_id"]))]
    if not len(runs):
        return []
    tasks = sorted(set(scores["task"]))
    sizes = _values(runs, "resolved.size") or ["small"]
    paper = _paper_defaults(tasks, sizes)
    rows, deviations = [], []
    for s in SETTINGS:
        per_task = _by_task(runs, scores, tasks, s.param)
        shown, differs = _setting_cells(s, paper[s.param], _values(runs, s.param), per_task)
        rows.append(_row(s.name, paper[s.param], shown, differs))
        if differs:
            deviations.append(f"{s.name}: {shown} (paper: {paper[s.param]})")
    named = _named(runs, "recipe", "recipe", "why it departs from the paper")
    out = ["## Fine-tuning recipe", "",
           "What the runs in the tables were fine-tuned with, beside the paper's recipe (Table 7 and the reference's "
           f"run_finetuning.py: the project's defaults).{named}", "",
           "| setting | paper | these runs | |", "|---|---|---|---|", *rows, ""]
    out += _per_task_lines(runs, tasks)
    if deviations:
        out += ["Declared deviations from the paper's fine-tuning recipe (the sweep file sets them for this scale; "
                "docs/presets.md says why): " + "; ".join(deviations) + ".", ""]
    else:
        out += ["These runs follow the paper's fine-tuning recipe.", ""]
    return out


# Pre-training: the encoder layout the runs were pre-trained with, beside the paper's (conf/model/small.yaml
# holds the paper's block: post-LayerNorm, dropout 0.1, linear biases; paper Table 6 and the reference's
# modeling.py). Options beyond it are the pilots' levers for small budgets (docs/presets.md).
PRETRAIN_SETTINGS = (
    Setting("LayerNorm placement (post = BERT's and ELECTRA's block)", "model.layer_norm"),
    Setting("hidden dropout", "model.hidden_dropout_prob"),
    Setting("attention dropout", "model.attention_probs_dropout_prob"),
    Setting("linear biases", "model.linear_bias"),
)


def _paper_model() -> dict[str, str]:
    small = OmegaConf.load(CONF_DIR / "model" / "small.yaml")
    return {s.param: str(small[s.param.split(".", 1)[1]]) for s in PRETRAIN_SETTINGS}


def pretrain_recipe_lines(pretrain_states) -> list[str]:
    """The "Pre-training recipe" section: the encoder layout of the report's pre-training runs against the
    paper's, each difference named as a deviation, and the named preset they came from; [] without runs."""
    params = [s.run.data.params for s in pretrain_states if s.run is not None]
    if not params:
        return []
    runs = pd.DataFrame([{f"params.{k}": v for k, v in p.items()} for p in params])
    paper = _paper_model()
    rows, deviations = [], []
    for s in PRETRAIN_SETTINGS:
        ours = _values(runs, s.param)
        differs = bool(ours) and not _same(paper[s.param], ours)
        rows.append(_row(s.name, paper[s.param], ", ".join(ours) or "not logged", differs))
        if differs:
            deviations.append(f"{s.name}: {', '.join(ours)} (paper: {paper[s.param]})")
    named = _named(runs, "preset", "experiment", "why")
    out = ["## Pre-training recipe", "",
           "The encoder block the pre-trained arms used, beside the paper's (Table 6; the reference's "
           f"modeling.py).{named}",
           "", "| setting | paper | these runs | |", "|---|---|---|---|", *rows, ""]
    if deviations:
        out += ["Declared deviations from the paper's pre-training recipe: " + "; ".join(deviations) + ".", ""]
    return out
