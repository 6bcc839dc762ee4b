"""Which fine-tuning runs a config asks for: the selected GLUE tasks (one, or task=glue's members with local data),
each task's settings (`per_task.<task>` merged over the config) and data, and the identity that makes two runs
the same run."""

from __future__ import annotations

import logging

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError

from electra_ablate.finetuning.source import FinetuneError
from electra_ablate.glue import tasks as glue
from electra_ablate.glue.readers import double_unordered, load_split
from electra_ablate.tracking import runs as tracking

log = logging.getLogger(__name__)

# Config keys that only say where data lives or how fast it goes: left out of the run identity along with
# tracking.IDENTITY_EXCLUDE (paths, logger, runtime, hydra, sweep).
DATA_IDENTITY_EXCLUDE = ("source", "dir", "hf_path", "vocab_file", "eval_batch_size", "predict_test")


def selected_tasks(cfg: DictConfig) -> list[tuple[glue.TaskSpec, DictConfig]]:
    """(spec, task config) for every task to run: one, or task=glue's members whose data is available."""
    if "members" not in cfg.task:
        return [(glue.get_task(cfg.task.name), cfg.task)]
    members = [(glue.get_task(name), member) for name, member in cfg.task.members.items()]
    if cfg.glue_data.source != "tsv":
        return members
    available = set(glue.available_tasks(cfg.glue_data.dir))
    missing = [t.name for t, _ in members if t.name not in available]
    chosen = [(t, m) for t, m in members if t.name in available]
    if not chosen:
        raise glue.GlueDataError(
            f"task=glue: no GLUE task has its train and dev files under glue_data.dir={cfg.glue_data.dir} "
            "(original GLUE layout: CoLA/train.tsv, ...); point glue_data.dir at a GLUE download or use "
            "glue_data.source=hf"
        )
    if missing:
        log.warning("task=glue: data not found under %s for %s; running %s", cfg.glue_data.dir, ", ".join(missing),
                 ", ".join(t.name for t, _ in chosen))
    return chosen


# What a `per_task` entry may not set: what the run fine-tunes, where it is recorded, and the table itself.
PER_TASK_FIXED = ("pretrained", "pretrained_step", "random_init", "seed", "per_task", "paths", "logger", "sweep",
                  "hydra", "run_name", "model")


def for_task(cfg: DictConfig, name: str, task_cfg: DictConfig) -> tuple[DictConfig, DictConfig]:
    """(config, task config) of one task's runs: `per_task.<name>` merged over `cfg`, its `task` part over the
    task's own config (a member's, for task=glue). Without an entry for the task, `cfg` and `task_cfg` as given."""
    table = cfg.get("per_task") or {}
    unknown = sorted(set(table) - set(glue.TASKS))
    if unknown:
        raise FinetuneError(f"per_task names {unknown}, which are not GLUE tasks; its keys are task names: "
                            f"{', '.join(glue.TASKS)}")
    if name not in table:
        return cfg, task_cfg
    entry = OmegaConf.to_container(table[name], resolve=True)
    if not isinstance(entry, dict):
        raise FinetuneError(f"per_task.{name}={entry!r} must be a mapping of fine-tuning settings, e.g. "
                            f"per_task.{name}.glue_data.max_seq_length=128")
    fixed = sorted(set(entry) & set(PER_TASK_FIXED)) + (["task.name"] if "name" in (entry.get("task") or {}) else [])
    if fixed:
        raise FinetuneError(f"per_task.{name} sets {fixed}, which one task cannot change; set them for the whole "
                            "run instead")
    task_part = entry.pop("task", None) or {}
    base, member = OmegaConf.create(OmegaConf.to_container(cfg)), OmegaConf.create(OmegaConf.to_container(task_cfg))
    OmegaConf.set_struct(base, True)
    OmegaConf.set_struct(member, True)
    try:
        merged = OmegaConf.merge(base, entry)
        member = OmegaConf.merge(member, task_part)
    except ConfigKeyError as error:
        where = f"task.{error.full_key}" if error.full_key in task_part else error.full_key
        raise FinetuneError(f"per_task.{name}.{where} is not a fine-tuning setting; per_task entries take the keys "
                            "of conf/finetune.yaml (e.g. glue_data.max_seq_length, task.epochs)") from None
    if "members" in merged.task:
        merged.task.members[name] = member
    else:
        merged.task = member
    return merged, member


def load_task_data(cfg: DictConfig, task: glue.TaskSpec) -> dict[str, list[glue.Example]]:
    """Every split of a task, checked (layout, labels), subset and doubled as configured."""
    d = cfg.glue_data
    data = {s: load_split(task, s, d.source, d.dir, d.hf_path) for s in task.splits}
    for split, limit in [("train", d.max_train_examples)] + [(s.name, d.max_eval_examples) for s in task.dev_splits]:
        if limit is not None:
            data[split] = data[split][: int(limit)]
        if not data[split]:
            raise glue.GlueDataError(f"task {task.name}: split {split} has no examples")
    if task.unordered and d.double_unordered:
        data["train"] = double_unordered(data["train"])
    return data


def run_identity(cfg: DictConfig, task_cfg: DictConfig, spec: str) -> dict:
    """What makes two fine-tuning runs the same run (hashed into the config_hash tag)."""
    ident = tracking.identity(cfg)
    ident.pop("run_name", None)
    ident.pop("per_task", None)  # merged into the task's own settings by for_task
    ident["task"] = OmegaConf.to_container(task_cfg, resolve=True)  # a glue member hashes like task=<name>
    ident["glue_data"] = {k: v for k, v in ident["glue_data"].items() if k not in DATA_IDENTITY_EXCLUDE}
    ident["pretrained"] = spec
    if not ident.get("random_init"):
        ident.pop("random_init", None)  # the default leaves identities from before the option unchanged
    else:
        # Random weights: which checkpoint of the run lent the shape and vocabulary (the same at every step) is
        # not part of the run; spelt as the final checkpoint's, as these identities were before any other.
        ident["pretrained_step"] = None
    if spec != "none":
        ident.pop("model", None)  # the checkpoint decides the size
    return ident
