"""A run's identity: the hash of its resolved config without the settings that only change speed or
bookkeeping, so a finished run is found and never recomputed (tracking/runs.py looks runs up by it).

Code moves, new keys and renamed spellings must not make finished runs new: the tables and legacy functions
below hash what runs recorded before each change, and tests/test_identity_stability.py holds every shipped
sweep to its recorded identities.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from omegaconf import DictConfig, OmegaConf

# Config groups and keys that change speed, placement or bookkeeping, never the result (see cramming's
# "impl" group): they are left out of the run identity.
IDENTITY_EXCLUDE = ("paths", "logger", "runtime", "hydra", "sweep", "run_name", "preset")
TRAINER_IDENTITY_EXCLUDE = (
    "accelerator",
    "devices",
    "strategy",
    "num_nodes",
    "enable_progress_bar",
    "log_every_n_steps",
    "checkpoint_every_n_steps",
)

# Where a class chosen by `_target_` lived when run identities were first recorded. A `_target_` says where
# code lives, not what it computes, so moving a class must not change the identity of runs that use it (they
# would be trained again): identities hash the old path of a moved class, and leave out the `_target_` of a
# config group that had none (value None). tests/test_identity_stability.py holds every shipped sweep to this.
IDENTITY_TARGETS: dict[str, str | None] = {
    "electra_ablate.training.system.PretrainSystem": "electra_ablate.system.PretrainSystem",
    "electra_ablate.data.corpus.HFDatasetDataModule": "electra_ablate.corpus.HFDatasetDataModule",
    "electra_ablate.data.corpus.TextFilesDataModule": "electra_ablate.corpus.TextFilesDataModule",
    "electra_ablate.data.pretraining.PretrainDataModule": "electra_ablate.data.PretrainDataModule",
    "electra_ablate.data.module.PretrainDataModule": "electra_ablate.data.PretrainDataModule",
    "electra_ablate.data.module.TextFilesDataModule": "electra_ablate.corpus.TextFilesDataModule",
    "electra_ablate.data.module.HFDatasetDataModule": "electra_ablate.corpus.HFDatasetDataModule",
    "electra_ablate.generators.neural.NeuralGenerator": "electra_ablate.generators.NeuralGenerator",
    "electra_ablate.sharing.none.NoSharing": None,
    "electra_ablate.sharing.embeddings.EmbeddingSharing": None,
    "electra_ablate.sharing.all.AllSharing": None,
    "electra_ablate.generators.fixed.UniformGenerator": "electra_ablate.generators.UniformGenerator",
    "electra_ablate.generators.fixed.UnigramGenerator": "electra_ablate.generators.UnigramGenerator",
}


def _legacy_targets(node):
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "_target_" and isinstance(v, str) and v in IDENTITY_TARGETS:
                if IDENTITY_TARGETS[v] is not None:
                    out[k] = IDENTITY_TARGETS[v]
            else:
                out[k] = _legacy_targets(v)
        return out
    if isinstance(node, list):
        return [_legacy_targets(v) for v in node]
    return node


# The `weighting` group came after run identities were first recorded, when a learned lambda was spelt
# objective.disc_weight=learned (starting at the paper's 50): identities hash that spelling, and leave the
# group out for the paper's fixed weights.
_FIXED_WEIGHTING = {"_target_": "electra_ablate.weighting.fixed.FixedWeights", "name": "fixed"}
_LEARNED_WEIGHTING = {"_target_": "electra_ablate.weighting.learned.LearnedWeights", "name": "learned"}


def _legacy_weighting(container: dict) -> dict:
    weighting = container.get("weighting")
    if weighting == _FIXED_WEIGHTING:
        container.pop("weighting")
    elif weighting == _LEARNED_WEIGHTING and (container.get("objective") or {}).get("disc_weight") == 50.0:
        container.pop("weighting")
        container["objective"] = {**container["objective"], "disc_weight": "learned"}
    return container


# Keys added to a config group after run identities were first recorded, with the value that reproduces what
# runs did before the key existed: identities leave such a key out while it has that value, so adding an
# option never re-runs finished work, and choosing another value makes a new identity.
NEW_KEY_DEFAULTS: dict[str, object] = {
    # Masking options of the reference (pretrain_helpers.mask, configure_pretraining.py); these values reproduce
    # the masking that runs had before the options existed.
    "objective.max_predictions_per_seq": None,
    "objective.position_sampling": "without_replacement",
    "objective.disallow_correct": False,
    "optim.bias_correction": True,  # pre-training's torch AdamW (the reference's update: false)
    "finetune_optim.bias_correction": True,  # fine-tuning's torch AdamW ...
    "finetune_optim.loss_reduction": "mean",  # ... on the batch-mean loss (the reference: false, sum)
    # Block layout options beyond the paper; these values are the paper's layout that runs had before.
    "model.layer_norm": "post",
    "model.linear_bias": True,
    "pooling": "cls",  # fine-tuning's sentence representation: the reference's [CLS] state
    "reinit_top_layers": 0,  # fine-tuning from every pre-trained layer, as the paper does
}


def _drop_new_key_defaults(container: dict) -> dict:
    for dotted, default in NEW_KEY_DEFAULTS.items():
        *parents, key = dotted.split(".")
        node = container
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and key in node and node[key] == default:
            del node[key]
    return container


# The data group names its files inside the data folder, not where that folder is: a value under
# `paths.data_dir` is hashed as DATA_DIR_SPELLING + its path inside the folder, so moving or mounting the data
# elsewhere keeps every identity. What the files hold is recorded on each run (data.vocab_sha256,
# data.examples_sha256) and compared by the report. Runs recorded before this hashed the absolute path:
# `identity_hashes` adds that legacy hash, so they are still found where the data has not moved.
DATA_DIR_SPELLING = "${paths.data_dir}"


def _data_dir_relative(node, data_dir: str):
    if isinstance(node, dict):
        return {k: _data_dir_relative(v, data_dir) for k, v in node.items()}
    if isinstance(node, list):
        return [_data_dir_relative(v, data_dir) for v in node]
    if isinstance(node, str) and (node == data_dir or node.startswith(data_dir + "/")):
        inside = node[len(data_dir):].lstrip("/")  # a data_dir given with a trailing / makes a double //
        return f"{DATA_DIR_SPELLING}/{inside}" if inside else DATA_DIR_SPELLING
    return node


def identity(cfg: DictConfig, legacy_data_paths: bool = False) -> dict:
    """The resolved config minus speed/bookkeeping settings: what makes two runs the same run.
    `legacy_data_paths`: the data group's absolute paths, as identities were before DATA_DIR_SPELLING."""
    container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    container = _drop_new_key_defaults(_legacy_weighting(_legacy_targets(container)))
    assert isinstance(container, dict)
    data_dir = str((container.get("paths") or {}).get("data_dir") or "").rstrip("/")
    if data_dir and not legacy_data_paths and isinstance(container.get("data"), dict):
        container["data"] = _data_dir_relative(container["data"], data_dir)
    out = {k: v for k, v in container.items() if k not in IDENTITY_EXCLUDE}
    if isinstance(out.get("trainer"), dict):
        out["trainer"] = {k: v for k, v in out["trainer"].items() if k not in TRAINER_IDENTITY_EXCLUDE}
    return out


