"""The sweep-file grammar: sweeps/<name>.yaml read into a SweepSpec of Variants, with every check that needs no
config composition (unknown keys, labels, scales, tasks, checkpoints, `random_init_of` targets).

A sweep file lists the variants of one paper table or figure (or `axes` whose product they are), the seeds, the
GLUE tasks and a scale knob; `scales.<scale>` is an overlay merged over the file. A variant is a bundle of
overrides: the keys of VARIANT_KEYS say how it is fine-tuned, every other key is a pre-training override
(`objective: electra` picks a config group option, `trainer.max_steps: 100` sets a value)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"
SWEEPS_DIR = REPO_ROOT / "sweeps"
LABEL = re.compile(r"^[A-Za-z0-9_-]+$")  # labels become file names and Hydra option names
SCALES = ("tiny", "small", "base", "large")
TOP_KEYS = {
    "name": "the sweep's name; default: the file name",
    "experiment": "the MLflow experiment its runs are recorded and looked up in; default: the sweep's name. Sweeps that "
                  "name the same experiment share their finished runs of equal settings (run identities)",
    "description": "one line for the report's title",
    "notes": "a paragraph the report opens with: what the sweep can and cannot show",
    "script": "the first entry point (electra_ablate.pretrain, or electra_ablate.finetune when every variant names `pretrained`)",
    "paper": "section of electra_ablate/report/paper_results.yaml whose rows are this sweep's variant labels",
    "baseline": "variant the bootstrap differences are taken against",
    "figures": "extra report figures: generator_size, learning_curves",
    "default_scale": "scale used when none is given",
    "scales": "scale name -> overlay merged over this file (usually pretrain/finetune overrides)",
    "tasks": "GLUE tasks to fine-tune on",
    "seeds": "fine-tuning seeds (the paper: median of 10)",
    "pretrain_seeds": "pre-training seeds (a pre-trained variant may run a subset: its own `pretrain_seeds`)",
    "checkpoints": "fractions of trainer.max_steps whose checkpoints are fine-tuned (1.0 = the final one)",
    "exports": "fractions (< 1) of trainer.max_steps pre-training saves; default: those of `checkpoints`. A sweep that "
               "fine-tunes fewer checkpoints of another sweep's runs keeps that sweep's (they are in its runs' identity)",
    "recipes": "fine-tuning recipes (conf/recipe/) every checkpoint is fine-tuned under, the report side by side; "
               "default: the one the `finetune` overrides name. The first one's runs are those of a sweep of it alone",
    "recipe_checkpoints": "recipe -> the fractions of `checkpoints` it fine-tunes (default: all of them), so a costly "
                          "recipe can take the finals only",
    "base": "a sweep this file is read over (its keys merged over that sweep's, `name` its own): a second look at "
            "another sweep's runs, e.g. under other recipes",
    "pretrain": "overrides for every pre-training job",
    "finetune": "overrides for every fine-tuning job",
    "variants": "label -> overrides of one variant (beside `axes`: only arms without pre-training, such as the floor)",
    "axes": "axis -> {option -> overrides}: the variants are the product of the axes (a scale drops an option with null)",
}
VARIANT_KEYS = {"pretrained", "random_init_of", "expected_row", "finetune", "pretrain_seeds"}  # every other key of a variant is a pre-training override
FIGURES = ("generator_size", "learning_curves")


class SweepError(ValueError):
    """A sweep file or a sweep setting that cannot work."""


@dataclass(frozen=True)
class Variant:
    label: str
    pretrain: dict[str, Any]  # overrides of the pre-training job (common + scale + variant), key -> value
    finetune: dict[str, Any]  # overrides of its fine-tuning jobs
    pretrained: str | None = None  # fine-tune this model as is (no pre-training phase)
    # The no-pre-training floor: fine-tune randomly initialised encoders with the architecture and vocabulary
    # of this (pre-trained) variant's checkpoints, one group per pre-training seed, so that the compared arms
    # differ in their weights only.
    random_init_of: str | None = None
    expected_row: str | None = None  # "<section>.<row>" of paper_results.yaml
    axes: dict[str, str] = field(default_factory=dict)  # axis -> option, for product sweeps
    # A subset of the sweep's pre-training seeds for this variant alone (None: all of them), for an arm too long
    # to repeat as often as the others (a learning curve far past the compared budget).
    pretrain_seeds: tuple[int, ...] | None = None


@dataclass(frozen=True)
class SweepSpec:
    name: str
    path: Path
    scale: str | None
    description: str
    paper: str | None
    baseline: str | None
    figures: tuple[str, ...]
    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    pretrain_seeds: tuple[int, ...]
    checkpoints: tuple[float, ...]
    variants: tuple[Variant, ...]
    notes: str = ""
    exports: tuple[float, ...] = ()  # fractions < 1 pre-training saves (load_sweep: `exports`, else checkpoints < 1)
    recipes: tuple[str, ...] = ()  # several fine-tuning recipes (conf/recipe/), the first the main one; () = one
    # recipe -> the fractions of `checkpoints` it fine-tunes, where it takes fewer than all (`recipe_checkpoints`)
    recipe_checkpoints: tuple[tuple[str, tuple[float, ...]], ...] = ()
    experiment: str = ""  # the MLflow experiment (load_sweep sets it; the sweep's name unless the file names another)
    # The report's file stem: the sweep's name at its default scale, `<name>_<scale>` at any other, so that the
    # reports of one sweep at two scales (a committed CPU report, a user's GPU run) sit side by side.
    report_name: str = ""

    @property
    def scale_name(self) -> str:
        return self.scale or "default"

    def fine_tunes(self, recipe: str | None, fraction: float | None) -> bool:
        """Whether `recipe` fine-tunes the checkpoint at `fraction` (None: a `pretrained` model, taken as final)."""
        subset = dict(self.recipe_checkpoints).get(recipe)
        return subset is None or (1.0 if fraction is None else fraction) in subset

    def variant(self, label: str) -> Variant:
        for v in self.variants:
            if v.label == label:
                return v
        raise SweepError(f"sweep {self.name} has no variant {label!r}; it has {[v.label for v in self.variants]}")

    @property
    def pretrained_variants(self) -> tuple[Variant, ...]:
        """The variants with a pre-training phase."""
        return tuple(v for v in self.variants if v.pretrained is None and v.random_init_of is None)


def sweep_path(name: str | Path) -> Path:
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise SweepError(f"sweep file {path} not found")
        return path
    path = SWEEPS_DIR / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml"))
        raise SweepError(f"no sweep named {name!r} (no {path}); known sweeps: {', '.join(known)}")
    return path


def _merge(base: Mapping, overlay: Mapping) -> dict:
    """Recursive dict merge; the overlay wins. Lists and scalars are replaced, not merged."""
    out = dict(base)
    for k, v in overlay.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def _unpretrained(body) -> bool:
    """A variant body that fine-tunes without pre-training in the sweep: `random_init_of` or `pretrained`."""
    return isinstance(body, Mapping) and ("random_init_of" in body or "pretrained" in body)


def _int_list(raw, where: str) -> tuple[int, ...]:
    values = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise SweepError(f"{where} must be a non-empty list of integers, got {raw!r}")
    return tuple(values)


def _apply_scale(raw: dict, scales: Mapping, scale, where: str) -> dict:
    """The sweep file with scales.<scale> merged over it, after checking that the scale exists and names only
    known keys and variants."""
    if scale not in scales:
        raise SweepError(f"{where}: scale={scale!r} is not one of its scales {sorted(scales)} (pass scale=<one of them>)")
    overlay = scales[scale] or {}
    bad = sorted(set(overlay) - set(TOP_KEYS) - {"axes"} | {"base"} & set(overlay))
    if bad:
        raise SweepError(f"{where}: scales.{scale} has unknown key(s) {bad}")
    extra_variants = sorted(set(overlay.get("variants") or {}) - set(raw.get("variants") or {}))
    if "axes" in raw:  # beside a product, a scale may add arms without pre-training (its random-init floor)
        extra_variants = [v for v in extra_variants if not _unpretrained(overlay["variants"][v])]
    if extra_variants:
        raise SweepError(f"{where}: scales.{scale}.variants names {extra_variants}, which are not variants of the sweep")
    raw = _merge(raw, overlay)
    # A scale drops an axis option or a variant by setting it to null (`g3_4: null`): its sweep leaves that arm out.
    for axis, options in (overlay.get("axes") or {}).items():
        for option in [o for o, body in (options or {}).items() if body is None]:
            del raw["axes"][axis][option]
    for label in [v for v, body in (overlay.get("variants") or {}).items() if body is None]:
        del raw["variants"][label]
    return raw


def read_raw(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """A sweep file's keys, merged over those of its `base` sweep (recursively; `name` is the file's own)."""
    where = f"sweep file {path}"
    try:  # OmegaConf's YAML reading, as Hydra's: 5e-4 is a float (plain YAML 1.1 would read a string)
        raw = OmegaConf.to_container(OmegaConf.create(path.read_text() or "{}"))
    except Exception as e:  # noqa: BLE001 - any parse error becomes one message naming the file
        raise SweepError(f"{where} is not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise SweepError(f"{where} must be a mapping of keys ({', '.join(TOP_KEYS)})")
    unknown = sorted(set(raw) - set(TOP_KEYS))
    if unknown:
        raise SweepError(f"{where}: unknown key(s) {unknown}; valid keys: {', '.join(TOP_KEYS)}")
    base = raw.pop("base", None)
    if base is None:
        return raw
    base_path = sweep_path(base) if Path(str(base)).suffix else SWEEPS_DIR / f"{base}.yaml"
    if not base_path.is_file():
        raise SweepError(f"{where}: base={base!r} names no sweep file ({base_path} is missing)")
    if base_path.resolve() in seen:
        raise SweepError(f"{where}: base={base!r} comes back to a file already read ({base_path})")
    under = read_raw(base_path, (*seen, path.resolve()))
    under.pop("name", None)
    return _merge(under, raw)


def load_sweep(name: str | Path, scale: str | None = None) -> SweepSpec:
    """Read sweeps/<name>.yaml (or a path) at `scale`, with every check that needs no config composition."""
    path = sweep_path(name)
    where = f"sweep file {path}"
    raw = read_raw(path)
    scales = raw.pop("scales", None) or {}
    scale = scale or raw.get("default_scale")
    if scales:
        raw = _apply_scale(raw, scales, scale, where)
    elif scale is not None:
        raise SweepError(f"{where} has no `scales`, so scale={scale!r} means nothing; leave scale unset")

    name_ = str(raw.get("name") or path.stem)
    if "axes" in raw:
        trained = sorted(v for v, body in (raw.get("variants") or {}).items() if not _unpretrained(body))
        if trained:
            raise SweepError(f"{where}: give `variants` or `axes` (their product), not both; beside `axes`, `variants` "
                             f"may only add arms without pre-training (random_init_of or pretrained), not {trained}")
    variants = _variants(raw, where)
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise SweepError(f"{where}: duplicate variant labels {labels}")
    baseline = raw.get("baseline")
    if baseline is not None and baseline not in labels:
        raise SweepError(f"{where}: baseline {baseline!r} is not a variant; variants: {labels}")
    figures = tuple(raw.get("figures") or ())
    if set(figures) - set(FIGURES):
        raise SweepError(f"{where}: unknown figure(s) {sorted(set(figures) - set(FIGURES))}; known: {FIGURES}")
    checkpoints = tuple(float(f) for f in raw.get("checkpoints") or [1.0])
    if any(not 0 < f <= 1 for f in checkpoints) or 1.0 not in checkpoints:
        raise SweepError(f"{where}: checkpoints={list(checkpoints)} must be fractions in (0, 1] and include 1.0 (the final one)")
    tasks = tuple(raw.get("tasks") or ())
    known_tasks = sorted(p.stem for p in (CONF_DIR / "task").glob("*.yaml") if p.stem != "glue")
    if not tasks or set(tasks) - set(known_tasks):
        raise SweepError(f"{where}: tasks={list(tasks)} must be a non-empty list of {known_tasks}")
    script = raw.get("script")
    if script not in (None, "electra_ablate.pretrain", "electra_ablate.finetune"):
        raise SweepError(f"{where}: script={script!r}; expected electra_ablate.pretrain or electra_ablate.finetune")
    if script == "electra_ablate.finetune" and any(v.pretrained is None for v in variants):
        raise SweepError(f"{where}: script=electra_ablate.finetune needs `pretrained` on every variant")
    experiment = str(raw.get("experiment") or name_)
    if not LABEL.match(experiment):
        raise SweepError(f"{where}: experiment={experiment!r} must be letters, digits, '_' and '-' (it names folders)")
    seeds = _int_list(raw.get("pretrain_seeds", [0]), f"{where}: pretrain_seeds")
    for v in variants:
        if v.pretrain_seeds is not None and not (v.pretrain_seeds and set(v.pretrain_seeds) <= set(seeds)):
            raise SweepError(f"{where}: variant {v.label} has pretrain_seeds={list(v.pretrain_seeds)}, which must be a "
                             f"non-empty subset of the sweep's pretrain_seeds {list(seeds)}")
    report_name = name_ if not scales or scale == raw.get("default_scale") else f"{name_}_{scale}"
    exports = _exports(raw.get("exports"), checkpoints, where)
    recipes = _recipes(raw.get("recipes"), where)
    subsets = _recipe_checkpoints(raw.get("recipe_checkpoints"), recipes, checkpoints, where)
    return SweepSpec(
        name=name_,
        experiment=experiment,
        report_name=report_name,
        path=path,
        scale=scale if scales else None,
        description=str(raw.get("description") or name_),
        notes=" ".join(str(raw.get("notes") or "").split()),
        paper=raw.get("paper"),
        baseline=baseline,
        figures=figures,
        tasks=tasks,
        seeds=_int_list(raw.get("seeds", [0]), f"{where}: seeds"),
        pretrain_seeds=seeds,
        checkpoints=tuple(sorted(checkpoints)),
        variants=tuple(variants),
        exports=exports,
        recipes=recipes,
        recipe_checkpoints=subsets,
    )


def _exports(raw, checkpoints: tuple[float, ...], where: str) -> tuple[float, ...]:
    """The fractions pre-training saves before its end: `exports`, which must hold every fine-tuned one."""
    if raw is None:
        return tuple(sorted(f for f in checkpoints if f < 1.0))
    values = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    if not all(isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f < 1 for f in values):
        raise SweepError(f"{where}: exports={raw!r} must be a list of fractions in (0, 1) (the final step is always saved)")
    missing = sorted(set(f for f in checkpoints if f < 1.0) - {float(f) for f in values})
    if missing:
        raise SweepError(f"{where}: checkpoints {missing} are not in exports={list(values)}; a checkpoint fine-tuned "
                         "must be saved (add them to exports)")
    return tuple(sorted(float(f) for f in values))


def _recipes(raw, where: str) -> tuple[str, ...]:
    """The fine-tuning recipes, each an option of conf/recipe/ (none: the `finetune` overrides decide)."""
    if raw is None:
        return ()
    values = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    known = sorted(p.stem for p in (CONF_DIR / "recipe").glob("*.yaml"))
    if not values or not all(isinstance(r, str) for r in values) or len(set(values)) != len(values):
        raise SweepError(f"{where}: recipes={raw!r} must be a list of distinct recipe names, from {known}")
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise SweepError(f"{where}: recipes names {unknown}, which are not in conf/recipe/; known: {known}")
    return tuple(values)


def _recipe_checkpoints(raw, recipes: tuple[str, ...], checkpoints: tuple[float, ...],
                        where: str) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """recipe -> the fractions of `checkpoints` it fine-tunes: a subset of them, of a recipe the sweep lists."""
    if not raw:
        return ()
    if not isinstance(raw, Mapping):
        raise SweepError(f"{where}: recipe_checkpoints={raw!r} must map a recipe to fractions, e.g. {{paper_glue: [1.0]}}")
    out = []
    for recipe, fractions in raw.items():
        if recipe not in recipes:
            raise SweepError(f"{where}: recipe_checkpoints names {recipe!r}, which is not in recipes={list(recipes)}")
        values = list(fractions) if isinstance(fractions, (list, tuple)) else [fractions]
        if not values or not all(isinstance(f, (int, float)) and float(f) in checkpoints for f in values):
            raise SweepError(f"{where}: recipe_checkpoints.{recipe}={fractions!r} must be a non-empty list of the "
                             f"sweep's checkpoints {list(checkpoints)}")
        out.append((recipe, tuple(sorted(float(f) for f in values))))
    return tuple(out)


def _variants(raw: dict, where: str) -> list[Variant]:
    common_pre = dict(raw.get("pretrain") or {})
    common_ft = dict(raw.get("finetune") or {})
    if "axes" in raw:
        axes = raw["axes"] or {}
        empty = [a for a, options in axes.items() if not options]
        if not axes or empty:
            raise SweepError(f"{where}: axes {empty or '{}'} have no options at this scale")
        entries = []
        for combo in product(*[list(options.items()) for options in axes.values()]):
            merged: dict = {}
            for _, options in combo:
                merged = _merge(merged, options or {})
            label = "-".join(str(name) for name, _ in combo)
            entries.append((label, merged, {axis: str(name) for axis, (name, _) in zip(axes, combo)}))
        entries += [(str(label), body, {}) for label, body in (raw.get("variants") or {}).items()]
    elif raw.get("variants"):
        entries = [(str(label), body or {}, {}) for label, body in raw["variants"].items()]
    else:
        raise SweepError(f"{where}: no `variants` (or `axes`) given")
    out = []
    for label, body, axes_of in entries:
        if not LABEL.match(label):
            raise SweepError(f"{where}: variant label {label!r} may only use letters, digits, '_' and '-'")
        body = dict(body)
        pretrained = body.pop("pretrained", None)
        random_init_of = body.pop("random_init_of", None)
        expected_row = body.pop("expected_row", None)
        own_seeds = body.pop("pretrain_seeds", None)
        finetune = _merge(common_ft, body.pop("finetune", None) or {})
        if pretrained is not None and random_init_of is not None:
            raise SweepError(f"{where}: variant {label} gives both `pretrained` and `random_init_of`; keep one")
        if (pretrained is not None or random_init_of is not None) and body:
            what = f"pretrained={pretrained} as is" if pretrained is not None else f"random encoders shaped like {random_init_of}"
            raise SweepError(f"{where}: variant {label} fine-tunes {what}, so its pre-training overrides {sorted(body)} would be ignored")
        if own_seeds is not None and (pretrained is not None or random_init_of is not None):
            raise SweepError(f"{where}: variant {label} gives pretrain_seeds but has no pre-training of its own")
        pretrain = {} if pretrained is not None or random_init_of is not None else _merge(common_pre, body)
        out.append(Variant(label, pretrain, finetune, pretrained=pretrained, expected_row=expected_row, axes=axes_of,
                           random_init_of=random_init_of,
                           pretrain_seeds=None if own_seeds is None else _int_list(own_seeds, f"{where}: {label}.pretrain_seeds")))
    labels = {label for label, _, _ in entries}
    for v in out:
        if v.random_init_of is None:
            continue
        ref = next((r for r in out if r.label == v.random_init_of), None)
        if ref is None or ref.pretrained is not None or ref.random_init_of is not None:
            raise SweepError(f"{where}: variant {v.label} has random_init_of={v.random_init_of!r}, which must name a "
                             f"pre-trained variant of the sweep; variants: {sorted(labels)}")
    return out
