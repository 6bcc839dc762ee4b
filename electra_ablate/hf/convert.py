"""Conversion between our networks and Hugging Face transformers: configs, state-dict keys, vocabulary sizes.

Our module names copy `modeling_electra.py`, so ELECTRA keys map one to one; BERT's differ only by prefix
(`bert.` -> `electra.`, `cls.predictions.transform` -> `generator_predictions`). Both libraries use exact
(erf) GELU for `hidden_act="gelu"`, which is the only activation our encoder implements. Export is in
hf/exporting.py, import in hf/importing.py.

transformers is an optional extra (`pip install 'electra-ablate[hf]'`): it is imported inside the
functions that need it (`require_transformers`), so the rest of the package imports without it.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import torch

from electra_ablate.models.encoder import ElectraForPretraining, EncoderConfig

CONF_MODEL_DIR = Path(__file__).resolve().parents[2] / "conf" / "model"
# The config fields that make a model size (conf/model/*.yaml); used to name an imported model.
SIZE_FIELDS = ("embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


class HFInteropError(ValueError):
    """A checkpoint that cannot be exported to or imported from transformers, with what to do about it."""


def require_transformers():
    try:
        import transformers
    except ImportError as e:
        raise ImportError(
            "exporting to or importing from Hugging Face needs transformers, an optional extra: "
            "pip install 'electra-ablate[hf]'"
        ) from e
    return transformers


# --------------------------------------------------------------------------------------------- configs


def electra_config(config: EncoderConfig):
    """Our encoder sizes -> `transformers.ElectraConfig` (same field names; GELU is exact erf in both).
    transformers' ELECTRA is post-LN with biases: a network with another block layout has no equivalent."""
    if config.layer_norm != "post" or not config.linear_bias:
        raise HFInteropError(
            f"this network has model.layer_norm={config.layer_norm}, model.linear_bias={config.linear_bias}; "
            "transformers' ELECTRA classes only have the paper's layout (post-LN, with biases), so it cannot be "
            "exported: fine-tune it here with `pretrained=<run id or dir>` instead")
    layout = {k: v for k, v in config.to_dict().items() if k not in ("layer_norm", "linear_bias")}
    return require_transformers().ElectraConfig(**layout, hidden_act="gelu")


def encoder_config(hf_config) -> EncoderConfig:
    """A transformers ELECTRA or BERT config -> our sizes. BERT has no factorized embeddings (E = H)."""
    values = {f.name: getattr(hf_config, f.name) for f in fields(EncoderConfig) if hasattr(hf_config, f.name)}
    if hf_config.model_type == "bert":
        values["embedding_size"] = hf_config.hidden_size
    if values.get("pad_token_id") is None:
        values["pad_token_id"] = 0
    return EncoderConfig(**values)


def infer_model_name(config: EncoderConfig) -> str:
    """The conf/model/*.yaml option with these sizes (e.g. `small`), else `custom-<H>h<L>l`."""
    from omegaconf import OmegaConf

    for path in sorted(CONF_MODEL_DIR.glob("*.yaml")):
        sizes = OmegaConf.load(path)
        if all(sizes.get(k) == getattr(config, k) for k in SIZE_FIELDS):
            return str(sizes.get("name", path.stem))
    return f"custom-{config.hidden_size}h{config.num_hidden_layers}l"


# ----------------------------------------------------------------------------------------- key mapping

# transformers key prefix -> our key prefix, first match wins. Anything unmatched is dropped and reported.
ELECTRA_KEY_MAP = (
    ("electra.", "electra."),
    ("discriminator_predictions.", "discriminator_predictions."),
    ("generator_predictions.", "generator_predictions."),
    ("generator_lm_head.", "generator_lm_head."),
)
# BERT's MLM head is ours with E = H: transform.{dense,LayerNorm} = generator_predictions, decoder = lm head.
BERT_KEY_MAP = (
    ("bert.embeddings.", "electra.embeddings."),
    ("bert.encoder.", "electra.encoder."),
    ("cls.predictions.transform.dense.", "generator_predictions.dense."),
    ("cls.predictions.transform.LayerNorm.", "generator_predictions.LayerNorm."),
    ("cls.predictions.decoder.", "generator_lm_head."),
)
# Skipped without a note: index buffers (persistent in transformers 4.x), and `cls.predictions.bias`, which
# transformers ties to `cls.predictions.decoder.bias` (the one its forward uses, read above).
SKIPPED_SUFFIXES = ("embeddings.position_ids", "embeddings.token_type_ids", "cls.predictions.bias")
KEY_MAPS = {"electra": ELECTRA_KEY_MAP, "bert": BERT_KEY_MAP}
HEAD_PREFIXES = {"disc": ("discriminator_predictions.",), "mlm": ("generator_predictions.", "generator_lm_head.")}


def to_transformers_state_dict(net: ElectraForPretraining, head: str) -> dict[str, torch.Tensor]:
    """The keys of transformers' `ElectraForPreTraining` (head="disc") or `ElectraForMaskedLM` ("mlm").

    Our names already are transformers' names, so this only selects the encoder plus one head.
    """
    prefixes = ("electra.", *HEAD_PREFIXES[head])
    return {k: v for k, v in net.state_dict().items() if k.startswith(prefixes)}


def from_transformers_state_dict(
    state: dict[str, torch.Tensor], model_type: str
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """A transformers ELECTRA/BERT state dict (with its `electra.`/`bert.` prefix) -> (our keys, dropped keys)."""
    ours, dropped = {}, []
    for key, value in state.items():
        if key.endswith(SKIPPED_SUFFIXES):
            continue
        for theirs, mine in KEY_MAPS[model_type]:
            if key.startswith(theirs):
                ours[mine + key[len(theirs) :]] = value
                break
        else:
            dropped.append(key)
    return ours, dropped


# ------------------------------------------------------------------------------------------ vocabulary


def vocab_size_of(vocab_file: str | Path) -> int:
    with open(vocab_file, encoding="utf-8") as f:
        return sum(1 for _ in f)


def check_vocab(config_vocab_size: int, vocab_file: str | Path, where: str) -> None:
    n = vocab_size_of(vocab_file)
    if n != config_vocab_size:
        raise HFInteropError(
            f"{where}: vocabulary size mismatch: the config says vocab_size={config_vocab_size} but {vocab_file} "
            f"has {n} entries. Use the vocabulary the model was trained with."
        )