# A number is hashed by its value, not by how it was written: `objective.disc_weight=50` and `=50.0`, or
# `generator.hidden_size=1` and `=1.0`, are one run. An integral float is hashed as the int (a bool stays a
# bool). Identities hashed before this kept the spelling, and most shipped configs hold integral floats
# (`gen_weight: 1.0`), so their hashes changed: `identity_hashes` adds the hash of the numbers as written,
# so runs recorded before are still found when the config is written as it was then (a shipped sweep is).
def _canonical_numbers(node):
    if isinstance(node, dict):
        return {k: _canonical_numbers(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_canonical_numbers(v) for v in node]
    if isinstance(node, float) and node.is_integer():
        return int(node)
    return node


def _digest(data: Mapping) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_hash(cfg: DictConfig | Mapping) -> str:
    """The run identity's hash: `identity(cfg)` for a config, `cfg` itself for an identity dict (fine-tuning's)."""
    data = identity(cfg) if isinstance(cfg, DictConfig) else dict(cfg)
    return _digest(_canonical_numbers(data))


def identity_hashes(cfg: DictConfig | Mapping) -> list[str]:
    """The config hash of `cfg`, then the hashes its runs were tagged with before: the config's numbers as
    written (before `_canonical_numbers`), and for a config also its data paths absolute (before
    DATA_DIR_SPELLING). A lookup that tries them all finds the runs of every spelling."""
    hashes = [config_hash(cfg)]
    if isinstance(cfg, DictConfig):
        hashes += [_digest(identity(cfg)), _digest(identity(cfg, legacy_data_paths=True))]
    else:
        hashes.append(_digest(dict(cfg)))
    return list(dict.fromkeys(hashes))
