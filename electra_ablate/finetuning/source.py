"""What to fine-tune: a pre-trained directory, an MLflow pre-training run (its final or an intermediate
checkpoint), a transformers checkpoint (`hf:<id or dir>`), or nothing (`none`: the random-init floor, or
`random_init: true` with a checkpoint's shape and vocabulary). Every check runs before any MLflow run exists."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from omegaconf import DictConfig, OmegaConf
import torch
from torch import nn

from electra_ablate.data.tokenizer import read_vocab
from electra_ablate.models.checkpoint import CheckpointError, encoder_config, load_pretrained
from electra_ablate.models.encoder import ElectraForPretraining, ElectraModel, EncoderConfig
from electra_ablate.tracking import runs as tracking

RUN_ID = re.compile(r"^[0-9a-f]{32}$")


class FinetuneError(ValueError):
    """Bad fine-tuning input: a checkpoint, run id or setting that cannot work."""


# --- what to fine-tune -----------------------------------------------------------------------------------


class Pretrained(NamedTuple):
    """A loaded starting point: builds a fresh encoder per task (the random one after seeding)."""

    spec: str  # normalised `pretrained` value: part of the run identity
    make_encoder: Callable[[], ElectraModel]
    config: EncoderConfig
    vocab_file: Path
    size: str  # small | base | large: picks the protocol's lr and layer decay
    run_id: str | None  # the pre-training run, when known
    step: int | None
    tags: dict[str, str]  # the pre-training run's tags (sweep, variant), when it is in this store
    lowercase: bool | None = None  # the checkpoint's own tokenizer setting, when it has one
    model_name: str | None = None  # e.g. tiny/small (the pre-training `model` option), for the `model` tag


def normalise_spec(spec: str) -> str:
    """The `pretrained` value as it enters the run identity (directories as absolute paths)."""
    spec = str(spec)
    if spec == "none" or spec.startswith("hf:") or RUN_ID.match(spec) or not Path(spec).is_dir():
        return spec
    return str(Path(spec).resolve())


def size_name(model_name: str | None, hidden_size: int) -> str:
    """small/base/large for the protocol defaults: the pre-training model name, else the hidden size."""
    if model_name in ("small", "base", "large"):
        return model_name
    if model_name == "tiny":
        return "small"
    return "large" if hidden_size >= 1024 else "base" if hidden_size >= 768 else "small"


def checkpoint_of_run(client, run_id: str, step: int | None) -> Path:
    """The checkpoint directory an MLflow pre-training run recorded (final, or the one saved at `step`)."""
    try:
        run = client.get_run(run_id)
    except Exception as e:  # MlflowException: no such run
        raise FinetuneError(
            f"pretrained={run_id}: no MLflow run with this id in {client.tracking_uri} "
            "(set logger.tracking_uri / MLFLOW_TRACKING_URI to the store of the pre-training run)"
        ) from e
    tags = run.data.tags
    if step is None:
        if tracking.TAG_CHECKPOINT not in tags:
            raise FinetuneError(
                f"pretrained={run_id}: the run has no {tracking.TAG_CHECKPOINT!r} tag (status "
                f"{run.info.status}); it saved no final checkpoint. Pass a checkpoint directory or "
                "pretrained_step=<N> for an intermediate one"
            )
        return Path(tags[tracking.TAG_CHECKPOINT])
    steps = json.loads(tags.get("checkpoints", "{}"))
    if str(step) not in steps:
        raise FinetuneError(
            f"pretrained_step={step}: run {run_id} has no checkpoint at that step; it has steps "
            f"{sorted(int(s) for s in steps)}"
        )
    return Path(steps[str(step)])


def run_tags(client, run_id: str | None) -> dict[str, str]:
    if run_id is None or client is None:
        return {}
    try:
        return dict(client.get_run(run_id).data.tags)
    except Exception:  # a run from another store: the link still goes in pretrain_run_id
        return {}


def with_dropout(config: EncoderConfig, cfg: DictConfig) -> EncoderConfig:
    return dataclasses.replace(
        config, hidden_dropout_prob=float(cfg.dropout.hidden), attention_probs_dropout_prob=float(cfg.dropout.attention)
    )


def from_network(
    spec: str, net: ElectraForPretraining, info: dict, vocab_file: Path, cfg: DictConfig, client, run_id=None
) -> Pretrained:
    config = with_dropout(net.config, cfg)
    # A random-init arm needs only the shape: no copy of weights it will not load.
    state = {} if cfg.random_init else {k: v.clone() for k, v in net.electra.state_dict().items()}
    run_id = run_id or info.get("run_id")
    tags = run_tags(client, run_id)

    def make_encoder() -> ElectraModel:
        encoder = ElectraModel(config)
        encoder.load_state_dict(state)
        return encoder

    def make_random_encoder() -> ElectraModel:
        # The pre-training init (N(0, 0.02)) from its own generator: seeded by the fine-tuning seed and the
        # pre-training run's seed, so the groups of a random-init arm are independent draws.
        group = int(tags.get("seed", info.get("seed", 0)) or 0)
        with torch.random.fork_rng(devices=[]):
            digest = hashlib.sha256(f"random_init seed={int(cfg.seed)} group={group}".encode()).digest()
            torch.manual_seed(int.from_bytes(digest[:8], "little") >> 1)
            return ElectraForPretraining(config, disc_head=True).electra

    step = info.get("step")
    return Pretrained(
        spec, make_random_encoder if cfg.random_init else make_encoder, config, Path(vocab_file),
        size_name(info.get("model_name"), config.hidden_size), run_id, None if step is None else int(step), tags,
        info.get("do_lower_case"), info.get("model_name"),
    )


def reinit_top_layers(encoder: ElectraModel, n: int, seed: int) -> ElectraModel:
    """Re-initialise the encoder's top `n` Transformer blocks in place with the pre-training init (weights
    N(0, initializer_range), zero biases, LayerNorm (1, 0)); a pre-LN encoder's final LayerNorm goes with the top
    block, as in layer-wise decay. Zhang et al. 2021 ("Revisiting Few-sample BERT Fine-tuning"): the
    top layers of a pre-trained encoder specialise to its pre-training task and fine-tune better from scratch.
    Drawn from their own generator (seeded by the fine-tuning seed), so the classifier's init and the data order
    are those of the same run without re-initialisation."""
    layers = encoder.encoder.layer
    if not 0 <= n <= len(layers):
        raise FinetuneError(f"reinit_top_layers={n} must be between 0 and the encoder's {len(layers)} layers")
    if n == 0:
        return encoder
    modules = [m for block in layers[len(layers) - n:] for m in block.modules()]
    if hasattr(encoder.encoder, "LayerNorm"):
        modules.append(encoder.encoder.LayerNorm)
    std = encoder.config.initializer_range
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(int.from_bytes(hashlib.sha256(f"reinit_top_layers seed={seed}".encode()).digest()[:8],
                                         "little") >> 1)
        for m in modules:
            if isinstance(m, nn.Linear):
                m.weight.normal_(0.0, std)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.LayerNorm):
                m.weight.fill_(1.0)
                m.bias.zero_()
    return encoder


def resolve_pretrained(cfg: DictConfig, client) -> Pretrained:
    spec = normalise_spec(cfg.pretrained)
    step = cfg.pretrained_step
    if step is not None and not RUN_ID.match(spec):
        raise FinetuneError(
            f"pretrained_step={step} needs pretrained=<MLflow run id>; for a directory, pass the step's "
            f"directory itself (e.g. <run>/pretrained/step_{step})"
        )
    if cfg.random_init and spec == "none":
        raise FinetuneError("random_init=true takes its architecture and vocabulary from a checkpoint: give "
                            "pretrained=<run id | dir | hf:...>, or use pretrained=none (model=..., glue_data.vocab_file=...)")
    if spec == "none":
        vocab_file = Path(cfg.glue_data.vocab_file)
        vocab_size = len(read_vocab(vocab_file))
        model = OmegaConf.to_container(cfg.model, resolve=True)
        config = with_dropout(encoder_config({**model, "vocab_size": vocab_size}), cfg)

        def make_encoder() -> ElectraModel:
            # The pre-training init (N(0, 0.02)), drawn after the run's seed is set.
            return ElectraForPretraining(config, disc_head=True).electra

        return Pretrained(spec, make_encoder, config, vocab_file, size_name(model.get("name"), config.hidden_size),
                          None, 0, {}, None, model.get("name"))
    if spec.startswith("hf:"):
        try:
            from electra_ablate.hf.importing import import_pretrained  # needs transformers: imported only here
        except ImportError as e:
            raise FinetuneError(
                f"pretrained={spec} needs the Hugging Face extra (pip install 'electra-ablate[hf]'): {e}"
            ) from e
        net, info, vocab_file = import_pretrained(spec[len("hf:"):], cache_dir=Path(cfg.paths.cache_dir) / "hf")
        return from_network(spec, net, info, vocab_file, cfg, client)
    if RUN_ID.match(spec):
        if client is None:
            store = cfg.logger.tracking_uri or tracking.default_tracking_uri()
            raise FinetuneError(f"pretrained={spec}: there is no MLflow store at {store} yet, so no such run; set "
                                "logger.tracking_uri / MLFLOW_TRACKING_URI to the store of the pre-training run")
        directory = checkpoint_of_run(client, spec, step)
        net, info = load_pretrained(directory)
        return from_network(spec, net, info, directory / "vocab.txt", cfg, client, run_id=spec)
    if Path(spec).is_dir():
        try:
            net, info = load_pretrained(spec)
        except CheckpointError as e:
            raise FinetuneError(f"{e}; for a transformers checkpoint directory use pretrained=hf:{spec}") from e
        return from_network(spec, net, info, Path(spec) / "vocab.txt", cfg, client)
    raise FinetuneError(
        f"pretrained={spec!r} is neither a directory, an MLflow run id (32 hex digits), hf:<dir or hub id>, "
        "nor none"
    )
