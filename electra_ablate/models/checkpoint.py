"""The on-disk form of a pre-trained network: what fine-tuning and export load.

A pre-trained directory holds `config.json` (the encoder sizes, which heads it has, the objective that made
it, the step), `model.pt` (the state dict of the network that gets fine-tuned: the discriminator for
`electra`/`electra_15`, the MLM model otherwise), `generator.pt` when there is a neural generator, and
`vocab.txt`, so the directory alone is enough to fine-tune or export. Written to a temporary name and
renamed, so a crash never leaves a half-written directory behind.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import fields
from pathlib import Path

import torch

from electra_ablate.common import stops
from electra_ablate.models.encoder import ElectraForPretraining, EncoderConfig

CONFIG_NAME = "config.json"
MODEL_NAME = "model.pt"
GENERATOR_NAME = "generator.pt"
VOCAB_NAME = "vocab.txt"


class CheckpointError(ValueError):
    pass


def _network_meta(net: ElectraForPretraining) -> dict:
    return {"config": net.config.to_dict(), "mlm_head": net.has_mlm_head, "disc_head": net.has_disc_head}


def save_pretrained(
    directory: str | Path,
    model: ElectraForPretraining,
    vocab_file: str | Path,
    meta: dict,
    generator: ElectraForPretraining | None = None,
) -> Path:
    """Write `model` (and `generator`) atomically to `directory`; returns the directory."""
    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    info = {"format": "electra-ablate/1", "model": _network_meta(model), **meta}
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, tmp / MODEL_NAME)
    if generator is not None:
        info["generator"] = _network_meta(generator)
        torch.save({k: v.detach().cpu() for k, v in generator.state_dict().items()}, tmp / GENERATOR_NAME)
    shutil.copyfile(vocab_file, tmp / VOCAB_NAME)
    (tmp / CONFIG_NAME).write_text(json.dumps(info, indent=2, sort_keys=True))
    with stops.deferred():  # a stop (SIGTERM) never falls between removing the old directory and the rename
        if directory.exists():
            shutil.rmtree(directory)
        tmp.rename(directory)
    return directory


def encoder_config(d: dict) -> EncoderConfig:
    known = {f.name for f in fields(EncoderConfig)}
    return EncoderConfig(**{k: v for k, v in d.items() if k in known})


def read_info(directory: str | Path) -> dict:
    directory = Path(directory)
    path = directory / CONFIG_NAME
    if not path.is_file():
        raise CheckpointError(
            f"{directory} is not a pre-trained directory: {CONFIG_NAME} is missing "
            "(expected the output of electra_ablate.pretrain, e.g. <run>/pretrained/final)"
        )
    info = json.loads(path.read_text())
    if info.get("format") != "electra-ablate/1":
        raise CheckpointError(f"{path}: unknown format {info.get('format')!r}; expected 'electra-ablate/1'")
    return info


def load_pretrained(directory: str | Path, which: str = "model") -> tuple[ElectraForPretraining, dict]:
    """Load the fine-tunable network (`which="model"`) or the generator; returns (network, info)."""
    directory = Path(directory)
    info = read_info(directory)
    if which not in info:
        raise CheckpointError(f"{directory} has no {which!r} network (it has: model{', generator' if 'generator' in info else ''})")
    meta = info[which]
    net = ElectraForPretraining(encoder_config(meta["config"]), mlm_head=meta["mlm_head"], disc_head=meta["disc_head"])
    state = torch.load(directory / (MODEL_NAME if which == "model" else GENERATOR_NAME), map_location="cpu")
    missing, unexpected = net.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "generator_lm_head.weight"]  # tied to the word embeddings
    if missing or unexpected:
        raise CheckpointError(f"{directory}: state dict does not match its config (missing {missing}, unexpected {unexpected})")
    net.tie_weights()
    return net, info
