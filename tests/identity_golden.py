"""Run identities of every shipped sweep, computed with fixed paths: the guard that keeps finished sweeps
skipped when code moves. `python tests/identity_golden.py` rewrites tests/fixtures/identities.json; only do
that for a change that is meant to alter identities, and ship a migration with it."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from electra_ablate.finetuning import run as finetuning
from electra_ablate.finetuning import source as finetune_source
from electra_ablate.tracking import runs as tracking
from electra_ablate.sweep.compose import FINETUNE_GROUP, compose_session, make_context
from electra_ablate.sweep.jobs import Checkpoint, PretrainJob
from electra_ablate.sweep.spec import read_raw

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "fixtures" / "identities.json"
# The pre-training identities as recorded before the data group's paths were hashed relative to the data folder
# (tracking.DATA_DIR_SPELLING): `tracking.identity_hashes` must still produce them, so those runs are found.
LEGACY_DATA_PATHS = Path(__file__).resolve().parent / "fixtures" / "identities_absolute_data_paths.json"
# Every identity as recorded before numbers were hashed by value (an integral float as the int): the lookup
# (`tracking.identity_hashes`) must still produce them for the configs as shipped.
LEGACY_NUMBERS = Path(__file__).resolve().parent / "fixtures" / "identities_numbers_as_written.json"
PATHS = {"root_dir": "/golden", "data_dir": "/golden/data", "output_root": "/golden/out", "cache_dir": "/golden/cache"}
FAKE_RUN = "0" * 32


def scales_of(path: Path) -> list[str | None]:
    raw = read_raw(path)  # with the keys of its `base` sweep
    return sorted(raw.get("scales") or {}) or [None]


def current_identities(tmp: Path, lookups: dict[str, list[str]] | None = None) -> dict[str, str]:
    """Every shipped job's config hash; `lookups` (when given) gets every hash each job's runs are looked up
    by (tracking.identity_hashes: the current one, then the legacy spellings)."""
    out: dict[str, str] = {}
    for path in sorted((ROOT / "sweeps").glob("*.yaml")):
        for scale in scales_of(path):
            ctx = make_context(path, scale, PATHS, "sqlite:////golden/mlflow.db")
            ctx = dataclasses.replace(ctx, workdir=tmp / path.stem / str(scale))
            with compose_session():
                ctx.write_pretrain_configs()
                for v in ctx.spec.pretrained_variants:
                    cfg = ctx.compose_pretrain(PretrainJob(v.label, ctx.spec.pretrain_seeds[0]))
                    hashes = tracking.identity_hashes(cfg)
                    out[f"{path.stem}/{scale}/{v.label}/pretrain"] = hashes[0]
                    if lookups is not None:
                        lookups[f"{path.stem}/{scale}/{v.label}/pretrain"] = hashes
                for v in ctx.spec.variants:
                    # A sweep of several recipes: each recipe on every task (where recipes differ is per task).
                    jobs = ([(r, t) for r in ctx.spec.recipes for t in ctx.spec.tasks] if ctx.spec.recipes
                            else [(None, ctx.spec.tasks[0])])
                    for recipe, task in jobs:
                        key = f"{path.stem}/{scale}/{v.label}/finetune/{task}" + (f"/{recipe}" if recipe else "")
                        ident = finetune_identity(ctx, v, task, recipe)
                        out[key] = tracking.config_hash(ident)
                        if lookups is not None:
                            lookups[key] = tracking.identity_hashes(ident)
    return out


def finetune_identity(ctx, v, task: str, recipe: str | None) -> dict:
    """The run identity of variant `v`'s final-checkpoint job on `task`, seed 0 (under `recipe`, if the sweep has several)."""
    ckpt = (Checkpoint(v.label, None, None, None, True, None, recipe=recipe) if v.pretrained
            else Checkpoint(v.label, 0, FAKE_RUN, 1, True, 1.0, random_init=v.random_init_of is not None, recipe=recipe))
    ctx.write_finetune_config(ckpt)
    cfg = ctx.compose_finetune([ctx.searchpath, f"+{FINETUNE_GROUP}={ckpt.config_name}", f"task={task}", "seed=0"])
    (task_spec, task_cfg), = [t for t in finetuning.selected_tasks(cfg)]
    cfg, task_cfg = finetuning.for_task(cfg, task_spec.name, task_cfg)
    return finetuning.run_identity(cfg, task_cfg, finetune_source.normalise_spec(cfg.pretrained))


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        ids = current_identities(Path(tmp))
    GOLDEN.write_text(json.dumps(ids, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(ids)} identities to {GOLDEN}", file=sys.stderr)
