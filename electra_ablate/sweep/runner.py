"""Run one paper comparison end to end: `python -m electra_ablate.sweep sweep=quick [scale=small]
[hydra/launcher=joblib]`.

A sweep file (sweeps/<name>.yaml) lists the variants of one paper table or figure, the seeds, the GLUE tasks
and a scale knob. The runner does three phases, each an ordinary Hydra multirun so that any Hydra launcher
places the jobs (basic = one after the other, joblib = in parallel on this machine, submitit = SLURM, Ray):

1. pre-train every variant x pre-training seed: `python -m electra_ablate.pretrain -m +sweep_variant=<labels>
   seed=<seeds>`. A variant is a bundle of overrides, which a multirun's cartesian product cannot express, so
   each becomes a small generated config (`# @package _global_`) in a `sweep_variant` group that the job finds
   through `hydra.searchpath`;
2. fine-tune every (pre-training run, checkpoint, task, seed): `python -m electra_ablate.finetune -m
   +sweep_checkpoint=<checkpoints> task=<tasks> seed=<seeds>`, one generated config per checkpoint;
3. write the report (electra_ablate.report).

Work already done is found in MLflow (one experiment per sweep, named after it) and not launched again: a
pre-training job by its config hash (tracking.config_hash of the same composed config the job will see), a
fine-tuning job by (pre-training run, step, task, seed); the entry points also skip finished work
themselves. A failed job ends its MLflow run FAILED and the multirun goes on with the others (Hydra's
launchers run every job of a batch, then report the first failure); the report lists failed and missing jobs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from itertools import product
from pathlib import Path
from typing import Any, NamedTuple

import hydra
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from electra_ablate.training import checks, pretraining
from electra_ablate.common import cli
from electra_ablate.tracking import runs as tracking

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"
SWEEPS_DIR = REPO_ROOT / "sweeps"
PRETRAIN_GROUP = "sweep_variant"  # generated config group of the pre-training phase
FINETUNE_GROUP = "sweep_checkpoint"  # ... and of the fine-tuning phase
LABEL = re.compile(r"^[A-Za-z0-9_-]+$")  # labels become file names and Hydra option names
SCALES = ("tiny", "small", "base", "large")
TOP_KEYS = {
    "name": "the sweep's name (= its MLflow experiment); default: the file name",
    "description": "one line for the report's title",
    "notes": "a paragraph the report opens with: what the sweep can and cannot show",
    "script": "the first entry point (electra_ablate.pretrain, or electra_ablate.finetune when every variant names `pretrained`)",
    "paper": "section of electra_ablate/paper_results.yaml whose rows are this sweep's variant labels",
    "baseline": "variant the bootstrap differences are taken against",
    "figures": "extra report figures: generator_size, learning_curves",
    "default_scale": "scale used when none is given",
    "scales": "scale name -> overlay merged over this file (usually pretrain/finetune overrides)",
    "tasks": "GLUE tasks to fine-tune on",
    "seeds": "fine-tuning seeds (the paper: median of 10)",
    "pretrain_seeds": "pre-training seeds",
    "checkpoints": "fractions of trainer.max_steps whose checkpoints are fine-tuned (1.0 = the final one)",
    "pretrain": "overrides for every pre-training job",
    "finetune": "overrides for every fine-tuning job",
    "variants": "label -> overrides of one variant",
    "axes": "axis -> {option -> overrides}: the variants are the product of the axes",
}
VARIANT_KEYS = {"pretrained", "random_init_of", "expected_row", "finetune"}  # every other key of a variant is a pre-training override
FIGURES = ("generator_size", "learning_curves")


class SweepError(ValueError):
    """A sweep file or a sweep setting that cannot work."""


# --- the sweep file ----------------------------------------------------------------------------------------


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

    @property
    def scale_name(self) -> str:
        return self.scale or "default"

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


def _int_list(raw, where: str) -> tuple[int, ...]:
    values = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise SweepError(f"{where} must be a non-empty list of integers, got {raw!r}")
    return tuple(values)


def load_sweep(name: str | Path, scale: str | None = None) -> SweepSpec:
    """Read sweeps/<name>.yaml (or a path) at `scale`, with every check that needs no config composition."""
    path = sweep_path(name)
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
    scales = raw.pop("scales", None) or {}
    scale = scale or raw.get("default_scale")
    if scales:
        if scale not in scales:
            raise SweepError(f"{where}: scale={scale!r} is not one of its scales {sorted(scales)} (pass scale=<one of them>)")
        bad = sorted(set(scales[scale] or {}) - set(TOP_KEYS) - {"axes"})
        if bad:
            raise SweepError(f"{where}: scales.{scale} has unknown key(s) {bad}")
        extra_variants = sorted(set((scales[scale] or {}).get("variants") or {}) - set(raw.get("variants") or {}))
        if extra_variants:
            raise SweepError(f"{where}: scales.{scale}.variants names {extra_variants}, which are not variants of the sweep")
        raw = _merge(raw, scales[scale] or {})
    elif scale is not None:
        raise SweepError(f"{where} has no `scales`, so scale={scale!r} means nothing; leave scale unset")

    name_ = str(raw.get("name") or path.stem)
    if "variants" in raw and "axes" in raw:
        raise SweepError(f"{where}: give `variants` or `axes` (their product), not both")
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
    return SweepSpec(
        name=name_,
        path=path,
        scale=scale if scales else None,
        description=str(raw.get("description") or name_),
        notes=" ".join(str(raw.get("notes") or "").split()),
        paper=raw.get("paper"),
        baseline=baseline,
        figures=figures,
        tasks=tasks,
        seeds=_int_list(raw.get("seeds", [0]), f"{where}: seeds"),
        pretrain_seeds=_int_list(raw.get("pretrain_seeds", [0]), f"{where}: pretrain_seeds"),
        checkpoints=tuple(sorted(checkpoints)),
        variants=tuple(variants),
    )


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
        finetune = _merge(common_ft, body.pop("finetune", None) or {})
        if pretrained is not None and random_init_of is not None:
            raise SweepError(f"{where}: variant {label} gives both `pretrained` and `random_init_of`; keep one")
        if (pretrained is not None or random_init_of is not None) and body:
            what = f"pretrained={pretrained} as is" if pretrained is not None else f"random encoders shaped like {random_init_of}"
            raise SweepError(f"{where}: variant {label} fine-tunes {what}, so its pre-training overrides {sorted(body)} would be ignored")
        pretrain = {} if pretrained is not None or random_init_of is not None else _merge(common_pre, body)
        out.append(Variant(label, pretrain, finetune, pretrained=pretrained, expected_row=expected_row, axes=axes_of,
                           random_init_of=random_init_of))
    labels = {label for label, _, _ in entries}
    for v in out:
        if v.random_init_of is None:
            continue
        ref = next((r for r in out if r.label == v.random_init_of), None)
        if ref is None or ref.pretrained is not None or ref.random_init_of is not None:
            raise SweepError(f"{where}: variant {v.label} has random_init_of={v.random_init_of!r}, which must name a "
                             f"pre-trained variant of the sweep; variants: {sorted(labels)}")
    return out


# --- generated variant configs -----------------------------------------------------------------------------


def is_group(key: str) -> bool:
    """A key without a dot that names a folder of conf/ is a config group (`objective: bert`)."""
    return "." not in key and "/" not in key and (CONF_DIR / key).is_dir()


def split_overrides(overrides: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    groups = {k: str(v) for k, v in overrides.items() if is_group(k)}
    values = {k: v for k, v in overrides.items() if not is_group(k)}
    return groups, values


def _nest(values: Mapping[str, Any]) -> dict:
    out: dict = {}
    for key, value in values.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise SweepError(f"override {key} sets a key below a plain value")
        node[leaf] = value
    return out


def config_text(overrides: Mapping[str, Any], extra: Mapping[str, Any], comment: str) -> str:
    """A `# @package _global_` config applying `overrides` (groups via the defaults list) and `extra`."""
    groups, values = split_overrides(overrides)
    body: dict = {}
    if groups:
        body["defaults"] = [{f"override /{g}": option} for g, option in groups.items()]
    body.update(_merge(_nest(values), extra))
    return f"# @package _global_\n# {comment}\n" + yaml.safe_dump(body, sort_keys=False)


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file() and path.read_text() == text:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


_PLAIN = re.compile(r"^[A-Za-z0-9_/.+@-]+$")  # needs no quotes in Hydra's override grammar


def quote(value: Any) -> str:
    """A value as a Hydra override literal: as is when plain, else single-quoted (e.g. a URI with ':')."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)) or value is None:
        return "null" if value is None else repr(value)
    text = str(value)
    if _PLAIN.match(text) and text not in ("true", "false", "null") and not text[0].isdigit():
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# --- jobs -------------------------------------------------------------------------------------------------


