"""Export a pre-trained directory (`electra_ablate.models.checkpoint`) as transformers checkpoints.

One directory per network: `ElectraForPreTraining` for a discriminator head, `ElectraForMaskedLM` for an MLM
head, each with the tokenizer files `AutoTokenizer` needs (`python -m electra_ablate.export`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import NamedTuple

from electra_ablate.common.io import atomic_dir
from electra_ablate.hf.convert import (
    SKIPPED_SUFFIXES,
    HFInteropError,
    check_vocab,
    electra_config,
    require_transformers,
    to_transformers_state_dict,
)
from electra_ablate.models.checkpoint import VOCAB_NAME, load_pretrained, read_info
from electra_ablate.models.encoder import ElectraForPretraining

EXPORT_INFO_NAME = "export_info.json"


class ExportedNetwork(NamedTuple):
    """One transformers directory of an export: its name, the class that loads it, what it is."""

    name: str
    hf_class: str
    which: str  # "model" or "generator" in the pre-trained directory
    head: str  # "disc" or "mlm"
    description: str


def export_plan(info: dict) -> list[ExportedNetwork]:
    """Which transformers directories a pre-trained directory becomes, decided by the heads it has.

    - discriminator head only (objectives electra, electra_15) -> `discriminator/` (ElectraForPreTraining);
    - MLM head (bert, replace_mlm, all_tokens_mlm) -> `mlm/` (ElectraForMaskedLM), the network the paper
      fine-tunes for those objectives;
    - MLM head and discriminator head (all_tokens_mlm: the per-token head is its copy gate, paper section 3.3)
      -> also `copy_gate/` (ElectraForPreTraining: its logit is the copy-gate logit, not "replaced"), so no
      trained weight is lost;
    - a neural generator -> `generator/` (ElectraForMaskedLM), as google/electra-*-generator.
    """
    model = info["model"]
    plan = []
    if model["mlm_head"]:
        plan.append(
            ExportedNetwork("mlm", "ElectraForMaskedLM", "model", "mlm", "encoder + MLM head (fine-tune this)")
        )
        if model["disc_head"]:
            plan.append(
                ExportedNetwork(
                    "copy_gate", "ElectraForPreTraining", "model", "disc",
                    "same encoder + All-Tokens-MLM copy gate as the per-token head (sigmoid = copy probability)",
                )
            )
    elif model["disc_head"]:
        plan.append(
            ExportedNetwork("discriminator", "ElectraForPreTraining", "model", "disc", "discriminator (fine-tune this)")
        )
    if "generator" in info:
        plan.append(ExportedNetwork("generator", "ElectraForMaskedLM", "generator", "mlm", "MLM generator"))
    return plan


def guess_do_lower_case(vocab_file: str | Path) -> bool:
    """An uncased WordPiece vocabulary has no upper-case letters outside its [SPECIAL] tokens."""
    with open(vocab_file, encoding="utf-8") as f:
        tokens = [t.rstrip("\n") for t in f]
    return not any(t != t.lower() for t in tokens if not (t.startswith("[") and t.endswith("]")))


def write_tokenizer_files(directory: Path, vocab_file: str | Path, do_lower_case: bool, max_length: int) -> None:
    """vocab.txt + tokenizer_config.json: what `AutoTokenizer.from_pretrained` needs for a WordPiece model.

    `ElectraTokenizer` resolves to the fast/tokenizers WordPiece class in every transformers version.
    """
    shutil.copyfile(vocab_file, directory / VOCAB_NAME)
    tokenizer_config = {
        "tokenizer_class": "ElectraTokenizer",
        "do_lower_case": do_lower_case,
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        "model_max_length": max_length,
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))


def to_transformers_model(net: ElectraForPretraining, spec: ExportedNetwork):
    """Our network -> a transformers model holding the same tensors (copied), in eval mode."""
    hf_class = getattr(require_transformers(), spec.hf_class)
    hf_model = hf_class(electra_config(net.config))
    missing, unexpected = hf_model.load_state_dict(to_transformers_state_dict(net, spec.head), strict=False)
    # position_ids/token_type_ids are non-persistent buffers in transformers 5 and plain buffers in 4.x.
    missing = [k for k in missing if not k.endswith(SKIPPED_SUFFIXES)]
    if missing or unexpected:
        raise HFInteropError(
            f"cannot map {spec.name} onto transformers.{spec.hf_class}: missing {missing}, unexpected {unexpected}"
        )
    hf_model.tie_weights()
    return hf_model.eval()


def export_pretrained(directory: str | Path, out: str | Path, overwrite: bool = False) -> dict[str, Path]:
    """Write the transformers directories of a pre-trained directory under `out`; returns {name: path}.

    Each directory holds config.json, model.safetensors, vocab.txt and tokenizer_config.json. The whole of
    `out` is written under a temporary name and renamed, so it is never half-written.
    """
    directory, out = Path(directory), Path(out)
    info = read_info(directory)  # clear message when config.json is missing
    vocab_file = directory / VOCAB_NAME
    if not vocab_file.is_file():
        raise HFInteropError(f"{directory} has no {VOCAB_NAME}; a pre-trained directory carries its vocabulary")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise HFInteropError(f"{out} exists and is not empty; choose another output directory or pass --overwrite")
    plan = export_plan(info)
    networks = {which: load_pretrained(directory, which)[0] for which in {p.which for p in plan}}
    for which, net in networks.items():
        check_vocab(net.config.vocab_size, vocab_file, f"{directory} ({which})")
    do_lower_case = info.get("do_lower_case")
    if do_lower_case is None:
        do_lower_case = guess_do_lower_case(vocab_file)

    meta = {k: info[k] for k in ("objective", "sharing", "algorithm", "step", "run_id", "model_name") if k in info}
    export_info = {
        "source": str(directory.resolve()),
        **meta,
        "do_lower_case": do_lower_case,
        "networks": {p.name: {"class": p.hf_class, "description": p.description} for p in plan},
    }

    with atomic_dir(out) as tmp:
        for spec in plan:
            net = networks[spec.which]
            to_transformers_model(net, spec).save_pretrained(tmp / spec.name, safe_serialization=True)
            write_tokenizer_files(tmp / spec.name, vocab_file, do_lower_case, net.config.max_position_embeddings)
        (tmp / EXPORT_INFO_NAME).write_text(json.dumps(export_info, indent=2, sort_keys=True))
    return {p.name: out / p.name for p in plan}
