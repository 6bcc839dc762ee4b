"""Import a transformers ELECTRA or BERT checkpoint (a local directory or a Hub id) as our `ElectraForPretraining`.

So fine-tuning can re-measure released models such as `google/electra-small-discriminator`
(google-research/electra README, "Expected Results"). Only fine-tuning's `pretrained=hf:...` path imports
this module, and transformers is imported inside its functions.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import torch

from electra_ablate.common.io import write_text
from electra_ablate.hf.convert import (
    HEAD_PREFIXES,
    SKIPPED_SUFFIXES,
    HFInteropError,
    check_vocab,
    encoder_config,
    from_transformers_state_dict,
    infer_model_name,
    require_transformers,
)
from electra_ablate.models.checkpoint import VOCAB_NAME
from electra_ablate.models.encoder import ElectraForPretraining

SUPPORTED_MODEL_TYPES = ("electra", "bert")

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
            model_type = require_transformers().AutoConfig.from_pretrained(spec).model_type
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
    transformers = require_transformers()
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
        write_text(target, "".join(t + "\n" for t in tokens))
    return target


def _do_lower_case(spec: str, local: Path | None) -> bool | None:
    if local is not None:
        path = local / "tokenizer_config.json"
        return _read_json(path).get("do_lower_case") if path.is_file() else None
    found = require_transformers().utils.cached_file(
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
    require_transformers()  # before anything else: nothing below works without it
    local = Path(spec).expanduser() if _is_local(spec) else None
    if local is not None and not local.is_dir():
        raise HFInteropError(
            f"{spec}: no such directory; expected a transformers checkpoint directory or a Hub id such as "
            "google/electra-small-discriminator"
        )
    model_type, hf_config = _hf_config(spec, local)
    config = encoder_config(hf_config)
    vocab_file = _vocab_file(spec, local, cache_dir)
    check_vocab(config.vocab_size, vocab_file, spec)
    architecture, mapped, missing, dropped = _hf_weights(spec, local, model_type, hf_config)
    heads, notes = _keep_complete_heads(mapped, missing)
    if dropped:
        groups = sorted({".".join(k.split(".")[:2]) for k in dropped})
        notes.append(f"dropped weights that fine-tuning does not use: {', '.join(groups)}")
    net = _network(spec, config, mapped, heads)
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


def _hf_config(spec: str, local: Path | None):
    """(model_type, the transformers config) of a checkpoint our encoder can load; anything else is refused."""
    model_type = _model_type(spec, local)
    config_class = getattr(require_transformers(), {"electra": "ElectraConfig", "bert": "BertConfig"}[model_type])
    try:
        hf_config = config_class.from_pretrained(str(local) if local is not None else spec)
    except OSError as e:
        raise _hub_error(spec, e) from e
    _check_architecture(spec, hf_config)
    return model_type, hf_config


def _hf_weights(spec: str, local: Path | None, model_type: str, hf_config) -> tuple[str, dict, set[str], list[str]]:
    """The checkpoint's weights under our names: (its architecture, mapped state, our names of the weights it
    lacks, its keys that we do not use). Loaded through the transformers class of its heads."""
    architecture = (hf_config.architectures or [BASE_CLASSES[model_type]])[0]
    class_name = architecture if architecture in HEADED_CLASSES[model_type] else BASE_CLASSES[model_type]
    try:
        hf_model, loading = getattr(require_transformers(), class_name).from_pretrained(
            str(local) if local is not None else spec, output_loading_info=True)
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
    return architecture, mapped, missing, dropped


def _keep_complete_heads(mapped: dict, missing: set[str]) -> tuple[list[str], list[str]]:
    """Drop from `mapped` each head the checkpoint lacks weights of, or whose MLM output is not tied to the
    input embeddings as ours is; returns (the heads kept, a note per head dropped)."""
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
    return heads, notes


def _network(spec: str, config, mapped: dict, heads: list[str]) -> ElectraForPretraining:
    """Our network with the kept heads (a fresh discriminator head when none was kept), loaded from `mapped`."""
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
    return net