class PretrainJob(NamedTuple):
    variant: str
    seed: int


class Checkpoint(NamedTuple):
    """One network to fine-tune: a pre-training run's checkpoint at `step`, or a `pretrained` model as is."""

    variant: str
    pretrain_seed: int | None
    run_id: str | None  # pre-training run (None for `pretrained` variants)
    step: int | None
    final: bool
    fraction: float | None
    random_init: bool = False  # the run's architecture and vocabulary with fresh random weights

    @property
    def config_name(self) -> str:
        if self.run_id is None:
            return self.variant
        return f"{self.variant}-s{self.pretrain_seed}-{'final' if self.final else f'step{self.step}'}"

    @property
    def source(self) -> str:
        """The FinetuneKey source of its fine-tuning runs."""
        if self.run_id is None:
            return f"variant:{self.variant}"
        return f"{RANDOM_SOURCE}{self.run_id}" if self.random_init else self.run_id


RANDOM_SOURCE = "random:"  # FinetuneKey source prefix of random-init runs shaped like a pre-training run


class FinetuneKey(NamedTuple):
    """What identifies a fine-tuning job within a sweep (its MLflow tags)."""

    source: str  # pre-training run id, or `variant:<label>` for a `pretrained` variant
    step: str  # pretrained_step tag
    task: str
    seed: int


