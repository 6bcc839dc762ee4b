"""A sweep's configs: the SweepContext (its spec, MLflow store and the overrides every job gets), the small
configs generated per variant and per checkpoint (`# @package _global_`, in the `sweep_variant` and
`sweep_checkpoint` groups that jobs find through `hydra.searchpath`), Hydra's compose API to see the config a
job will get, and the validation that composes every job's config before anything is launched.

A variant is a bundle of overrides, which a multirun's cartesian product cannot express, so each becomes a
generated config: group options go to its defaults list (`override /objective: electra`), dotted keys are
nested into the config body by OmegaConf."""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Quote, QuotedString
from hydra.core.singleton import Singleton
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from electra_ablate.common.io import write_text
from electra_ablate.glue import tasks as glue
from electra_ablate.sweep.jobs import Checkpoint, PretrainJob
from electra_ablate.sweep.spec import CONF_DIR, SweepError, SweepSpec, load_sweep
from electra_ablate.tracking import runs as tracking
from electra_ablate.training import checks

PRETRAIN_GROUP = "sweep_variant"  # generated config group of the pre-training phase
FINETUNE_GROUP = "sweep_checkpoint"  # ... and of the fine-tuning phase


# --- generated variant configs -----------------------------------------------------------------------------


def is_group(key: str) -> bool:
    """A key without a dot that names a folder of conf/ is a config group (`objective: bert`)."""
    return "." not in key and "/" not in key and (CONF_DIR / key).is_dir()


