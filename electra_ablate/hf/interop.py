"""Interoperability with Hugging Face transformers: export our pre-trained networks, import theirs.

Export turns a pre-trained directory (`electra_ablate.checkpoint`) into transformers checkpoints
(`ElectraForPreTraining` for a discriminator head, `ElectraForMaskedLM` for an MLM head, one directory per
network) with the tokenizer files `AutoTokenizer` needs. Import turns a transformers ELECTRA or BERT
checkpoint (a local directory or a Hub id) into our `ElectraForPretraining`, so fine-tuning can re-measure
released models such as `google/electra-small-discriminator` (google-research/electra README, "Expected
Results"). Our module names copy `modeling_electra.py`, so ELECTRA keys map one to one; BERT's differ only
by prefix (`bert.` -> `electra.`, `cls.predictions.transform` -> `generator_predictions`). Both libraries use
exact (erf) GELU for `hidden_act="gelu"`, which is the only activation our encoder implements.

transformers is an optional extra (`pip install 'electra-ablate[hf]'`): it is imported inside the
functions that need it, so the rest of the package imports without it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import fields
from pathlib import Path
from typing import NamedTuple

import torch

from electra_ablate.models.checkpoint import VOCAB_NAME, load_pretrained, read_info
from electra_ablate.models.encoder import ElectraForPretraining, EncoderConfig

CONF_MODEL_DIR = Path(__file__).resolve().parents[2] / "conf" / "model"
EXPORT_INFO_NAME = "export_info.json"
SUPPORTED_MODEL_TYPES = ("electra", "bert")
# The config fields that make a model size (conf/model/*.yaml); used to name an imported model.
SIZE_FIELDS = ("embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


class HFInteropError(ValueError):
    """A checkpoint that cannot be exported to or imported from transformers, with what to do about it."""


def _transformers():
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
    """Our encoder sizes -> `transformers.ElectraConfig` (same field names; GELU is exact erf in both)."""
    return _transformers().ElectraConfig(**config.to_dict(), hidden_act="gelu")


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


# ---------------------------------------------------------------------------------------------- export


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
    hf_class = getattr(_transformers(), spec.hf_class)
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

    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for spec in plan:
            net = networks[spec.which]
            to_transformers_model(net, spec).save_pretrained(tmp / spec.name, safe_serialization=True)
            write_tokenizer_files(tmp / spec.name, vocab_file, do_lower_case, net.config.max_position_embeddings)
        (tmp / EXPORT_INFO_NAME).write_text(json.dumps(export_info, indent=2, sort_keys=True))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.is_dir():
        shutil.rmtree(out)
    elif out.exists():
        out.unlink()
    tmp.rename(out)
    return {p.name: out / p.name for p in plan}


# ---------------------------------------------------------------------------------------------- import

# The transformers class that reads each head a checkpoint may have; anything else loads as the bare encoder.
HEADED_CLASSES = {
    "electra": ("ElectraForPreTraining", "ElectraForMaskedLM"),
    "bert": ("BertForPreTraining", "BertForMaskedLM"),
}
BASE_CLASSES = {"electra": "ElectraModel", "bert": "BertModel"}


def _is_local(spec: str) -> bool:
    return Path(spec).expanduser().exists() or spec.startswith(("/", "./", "../", "~")) or spec.count("/") > 1


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise HFInteropError(f"{path} is not valid JSON ({e})") from e


def _hub_error(spec: str, error: Exception) -> HFInteropError:
    return HFInteropError(
        f"could not load {spec!r} from the Hugging Face Hub ({type(error).__name__}: {error}). Offline "
        "(no network, or HF_HUB_OFFLINE=1) only models already in the Hub cache load: download it on a "
        f"connected machine (`hf download {spec}`, then set HF_HUB_OFFLINE=1) or pass a local directory "
        "(pretrained=hf:/path/to/dir holding config.json, the weights and vocab.txt)."
    )


def _model_type(spec: str, local: Path | None) -> str:
    if local is not None:
        config_path = local / "config.json"
        if not config_path.is_file():
            raise HFInteropError(
                f"{local} has no config.json: expected a transformers ELECTRA or BERT checkpoint directory "
                "(config.json, model.safetensors or pytorch_model.bin, vocab.txt), e.g. written by "
                "save_pretrained or `python -m electra_ablate.export`"
            )
        raw = _read_json(config_path)
        if raw.get("format") == "electra-ablate/1":
            raise HFInteropError(
                f"{local} is an electra-ablate pre-trained directory, not a transformers checkpoint: "
                f"pass it without the hf: prefix (pretrained={local})"
            )
        model_type = raw.get("model_type")
    else:
        try:
            model_type = _transformers().AutoConfig.from_pretrained(spec).model_type
        except OSError as e:
            raise _hub_error(spec, e) from e
        except ValueError as e:  # a model_type transformers does not know
            raise HFInteropError(f"{spec}: expected an ELECTRA or BERT checkpoint, found: {e}") from e
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise HFInteropError(
            f"{spec}: expected an ELECTRA or BERT checkpoint (model_type 'electra' or 'bert'), "
            f"found model_type={model_type!r}"
        )
    return model_type


def _check_architecture(spec: str, config) -> None:
    """Refuse what our encoder does not implement, rather than load it and compute something else."""
    problems = []
    if config.hidden_act != "gelu":
        problems.append(f"hidden_act={config.hidden_act!r} (ours: exact 'gelu')")
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        problems.append(f"position_embedding_type={config.position_embedding_type!r} (ours: 'absolute')")
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        problems.append("a decoder / cross-attention configuration (ours: a bidirectional encoder)")
    if problems:
        raise HFInteropError(
            f"{spec}: this {config.model_type} checkpoint differs from our encoder: {'; '.join(problems)}"
        )


def _cache_root(cache_dir: str | Path | None) -> Path:
    return Path(cache_dir) if cache_dir is not None else Path(tempfile.gettempdir()) / "electra_ablate_hf"


def _vocab_file(spec: str, local: Path | None, cache_dir: str | Path | None) -> Path:
    """The checkpoint's vocab.txt; else its tokenizer's vocabulary written, in id order, to a cache file."""
    if local is not None and (local / VOCAB_NAME).is_file():
        return local / VOCAB_NAME
    transformers = _transformers()
    if local is None:
        try:
            path = transformers.utils.cached_file(spec, VOCAB_NAME, _raise_exceptions_for_missing_entries=False)
        except OSError as e:
            raise _hub_error(spec, e) from e
        if path is not None:
            return Path(path)
    try:
        vocab = transformers.AutoTokenizer.from_pretrained(str(local or spec)).get_vocab()
    except (OSError, ValueError) as e:
        raise HFInteropError(
            f"{spec}: no {VOCAB_NAME} and no tokenizer that transformers can load ({e}); "
            f"add the WordPiece {VOCAB_NAME} the model was trained with"
        ) from e
    tokens = sorted(vocab, key=vocab.get)
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise HFInteropError(f"{spec}: the tokenizer's ids are not 0..{len(tokens) - 1}; cannot write a {VOCAB_NAME}")
    digest = hashlib.sha256("\n".join(tokens).encode()).hexdigest()[:16]
    target = _cache_root(cache_dir) / f"vocab-{digest}.txt"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        tmp.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
        tmp.rename(target)
    return target


def _do_lower_case(spec: str, local: Path | None) -> bool | None:
    if local is not None:
        path = local / "tokenizer_config.json"
        return _read_json(path).get("do_lower_case") if path.is_file() else None
    found = _transformers().utils.cached_file(
        spec, "tokenizer_config.json", _raise_exceptions_for_missing_entries=False
    )
    return _read_json(Path(found)).get("do_lower_case") if found else None


def import_pretrained(
    spec: str, cache_dir: str | Path | None = None
) -> tuple[ElectraForPretraining, dict, Path]:
    """A transformers ELECTRA/BERT checkpoint (local directory or Hub id) -> (network, info, vocab file).

    The encoder (`network.electra`) is always loaded. Heads are loaded where the checkpoint has them: an
    ELECTRA discriminator head, an ELECTRA generator head or BERT's MLM head (= ours with E = H). Task heads
    (classifiers), BERT's pooler and next-sentence head are dropped: fine-tuning builds its own head on the
    encoder. A checkpoint with no pre-training head gets a freshly initialised discriminator head (our
    network needs one; fine-tuning never reads it); `info["heads"]` lists the heads that were loaded.
    `info["model"]` has the shape of a pre-trained directory's `config.json["model"]`.
    """
    transformers = _transformers()
    local = Path(spec).expanduser() if _is_local(spec) else None
    if local is not None and not local.is_dir():
        raise HFInteropError(
            f"{spec}: no such directory; expected a transformers checkpoint directory or a Hub id such as "
            "google/electra-small-discriminator"
        )
    source = str(local) if local is not None else spec
    model_type = _model_type(spec, local)
    config_class = getattr(transformers, {"electra": "ElectraConfig", "bert": "BertConfig"}[model_type])
    try:
        hf_config = config_class.from_pretrained(source)
    except OSError as e:
        raise _hub_error(spec, e) from e
    _check_architecture(spec, hf_config)
    config = encoder_config(hf_config)
    vocab_file = _vocab_file(spec, local, cache_dir)
    check_vocab(config.vocab_size, vocab_file, spec)

    architecture = (hf_config.architectures or [BASE_CLASSES[model_type]])[0]
    class_name = architecture if architecture in HEADED_CLASSES[model_type] else BASE_CLASSES[model_type]
    try:
        hf_model, loading = getattr(transformers, class_name).from_pretrained(source, output_loading_info=True)
    except OSError as e:
        if local is None:
            raise _hub_error(spec, e) from e
        raise HFInteropError(f"{spec}: cannot load the weights ({e})") from e
    # A bare ElectraModel/BertModel names its keys without the `electra.`/`bert.` prefix the map expects.
    prefix = f"{hf_model.base_model_prefix}." if class_name == BASE_CLASSES[model_type] else ""
    state = {prefix + k: v for k, v in hf_model.state_dict().items()}
    mapped, dropped = from_transformers_state_dict(state, model_type)
    dropped += [k for k in loading["unexpected_keys"] if not k.endswith(SKIPPED_SUFFIXES)]  # e.g. classifier.*
    # Weights the checkpoint lacks were randomly initialised by from_pretrained: an encoder weight among them
    # is an error, a head weight drops that head.
    missing = set(from_transformers_state_dict({prefix + k: None for k in loading["missing_keys"]}, model_type)[0])
    encoder_missing = sorted(k for k in missing if k.startswith("electra."))
    if encoder_missing:
        raise HFInteropError(
            f"{spec}: the checkpoint lacks {len(encoder_missing)} encoder weights, e.g. {encoder_missing[:3]}"
        )
    word_embeddings = mapped["electra.embeddings.word_embeddings.weight"]
    notes, heads = [], []
    for head, prefixes in HEAD_PREFIXES.items():
        keys = [k for k in mapped if k.startswith(prefixes)]
        if not keys:
            continue
        if any(k in missing for k in keys):
            reason = "incomplete in the checkpoint"
        elif head == "mlm" and not torch.equal(mapped.get("generator_lm_head.weight", word_embeddings),
                                               word_embeddings):
            reason = "its output embeddings are not tied to the input embeddings, as ours are"
        else:
            heads.append(head)
            continue
        notes.append(f"dropped the {head} head: {reason}")
        for k in keys:
            del mapped[k]
    mapped.pop("generator_lm_head.weight", None)  # tied to the word embeddings by tie_weights()
    if dropped:
        groups = sorted({".".join(k.split(".")[:2]) for k in dropped})
        notes.append(f"dropped weights that fine-tuning does not use: {', '.join(groups)}")

    net = ElectraForPretraining(config, mlm_head="mlm" in heads, disc_head="disc" in heads or not heads)
    missing_ours, unexpected = net.load_state_dict(mapped, strict=False)
    # A fresh discriminator head (no head loaded) and the tied output weight are expected to be missing.
    missing_ours = [
        k for k in missing_ours
        if k != "generator_lm_head.weight" and not (not heads and k.startswith("discriminator_predictions."))
    ]
    if missing_ours or unexpected:
        raise HFInteropError(
            f"{spec}: weights do not fit our encoder (missing {missing_ours}, unexpected {unexpected})"
        )
    net.tie_weights()
    info = {
        "format": "transformers",
        "source": spec,
        "model_type": model_type,
        "architecture": architecture,
        "model_name": infer_model_name(config),
        "model": {"config": config.to_dict(), "mlm_head": net.has_mlm_head, "disc_head": net.has_disc_head},
        "heads": heads,
        "do_lower_case": _do_lower_case(spec, local),
        "notes": notes,
    }
    return net, info, vocab_file