@dataclass
class SweepContext:
    """Everything both the runner and the report need to find a sweep's runs."""

    spec: SweepSpec
    tracking_uri: str
    base_overrides: list[str]  # paths.* and logger.*: the same for every job and for in-process composition
    pretrain_overrides: list[str]
    finetune_overrides: list[str]
    workdir: Path  # <output_root>/sweeps/<name>/<scale>

    @property
    def experiment(self) -> str:
        return self.spec.name

    @property
    def conf_dir(self) -> Path:
        return self.workdir / "conf"

    @property
    def searchpath(self) -> str:
        return f"hydra.searchpath=['file://{self.conf_dir}']"

    def sweep_tags(self, variant: str) -> dict:
        return {"sweep": {"name": self.spec.name, "variant": variant}}

    def write_pretrain_configs(self) -> None:
        for v in self.spec.pretrained_variants:
            extra = _merge(self.sweep_tags(v.label), {"sweep": {"keep_going": True}, "run_name": f"{v.label}-s${{seed}}"})
            fractions = [f for f in self.spec.checkpoints if f < 1.0]
            if fractions:
                extra["trainer"] = {"export_fractions": fractions}
            text = config_text(v.pretrain, extra, f"variant {v.label} of sweep {self.spec.name} (scale {self.spec.scale_name}); generated by electra_ablate.sweep from {self.spec.path.name}")
            write_atomic(self.conf_dir / PRETRAIN_GROUP / f"{v.label}.yaml", text)

    def write_finetune_config(self, ckpt: Checkpoint) -> None:
        v = self.spec.variant(ckpt.variant)
        target = {"pretrained": v.pretrained} if ckpt.run_id is None else {
            "pretrained": ckpt.run_id, "pretrained_step": None if ckpt.final else ckpt.step}
        if ckpt.random_init:
            target["random_init"] = True
        text = config_text(v.finetune, _merge(self.sweep_tags(v.label), target),
                           f"checkpoint {ckpt.config_name} of sweep {self.spec.name}; generated by electra_ablate.sweep")
        write_atomic(self.conf_dir / FINETUNE_GROUP / f"{ckpt.config_name}.yaml", text)

    def compose_pretrain(self, job: PretrainJob) -> DictConfig:
        if not (self.conf_dir / PRETRAIN_GROUP / f"{job.variant}.yaml").is_file():
            self.write_pretrain_configs()
        cfg = compose_app("pretrain", [self.searchpath, f"+{PRETRAIN_GROUP}={job.variant}", f"seed={job.seed}",
                                       *self.base_overrides, *self.pretrain_overrides])
        # Without the generated file Hydra would read `+sweep_variant=x` as a new plain key, silently.
        if cfg.sweep.variant != job.variant:
            raise SweepError(f"the generated config {self.conf_dir / PRETRAIN_GROUP / job.variant}.yaml was not applied")
        return cfg

    def compose_finetune(self, extra: Sequence[str] = ()) -> DictConfig:
        return compose_app("finetune", [*self.base_overrides, *self.finetune_overrides, *extra])

    def pretrain_jobs(self) -> list[PretrainJob]:
        return [PretrainJob(v.label, s) for v in self.spec.pretrained_variants for s in self.spec.pretrain_seeds]