def split_overrides(overrides: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    groups = {k: str(v) for k, v in overrides.items() if is_group(k)}
    values = {k: v for k, v in overrides.items() if not is_group(k)}
    return groups, values


def _nest(values: Mapping[str, Any]) -> DictConfig:
    """`{"trainer.max_steps": 10}` -> `trainer: {max_steps: 10}`; OmegaConf.update would silently turn a plain
    value into a node to put a key below it, so that case stops here."""
    out = OmegaConf.create()
    for key, value in values.items():
        parent = key.rpartition(".")[0]
        if parent and not isinstance(OmegaConf.select(out, parent, default={}), (DictConfig, dict)):
            raise SweepError(f"override {key} sets a key below a plain value")
        OmegaConf.update(out, key, value, merge=True)
    return out


def config_text(overrides: Mapping[str, Any], extra: Mapping[str, Any], comment: str) -> str:
    """A `# @package _global_` config applying `overrides` (groups via the defaults list) and `extra`."""
    groups, values = split_overrides(overrides)
    body = OmegaConf.create({"defaults": [{f"override /{g}": option} for g, option in groups.items()]} if groups else {})
    body = OmegaConf.merge(body, _nest(values), extra)
    return f"# @package _global_\n# {comment}\n" + OmegaConf.to_yaml(body)


def write_config(path: Path, text: str) -> None:
    """Atomic, and only when the text changed: running jobs read these files, and an unchanged one keeps its
    modification time."""
    if not (path.is_file() and path.read_text() == text):
        write_text(path, text)


_OVERRIDES = OverridesParser.create()


def quote(value: Any) -> str:
    """A value as a Hydra override literal: as is when Hydra's override parser reads it back as the same
    string, else single-quoted by Hydra (e.g. `it's`, `true`, `a,b`, a path with `=`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)) or value is None:
        return "null" if value is None else repr(value)
    text = str(value)
    with contextlib.suppress(HydraException):
        parsed = _OVERRIDES.parse_override(f"key={text}").value()
        if type(parsed) is str and parsed == text:
            return text
    return QuotedString(text=text, quote=Quote.single).with_quotes()


# --- the sweep's context ------------------------------------------------------------------------------------


@dataclass
class SweepContext:
    """Everything both the runner and the report need to find a sweep's runs."""

    spec: SweepSpec
    tracking_uri: str
    base_overrides: list[str]  # paths.* and logger.*: the same for every job and for in-process composition
    pretrain_overrides: list[str]
    finetune_overrides: list[str]
    workdir: Path  # <output_root>/sweeps/<name>/<scale>
    bundle: str | None = None  # the results bundle the store was made from, when the report is rendered from one

    @property
    def experiment(self) -> str:
        return self.spec.experiment or self.spec.name

    @property
    def output_root(self) -> Path:
        return self.workdir.parents[2]  # the workdir is <output_root>/sweeps/<name>/<scale>

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
            sweep = {"keep_going": True, **({"seeds": list(v.pretrain_seeds)} if v.pretrain_seeds else {})}
            extra = OmegaConf.merge(self.sweep_tags(v.label), {"sweep": sweep, "run_name": f"{v.label}-s${{seed}}"})
            # What pre-training saves is in its runs' identity: a sweep fine-tuning fewer of them keeps `exports`.
            fractions = list(self.spec.exports) or [f for f in self.spec.checkpoints if f < 1.0]
            if fractions:
                extra["trainer"] = {"export_fractions": fractions}
            text = config_text(v.pretrain, extra, f"variant {v.label} of sweep {self.spec.name} (scale {self.spec.scale_name}); generated by electra_ablate.sweep from {self.spec.path.name}")
            write_config(self.conf_dir / PRETRAIN_GROUP / f"{v.label}.yaml", text)

    def write_finetune_config(self, ckpt: Checkpoint) -> None:
        v = self.spec.variant(ckpt.variant)
        target = {"pretrained": v.pretrained} if ckpt.run_id is None else {
            "pretrained": ckpt.run_id, "pretrained_step": None if ckpt.final else ckpt.step}
        if ckpt.random_init:
            target["random_init"] = True
        # A recipe of the sweep's list replaces the variant's own (`recipe` is a config group: the defaults list).
        overrides = v.finetune if ckpt.recipe is None else {**v.finetune, "recipe": ckpt.recipe}
        text = config_text(overrides, OmegaConf.merge(self.sweep_tags(v.label), target),
                           f"checkpoint {ckpt.config_name} of sweep {self.spec.name}; generated by electra_ablate.sweep")
        write_config(self.conf_dir / FINETUNE_GROUP / f"{ckpt.config_name}.yaml", text)

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
        return [PretrainJob(v.label, s) for v in self.spec.pretrained_variants
                for s in (v.pretrain_seeds or self.spec.pretrain_seeds)]


@contextlib.contextmanager
def fresh_hydra() -> Iterator[None]:
    """Hydra's compose API inside a running Hydra app: park the app's global state, restore it after."""
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
    with fresh_hydra(), initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        _SESSION["open"] = True
        try:
            yield
        finally:
            _SESSION["open"] = False


def compose_app(config_name: str, overrides: Sequence[str]) -> DictConfig:
    """The config a `python -m electra_ablate.<config_name>` job with these overrides would get."""
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
    base += [f"logger.tracking_uri={quote(tracking_uri)}", f"logger.experiment={quote(spec.experiment or spec.name)}"]
    workdir = Path(paths["output_root"]) / "sweeps" / spec.name / spec.scale_name
    return SweepContext(spec, tracking_uri, base, list(pretrain_overrides), list(finetune_overrides), workdir)


_ABSENT = object()


def _setting(key: str) -> str:
    """The config key a `per_task.<task>.<key>` override sets for one task (finetuning/tasks.for_task)"""
    parts = key.split(".")
    return ".".join(parts[2:]) if parts[0] == "per_task" and len(parts) > 2 and parts[1] in glue.TASKS else key


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
    unknown = [k for k in values if OmegaConf.select(cfg, _setting(k), default=_ABSENT) is _ABSENT]
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
        for recipe in spec.recipes or (None,):
            ckpt = (Checkpoint(v.label, None, None, None, True, None, recipe=recipe) if v.pretrained
                    else Checkpoint(v.label, 0, "0" * 32, 1, True, 1.0, random_init=v.random_init_of is not None,
                                    recipe=recipe))
            ctx.write_finetune_config(ckpt)
            ctx.compose_finetune([ctx.searchpath, f"+{FINETUNE_GROUP}={ckpt.config_name}", f"task={spec.tasks[0]}"])
    return composed


def context_from_cfg(cfg: DictConfig) -> SweepContext:
    """The sweep context of a composed conf/sweep.yaml (the runner's and the report's config)."""
    paths = {k: str(cfg.paths[k]) for k in ("root_dir", "data_dir", "output_root", "cache_dir")}
    return make_context(cfg.sweep, cfg.scale, paths, tracking.resolve_tracking_uri(cfg.logger.tracking_uri),
                        list(cfg.pretrain_overrides), list(cfg.finetune_overrides))