@contextlib.contextmanager
def _fresh_hydra() -> Iterator[None]:
    """Hydra's compose API inside a running Hydra app: park the app's global state, restore it after."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.singleton import Singleton

    state = Singleton.get_state()
    GlobalHydra.instance().clear()
    try:
        yield
    finally:
        GlobalHydra.instance().clear()
        Singleton.set_state(state)


_SESSION = {"open": False}


@contextlib.contextmanager
def compose_session() -> Iterator[None]:
    """Share one Hydra initialisation between many compose_app calls (each costs ~0.1 s less)."""
    if _SESSION["open"]:
        yield
        return
    from hydra import initialize_config_dir

    with _fresh_hydra(), initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        _SESSION["open"] = True
        try:
            yield
        finally:
            _SESSION["open"] = False


def compose_app(config_name: str, overrides: Sequence[str]) -> DictConfig:
    """The config a `python -m electra_ablate.<config_name>` job with these overrides would get."""
    from hydra import compose

    # paths.output_dir is the job's Hydra output folder: unknown here and not part of a run's identity.
    with compose_session():
        return compose(config_name, overrides=[*overrides, "paths.output_dir=."])


def make_context(
    sweep: str | Path,
    scale: str | None,
    paths: Mapping[str, str],
    tracking_uri: str,
    pretrain_overrides: Sequence[str] = (),
    finetune_overrides: Sequence[str] = (),
) -> SweepContext:
    """`paths` holds the resolved root_dir, data_dir, output_root and cache_dir every job gets."""
    spec = load_sweep(sweep, scale)
    base = [f"paths.{k}={quote(paths[k])}" for k in ("root_dir", "data_dir", "output_root", "cache_dir")]
    base += [f"logger.tracking_uri={quote(tracking_uri)}", f"logger.experiment={quote(spec.name)}"]
    workdir = Path(paths["output_root"]) / "sweeps" / spec.name / spec.scale_name
    return SweepContext(spec, tracking_uri, base, list(pretrain_overrides), list(finetune_overrides), workdir)


_ABSENT = object()


def _check_keys(config_name: str, overrides: Mapping[str, Any], base: Sequence[str], where: str,
                seen: dict | None = None) -> None:
    """Every value override must name an existing key: a generated config would silently add a misspelt one."""
    groups, values = split_overrides(overrides)
    cache_key = (config_name, tuple(sorted(groups.items())))
    cfg = (seen or {}).get(cache_key)
    if cfg is None:
        cfg = compose_app(config_name, [*(f"{g}={o}" for g, o in groups.items()), *base])
        if seen is not None:
            seen[cache_key] = cfg
    unknown = [k for k in values if OmegaConf.select(cfg, k, default=_ABSENT) is _ABSENT]
    if unknown:
        raise SweepError(f"{where}: {unknown} are not keys of the {config_name} config (check the spelling)")


def validate(ctx: SweepContext) -> dict[str, DictConfig]:
    """Compose every job's config before anything runs: unknown options or keys fail here, naming the variant.
    (Task names were checked against conf/task/ when the sweep file was read.) Returns each pre-training
    variant's config (first pre-training seed)."""
    with tempfile.TemporaryDirectory(prefix="electra_ablate_validate_") as tmp, compose_session():
        return _validate(dataclasses.replace(ctx, workdir=Path(tmp)))


def _validate(ctx: SweepContext) -> dict[str, DictConfig]:
    spec = ctx.spec
    seen: dict = {}
    ctx.write_pretrain_configs()
    composed = {}
    for v in spec.pretrained_variants:
        where = f"{spec.path.name}, variant {v.label}"
        _check_keys("pretrain", v.pretrain, ctx.base_overrides, where, seen)
        composed[v.label] = ctx.compose_pretrain(PretrainJob(v.label, spec.pretrain_seeds[0]))
        try:  # impossible combinations (e.g. two-stage with unequal sizes) fail before anything is launched
            checks.validate(composed[v.label])
        except checks.ConfigError as error:
            raise checks.ConfigError(f"{where}: {error}") from None
    checked: list = []
    for v in spec.variants:
        if (v.finetune, v.pretrained is None) in checked:
            continue
        checked.append((v.finetune, v.pretrained is None))
        base = [*ctx.base_overrides, f"task={spec.tasks[0]}"]
        _check_keys("finetune", v.finetune, base, f"{spec.path.name}, variant {v.label} (fine-tuning)", seen)
        ckpt = (Checkpoint(v.label, None, None, None, True, None) if v.pretrained
                else Checkpoint(v.label, 0, "0" * 32, 1, True, 1.0, random_init=v.random_init_of is not None))
        ctx.write_finetune_config(ckpt)
        ctx.compose_finetune([ctx.searchpath, f"+{FINETUNE_GROUP}={ckpt.config_name}", f"task={spec.tasks[0]}"])
    return composed


# --- what is done ------------------------------------------------------------------------------------------


class PretrainState(NamedTuple):
    job: PretrainJob
    config_hash: str
    run: Any  # the newest FINISHED mlflow Run, or None
    failed: Any  # the newest unfinished (FAILED / RUNNING / KILLED) run when none finished, or None
    max_steps: int
    outputs_missing: bool = False  # FINISHED, but its pre-trained directories are gone: pre-training runs again

    @property
    def needs_pretraining(self) -> bool:
        return self.run is None or self.outputs_missing


def pretrain_states(ctx: SweepContext, client) -> list[PretrainState]:
    ctx.write_pretrain_configs()
    exp = client.get_experiment_by_name(ctx.experiment)
    out = []
    with compose_session():
        jobs = [(job, ctx.compose_pretrain(job)) for job in ctx.pretrain_jobs()]
    for job, cfg in jobs:
        cfg_hash = tracking.config_hash(cfg)
        runs = [] if exp is None else client.search_runs(
            [exp.experiment_id], filter_string=f"tags.{tracking.TAG_CONFIG_HASH} = '{cfg_hash}'",
            order_by=["attributes.start_time DESC"])
        # A FINISHED run whose pre-trained directories are gone is not done: its job runs again (in that run).
        # Its fine-tuning results stay valid and reported meanwhile.
        finished = next((r for r in runs if r.info.status == "FINISHED"), None)
        failed = None if finished is not None or not runs else runs[0]
        missing = finished is not None and bool(pretraining.missing_outputs(finished))
        out.append(PretrainState(job, cfg_hash, finished, failed, int(cfg.trainer.max_steps), missing))
    return out


def checkpoints_of(state: PretrainState, fractions: Sequence[float]) -> tuple[list[Checkpoint], list[str]]:
    """The run's checkpoints at `fractions` of its steps, and a message per fraction it did not save."""
    run = state.run
    saved = {int(k): v for k, v in json.loads(run.data.tags.get("checkpoints", "{}")).items()}
    final_step = max(saved) if saved else state.max_steps
    found, missing = [], []
    for f in fractions:
        step = final_step if f == 1.0 else int(round(f * state.max_steps))
        if step in saved or f == 1.0:
            found.append(Checkpoint(state.job.variant, state.job.seed, run.info.run_id, step, f == 1.0, f))
        else:
            missing.append(f"{state.job.variant} seed {state.job.seed}: no checkpoint at step {step} ({f:g} of {state.max_steps})")
    return found, missing


def finetune_runs(client, experiment: str) -> tuple[dict[FinetuneKey, Any], dict[FinetuneKey, Any]]:
    """Newest FINISHED fine-tuning run per key, and the newest unfinished one for keys with none finished."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return {}, {}
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.{tracking.TAG_KIND} = 'finetune'",
                              order_by=["attributes.start_time DESC"], max_results=50000)
    done: dict[FinetuneKey, Any] = {}
    failed: dict[FinetuneKey, Any] = {}
    for r in runs:
        key = finetune_key(r.data.tags)
        if key is None:
            continue
        if r.info.status == "FINISHED":
            done.setdefault(key, r)
        else:
            failed.setdefault(key, r)
    return done, {k: v for k, v in failed.items() if k not in done}


def finetune_key(tags: Mapping[str, str]) -> FinetuneKey | None:
    try:
        seed = int(tags["seed"])
    except (KeyError, ValueError):
        return None
    source = tags.get(tracking.TAG_PRETRAIN_RUN) or "none"
    if source == "none":
        source = f"variant:{tags.get(tracking.TAG_VARIANT, '')}"
    elif tags.get(tracking.TAG_RANDOM_INIT) == "true":
        source = RANDOM_SOURCE + source
    return FinetuneKey(source, str(tags.get("pretrained_step", "")), tags.get("task", ""), seed)


def key_of(ckpt: Checkpoint, task: str, seed: int) -> FinetuneKey:
    return FinetuneKey(ckpt.source, "" if ckpt.run_id is None else str(ckpt.step), task, seed)


def random_init_checkpoints(spec: SweepSpec, found: Sequence[Checkpoint]) -> list[Checkpoint]:
    """The random-init variants' checkpoints: one per final checkpoint of the variant each is shaped like."""
    return [c._replace(variant=v.label, random_init=True)
            for v in spec.variants if v.random_init_of is not None
            for c in found if c.variant == v.random_init_of and c.final and not c.random_init]


def matches(done: Mapping[FinetuneKey, Any], key: FinetuneKey) -> Any:
    """The finished run for `key`; for `pretrained` variants the step is whatever the import reported."""
    if key.source.startswith("variant:"):
        return next((r for k, r in done.items() if (k.source, k.task, k.seed) == (key.source, key.task, key.seed)), None)
    return done.get(key)


# --- launching ----------------------------------------------------------------------------------------------


def multirun_command(module: str, sweep_args: Sequence[str], ctx: SweepContext, launcher: Sequence[str],
                     extra: Sequence[str], sweep_dir: Path) -> list[str]:
    return [sys.executable, "-m", module, "-m", ctx.searchpath, *sweep_args, *ctx.base_overrides, *extra,
            *launcher, f"hydra.sweep.dir={quote(str(sweep_dir))}"]


_SHELL_PLAIN = re.compile(r"^[A-Za-z0-9_/.,:=+@%-]+$")


def shell_join(args: Sequence[str]) -> str:
    """A command line to copy into a shell: plain words as they are, others in double quotes when that is
    safe (Hydra overrides hold single quotes), else shlex quoting."""
    out = []
    for a in args:
        if _SHELL_PLAIN.match(a):
            out.append(a)
        elif not any(c in a for c in '"$`\\!'):
            out.append(f'"{a}"')
        else:
            out.append(shlex.quote(a))
    return " ".join(out)


def launch(cmd: Sequence[str], dry_run: bool) -> int:
    log.info("launching: %s", shell_join(cmd))
    if dry_run:
        print(shell_join(cmd))
        return 0
    env = dict(os.environ)
    # The jobs import electra_ablate from this checkout whatever the working directory.
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.Popen(list(cmd), env=env)

    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    # A runner stopped by SIGTERM (a scheduler, `kill`) stops its multirun too instead of orphaning it.
    previous = signal.signal(signal.SIGTERM, stop) if threading.current_thread() is threading.main_thread() else None
    try:
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def check_launcher(launcher: Sequence[str]) -> None:
    """Fail before any job when the chosen launcher's plugin is not installed (e.g. Ray)."""
    if not launcher:
        return
    from hydra import compose, initialize_config_dir

    with _fresh_hydra(), initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        hydra_cfg = compose("pretrain", overrides=["paths.root_dir=.", "paths.output_dir=.", *launcher],
                            return_hydra_config=True).hydra
    target = str(hydra_cfg.launcher._target_)
    try:
        __import__(target.rsplit(".", 1)[0])
    except ImportError as e:
        raise SweepError(
            f"the launcher {target} cannot be imported ({e}); install its plugin, e.g. pip install -e '.[ray]' "
            "for hydra/launcher=ray_gpu"
        ) from e


# --- GPU placement ------------------------------------------------------------------------------------------


def visible_gpus(cuda_visible_devices: str | None, nvidia_smi_indices: str | None) -> list[str]:
    """GPUs this machine lets jobs use: CUDA_VISIBLE_DEVICES when set, else nvidia-smi's indices."""
    if cuda_visible_devices is not None:
        return [g.strip() for g in cuda_visible_devices.split(",") if g.strip() and g.strip() != "-1"]
    if not nvidia_smi_indices:
        return []
    return [line.strip() for line in nvidia_smi_indices.splitlines() if line.strip()]


def gpu_candidates(visible: Sequence[str], job_num: int, bound: str | None) -> list[str]:
    """The GPUs a job may take, in the order to try them.

    A process that already ran a job on a GPU stays on it (its CUDA context is bound to that device and a
    new CUDA_VISIBLE_DEVICES would be ignored); otherwise job k tries GPU k mod n first, so concurrent jobs
    start on different GPUs, then any other: a GPU is only taken when its lock is free, so two jobs never
    share one even when jobs finish out of order (job number modulo n alone would collide then).
    """
    if not visible:
        return []
    if bound is not None:
        if bound not in visible:
            raise RuntimeError(f"this process is bound to GPU {bound}, which is not among the visible GPUs {list(visible)}")
        return [bound]
    start = job_num % len(visible)
    return list(visible[start:]) + list(visible[:start])


_BOUND_GPU: str | None = None  # the GPU this worker process was given by its first job
_ALL_GPUS_ENV = "ELECTRA_ABLATE_ALL_GPUS"  # the visible GPUs before a job narrowed CUDA_VISIBLE_DEVICES


class GpuSlot(Callback):
    """Hydra callback (hydra/launcher=joblib_gpu): each job of a local parallel multirun gets a GPU of its own.

    On job start the job takes the lock file of a free GPU (fcntl, released when the job ends or its process
    dies) and sets CUDA_VISIBLE_DEVICES to it before any CUDA call; a job finding every GPU busy waits. On a
    machine without GPUs it does nothing. SLURM (submitit) and Ray place jobs on GPUs themselves.
    """

    def __init__(self, lock_dir: str | None = None, poll_s: float = 2.0, gpus: str | None = None):
        self.lock_dir = Path(lock_dir or Path(tempfile.gettempdir()) / f"electra_ablate_gpus_{os.getuid()}")
        self.poll_s = poll_s
        self.gpus = gpus
        self._lock = None

    def _visible(self) -> list[str]:
        if self.gpus is not None:
            return visible_gpus(str(self.gpus), None)
        if _ALL_GPUS_ENV in os.environ:
            return visible_gpus(os.environ[_ALL_GPUS_ENV], None)
        smi = None
        if "CUDA_VISIBLE_DEVICES" not in os.environ:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                smi = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=30).stdout
        return visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), smi)

    def acquire(self, job_num: int) -> str | None:
        global _BOUND_GPU
        visible = self._visible()
        candidates = gpu_candidates(visible, job_num, _BOUND_GPU)
        if not candidates:
            return None
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        while True:
            for gpu in candidates:
                handle = open(self.lock_dir / f"gpu{gpu}.lock", "a+")
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    handle.close()
                    continue
                self._lock = handle
                os.environ.setdefault(_ALL_GPUS_ENV, ",".join(visible))
                os.environ["CUDA_VISIBLE_DEVICES"] = gpu
                _BOUND_GPU = gpu
                return gpu
            time.sleep(self.poll_s)

    def release(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        gpu = self.acquire(int(config.hydra.job.get("num") or 0))
        if gpu is not None:
            log.info("job %s runs on GPU %s", config.hydra.job.get("num"), gpu)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        self.release()


# --- provenance ---------------------------------------------------------------------------------------------

PACKAGES = ("torch", "pytorch-lightning", "hydra-core", "omegaconf", "mlflow", "numpy", "pandas", "scipy",
            "tokenizers", "transformers")


def environment() -> dict[str, str]:
    """Package versions, hardware and platform of this process's machine."""
    versions = {}
    for name in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    gpus = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.strip().replace("\n", ", ")
    return {
        "python": platform.python_version(),
        "packages": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "hardware": f"{os.cpu_count()} CPU cores ({platform.machine()}); GPUs: {gpus or 'none'}",
        "platform": platform.platform(),
        "host": platform.node(),
    }


# --- the runner ---------------------------------------------------------------------------------------------


@dataclass
class PhaseResult:
    name: str
    jobs: int = 0  # jobs launched (0 = everything was already done)
    command: list[str] = field(default_factory=list)
    returncode: int = 0
    seconds: float = 0.0


@dataclass
class SweepResult:
    phases: list[PhaseResult]
    report: Path | None


def run_pretrain_phase(ctx: SweepContext, client, launcher: Sequence[str], dry_run: bool) -> PhaseResult:
    states = pretrain_states(ctx, client)
    todo = [s.job for s in states if s.needs_pretraining]
    result = PhaseResult("pretrain", jobs=len(todo))
    if not todo:
        log.info("pre-training: all %d jobs already FINISHED", len(states))
        return result
    # The multirun is a product; the smallest product covering the missing jobs (finished ones are skipped
    # by the entry point itself).
    labels = sorted({j.variant for j in todo}, key=[v.label for v in ctx.spec.variants].index)
    seeds = sorted({j.seed for j in todo})
    sweep_dir = ctx.workdir / "multirun" / f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_pretrain"
    result.command = multirun_command(
        "electra_ablate.pretrain", [f"+{PRETRAIN_GROUP}={','.join(labels)}", f"seed={','.join(map(str, seeds))}"],
        ctx, launcher, ctx.pretrain_overrides, sweep_dir)
    tic = time.perf_counter()
    result.returncode = launch(result.command, dry_run)
    result.seconds = time.perf_counter() - tic
    if result.returncode:
        log.warning("pre-training multirun exited with %d: some jobs failed (listed in the report); going on", result.returncode)
    return result


def finetune_plan(ctx: SweepContext, client) -> tuple[list[tuple[Checkpoint, str, int]], list[Checkpoint], list[str]]:
    """(missing (checkpoint, task, seed) jobs, every checkpoint, messages about checkpoints that are missing)."""
    checkpoints: list[Checkpoint] = [Checkpoint(v.label, None, None, None, True, None)
                                     for v in ctx.spec.variants if v.pretrained is not None]
    notes: list[str] = []
    for state in pretrain_states(ctx, client):
        if state.run is None:
            continue
        if state.outputs_missing:  # its weights are gone (and pre-training them again failed): nothing to load
            notes.append(f"{state.job.variant} seed {state.job.seed}: FINISHED run {state.run.info.run_id} has lost "
                         "its pre-trained directories; its missing fine-tuning jobs wait for pre-training to redo them")
            continue
        found, missing = checkpoints_of(state, ctx.spec.checkpoints)
        checkpoints += found
        notes += missing
    checkpoints += random_init_checkpoints(ctx.spec, checkpoints)
    done, _ = finetune_runs(client, ctx.experiment)
    todo = [(c, t, s) for c in checkpoints for t in ctx.spec.tasks for s in ctx.spec.seeds
            if matches(done, key_of(c, t, s)) is None]
    return todo, checkpoints, notes


def available_tasks(ctx: SweepContext) -> list[str] | None:
    """GLUE tasks with local data when fine-tuning reads TSVs (None = the HF loader, anything goes)."""
    from electra_ablate.glue import tasks as glue

    cfg = ctx.compose_finetune()
    if cfg.glue_data.source != "tsv":
        return None
    return glue.available_tasks(cfg.glue_data.dir)


def run_finetune_phase(ctx: SweepContext, client, launcher: Sequence[str], dry_run: bool) -> PhaseResult:
    todo, _, notes = finetune_plan(ctx, client)
    for note in notes:
        log.warning("%s", note)
    available = available_tasks(ctx)
    if available is not None:
        absent = sorted({t for _, t, _ in todo} - set(available))
        if absent:
            log.warning("no local GLUE data for %s: those jobs are not launched (listed missing in the report); "
                        "glue_data.source=hf reads them from the Hugging Face hub", absent)
            todo = [j for j in todo if j[1] in available]
    result = PhaseResult("finetune", jobs=len(todo))
    if not todo:
        log.info("fine-tuning: nothing left to run")
        return result
    ckpts = sorted({c for c, _, _ in todo}, key=lambda c: c.config_name)
    for c in ckpts:
        ctx.write_finetune_config(c)
    tasks = [t for t in ctx.spec.tasks if t in {t for _, t, _ in todo}]
    seeds = sorted({s for _, _, s in todo})
    sweep_dir = ctx.workdir / "multirun" / f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_finetune"
    result.command = multirun_command(
        "electra_ablate.finetune",
        [f"+{FINETUNE_GROUP}={','.join(c.config_name for c in ckpts)}", f"task={','.join(tasks)}",
         f"seed={','.join(map(str, seeds))}"],
        ctx, launcher, ctx.finetune_overrides, sweep_dir)
    tic = time.perf_counter()
    result.returncode = launch(result.command, dry_run)
    result.seconds = time.perf_counter() - tic
    if result.returncode:
        log.warning("fine-tuning multirun exited with %d: some jobs failed (listed in the report)", result.returncode)
    return result


def run_sweep(
    ctx: SweepContext,
    launcher: Sequence[str] = (),
    phases: Sequence[str] = ("pretrain", "finetune", "report"),
    report_dir: Path | None = None,
    dry_run: bool = False,
    command: str = "",
) -> SweepResult:
    """Run the phases; returns what was launched and the report's path. The sweep itself is one MLflow run
    (kind=sweep) holding its command, launcher, phases, environment and wall time: the report's provenance."""
    unknown = sorted(set(phases) - {"pretrain", "finetune", "report"})
    if unknown:
        raise SweepError(f"unknown phase(s) {unknown}; phases are pretrain, finetune, report")
    check_launcher(launcher)
    validate(ctx)
    client = tracking.setup(ctx.tracking_uri, ctx.experiment)
    env = environment()
    record = None
    if not dry_run:
        record = tracking.RunLogger.start(
            client, ctx.experiment, f"sweep-{ctx.spec.scale_name}",
            tags={tracking.TAG_KIND: "sweep", tracking.TAG_SWEEP: ctx.spec.name, "scale": ctx.spec.scale_name,
                  "command": command or f"python -m electra_ablate.sweep sweep={ctx.spec.name}",
                  "launcher": " ".join(launcher) or "hydra/launcher=basic", "git_commit": tracking.git_commit(),
                  **env})
    results: list[PhaseResult] = []
    report_path = None
    tic = time.perf_counter()
    try:
        if "pretrain" in phases:
            results.append(run_pretrain_phase(ctx, client, launcher, dry_run))
        if "finetune" in phases:
            results.append(run_finetune_phase(ctx, client, launcher, dry_run))
        if record is not None:
            record.set_tags({f"phase.{r.name}": json.dumps({"jobs": r.jobs, "returncode": r.returncode,
                                                            "seconds": round(r.seconds, 1),
                                                            "command": shell_join(r.command)}) for r in results})
            record.log_metrics({"wall_time_s": time.perf_counter() - tic}, step=0)
        if "report" in phases and not dry_run:
            from electra_ablate.report.build import write_report

            report_path = write_report(ctx, client, report_dir or REPO_ROOT / "reports",
                                       running_sweep_run=record.run_id if record else None,
                                       running_wall_time=time.perf_counter() - tic)
    except BaseException:
        if record is not None:
            record.finish("FAILED")
        raise
    if record is not None:
        record.log_metrics({"wall_time_s": time.perf_counter() - tic}, step=1)
        record.finish("FINISHED")
    return SweepResult(results, report_path)


def context_from_cfg(cfg: DictConfig) -> SweepContext:
    """The sweep context of a composed conf/sweep.yaml (the runner's and the report's config)."""
    paths = {k: str(cfg.paths[k]) for k in ("root_dir", "data_dir", "output_root", "cache_dir")}
    return make_context(cfg.sweep, cfg.scale, paths, tracking.resolve_tracking_uri(cfg.logger.tracking_uri),
                        list(cfg.pretrain_overrides), list(cfg.finetune_overrides))


LAUNCHER_PREFIXES = ("hydra/launcher", "hydra.launcher", "hydra.callbacks")


def launcher_overrides(hydra_overrides: Sequence[str]) -> list[str]:
    """The runner's own `hydra/launcher=...`, `hydra.launcher.*` and `hydra.callbacks.*` overrides: handed on
    to every multirun (the runner itself launches nothing through Hydra)."""
    return [o for o in hydra_overrides if o.lstrip("+~").startswith(LAUNCHER_PREFIXES)]


@hydra.main(config_path=str(cli.CONF_DIR), config_name="sweep", version_base="1.3")
def main(cfg: DictConfig) -> str | None:
    ctx = context_from_cfg(cfg)
    hydra_args = [o for o in HydraConfig.get().overrides.hydra if not o.startswith("hydra.mode=")]
    command = shell_join(["python", "-m", "electra_ablate.sweep", *HydraConfig.get().overrides.task, *hydra_args])
    result = run_sweep(ctx, launcher_overrides(hydra_args), list(cfg.phases), Path(cfg.report_dir), bool(cfg.dry_run), command)
    for r in result.phases:
        print(f"{r.name}: {r.jobs} job(s) launched" + (f", exit code {r.returncode}" if r.returncode else "")
              + (f", {r.seconds:.0f} s" if r.seconds else ""))
    if result.report:
        print(f"report: {result.report}")
    return str(result.report) if result.report else None


def cli_main() -> None:
    """Console entry: a misspelt key stops here with the keys it may mean, before Hydra starts (cli.py)."""
    cli.check_args("sweep")
    main()


if __name__ == "__main__":
    cli_main()
