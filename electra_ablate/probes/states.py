"""The geometry of encoders' hidden states on GLUE sentences, to see what fine-tuning starts from: for each encoder
(a pre-training checkpoint, or random initialisation of one's shape and vocabulary, drawn as fine-tuning draws it),
the dev sentences of a task run through it in eval mode, and per layer (the embeddings, each block, the output the
classifier reads):

- the variance of each hidden dimension over the tokens (its mean over dimensions, and the largest one's share);
- the share of the states' mean square that one common vector holds (1: every token is the same vector);
- the mean cosine between two tokens of one example, and between the [CLS] (and the mean-pooled) states of two
  examples;
- the effective rank (Roy & Vetterli 2007, "The effective rank: a measure of effective dimensionality": exp of
  the entropy of the normalised singular values) of the examples' [CLS] and mean-pooled states, as they are and
  centred (less their mean over the examples: what a classifier with a bias can use).

A collapsed encoder (one vector for every token) has rank ~1 and cosines ~1; an isotropic one cosines ~0 and a
rank near its width. Encoders are loaded as fine-tuning loads them (finetuning/source.py, from the
fine-tuning config: `--override reinit_top_layers=1` measures what such a run starts from), and nothing is written
to the run store.

`python -m electra_ablate.probes.states NAME=<pretrained dir | run id | hf:...> ... [--random-init-of NAME]`
"""

from __future__ import annotations

import argparse
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from electra_ablate.bench.settings import CONF_DIR, BenchError, log
from electra_ablate.common import cli
from electra_ablate.common.io import write_text
from electra_ablate.data.tokenizer import load_tokenizer
from electra_ablate.finetuning.run import lowercase
from electra_ablate.finetuning.source import (RUN_ID, Pretrained, normalise_spec, reinit_top_layers,
                                              resolve_pretrained)
from electra_ablate.glue import tasks as glue
from electra_ablate.glue.features import cached_features, file_digest
from electra_ablate.glue.readers import load_split
from electra_ablate.models.encoder import ElectraModel
from electra_ablate.tracking import runs as tracking
from electra_ablate.tracking import store

RANDOM = "random init"


class StateStats(NamedTuple):
    """One layer's states over N examples (token statistics over every non-padding token)."""

    dim_variance: float  # mean over dimensions of each dimension's variance over the tokens
    top_dim_share: float  # the largest dimension's share of the summed variance
    common_share: float  # ||mean state||^2 / mean ||state||^2: 1 when every token is one vector
    token_cosine: float  # mean cosine between two tokens of one example
    cls_cosine: float  # mean cosine between the [CLS] states of two examples
    mean_cosine: float  # ... and between their mean-pooled states
    cls_rank: float  # effective rank of the (N, H) [CLS] states
    cls_rank_centred: float  # ... of the same states less their mean over the examples
    mean_rank: float  # effective rank of the (N, H) mean-pooled states
    mean_rank_centred: float  # ... of the same states less their mean over the examples


COLUMNS = ("encoder", "layer", *StateStats._fields)
HEADERS = ("encoder", "layer", "dim. variance", "top dim. share", "common share", "token cos", "[CLS] cos",
           "mean-pool cos", "[CLS] erank", "[CLS] erank centred", "mean-pool erank", "mean-pool erank centred")


def effective_rank(matrix: torch.Tensor) -> float:
    """exp(H(p)) with p the singular values of `matrix` over their sum (Roy & Vetterli 2007): 1 for a matrix of
    rank 1, min(shape) for one whose singular values are all equal."""
    s = torch.linalg.svdvals(matrix.double())
    if float(s.sum()) == 0.0:
        return 0.0
    p = s / s.sum()
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def mean_pair_cosine(vectors: torch.Tensor) -> float:
    """The mean cosine over the ordered pairs of distinct rows of (n, H) `vectors` (n >= 2)."""
    n = vectors.shape[0]
    u = torch.nn.functional.normalize(vectors.double(), dim=-1)
    total = float(u.sum(0).pow(2).sum())  # sum over all pairs i, j of u_i . u_j, the n diagonal terms included
    return (total - n) / (n * (n - 1))


def state_stats(hidden: torch.Tensor, mask: torch.Tensor) -> StateStats:
    """The statistics of (N, T, H) `hidden` states whose (N, T) `mask` marks the tokens (1) and padding (0);
    position 0 is [CLS]."""
    hidden, mask = hidden.double(), mask.bool()
    tokens = hidden[mask]  # (n_tokens, H)
    var = tokens.var(0, unbiased=False)  # (H,)
    common = float(tokens.mean(0).pow(2).sum() / tokens.pow(2).sum(-1).mean())
    within = [mean_pair_cosine(h[m]) for h, m in zip(hidden, mask) if int(m.sum()) >= 2]
    cls = hidden[:, 0]  # (N, H)
    weights = mask.double().unsqueeze(-1)  # (N, T, 1)
    pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)  # (N, H): fine-tuning's pooling=mean
    return StateStats(
        dim_variance=float(var.mean()), top_dim_share=float(var.max() / var.sum().clamp(min=1e-30)),
        common_share=common, token_cosine=float(np.mean(within)) if within else math.nan,
        cls_cosine=mean_pair_cosine(cls), mean_cosine=mean_pair_cosine(pooled),
        cls_rank=effective_rank(cls), cls_rank_centred=effective_rank(cls - cls.mean(0)),
        mean_rank=effective_rank(pooled), mean_rank_centred=effective_rank(pooled - pooled.mean(0)),
    )


@torch.no_grad()
def layer_states(encoder: ElectraModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 token_type_ids: torch.Tensor, batch_size: int = 128) -> dict[str, torch.Tensor]:
    """{layer name: (N, T, H) states} in eval mode: the embeddings (after their projection), each block's output
    but the last, and the encoder's output (the last block's, after a pre-LN encoder's final LayerNorm): what the
    classifier reads."""
    encoder.eval()
    blocks = encoder.encoder.layer
    names = ["embeddings", *(f"block {i + 1}" for i in range(len(blocks) - 1)), "output"]
    seen: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    entry = encoder.embeddings_project if hasattr(encoder, "embeddings_project") else encoder.embeddings
    hooks = [entry.register_forward_hook(lambda m, i, o: seen["embeddings"].append(o.float()))]
    for i, block in enumerate(blocks[:-1]):
        hooks.append(block.register_forward_hook(lambda m, i_, o, name=f"block {i + 1}": seen[name].append(o.float())))
    try:
        for start in range(0, len(input_ids), batch_size):
            part = slice(start, start + batch_size)
            seen["output"].append(encoder(input_ids[part], attention_mask[part], token_type_ids[part]).float())
    finally:
        for hook in hooks:
            hook.remove()
    return {name: torch.cat(seen[name]) for name in names}


class Sentences(NamedTuple):
    input_ids: torch.Tensor  # (N, T), padded with [PAD]
    attention_mask: torch.Tensor  # (N, T)
    token_type_ids: torch.Tensor  # (N, T)


def sentences(cfg: DictConfig, pretrained: Pretrained, n: int) -> Sentences:
    """The first `n` examples of the task's first dev split, tokenized as fine-tuning tokenizes them."""
    task = glue.get_task(cfg.task.name)
    d = cfg.glue_data
    examples = load_split(task, task.dev_splits[0].name, d.source, d.dir, d.hf_path)[:n]
    tokenizer = load_tokenizer(pretrained.vocab_file, lowercase(cfg, pretrained))
    f = cached_features(examples, tokenizer, file_digest(pretrained.vocab_file), lowercase(cfg, pretrained),
                        int(d.max_seq_length), task.is_regression, cfg.paths.cache_dir)
    width = int(f.lengths.max())
    pad = tokenizer.token_to_id("[PAD]") or 0
    ids = torch.full((len(f), width), pad, dtype=torch.long)
    types = torch.zeros((len(f), width), dtype=torch.long)
    mask = torch.zeros((len(f), width), dtype=torch.long)
    for i, (a, b) in enumerate(zip(f.offsets[:-1], f.offsets[1:])):
        ids[i, : b - a] = torch.from_numpy(f.input_ids[a:b].astype(np.int64))
        types[i, : b - a] = torch.from_numpy(f.token_type_ids[a:b].astype(np.int64))
        mask[i, : b - a] = 1
    return Sentences(ids, mask, types)


def finetune_config(overrides: Sequence[str]) -> DictConfig:
    """conf/finetune.yaml with `overrides`, as `python -m electra_ablate.finetune` composes it."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("finetune", overrides=[f"paths.output_dir={tempfile.gettempdir()}/electra_ablate_states",
                                              *overrides])


def parse_arms(arms: Sequence[str], random_init_of: str | None) -> list[tuple[str, str, bool]]:
    """(name, pretrained spec, random_init) for every encoder; refused in one line when malformed."""
    parsed = []
    for arm in arms:
        name, sep, spec = arm.partition("=")
        if not sep or not name or not spec:
            raise BenchError(f"encoder {arm!r}: give NAME=<pretrained dir | run id | hf:...>, e.g. electra=<run id>")
        parsed.append((name, spec, False))
    names = [name for name, _, _ in parsed]
    if len(set(names)) != len(names):
        raise BenchError(f"encoder names {names} repeat one; give each encoder its own NAME")
    if random_init_of is not None:
        if random_init_of not in names:
            raise BenchError(f"--random-init-of {random_init_of}: no encoder of that name; choose one of {names}")
        parsed.append((RANDOM, dict((n, s) for n, s, _ in parsed)[random_init_of], True))
    if not parsed:
        raise BenchError("no encoder given: name at least one, NAME=<pretrained dir | run id | hf:...>")
    return parsed


def measure(arms: Sequence[tuple[str, str, bool]], overrides: Sequence[str], examples: int) -> list[dict]:
    """One row per (encoder, layer): the encoder's name, the layer's and its StateStats."""
    rows = []
    for name, spec, random_init in arms:
        cfg = finetune_config([f"pretrained={spec}", f"random_init={str(random_init).lower()}", *overrides])
        # The store is read only for a run id: a directory or hub id needs no MLflow database.
        client = (store.open_client(tracking.resolve_tracking_uri(cfg.logger.tracking_uri))
                  if RUN_ID.match(normalise_spec(cfg.pretrained)) else None)
        torch.manual_seed(int(cfg.seed))
        pretrained = resolve_pretrained(cfg, client)
        batch = sentences(cfg, pretrained, examples)
        log(f"states: {name} ({spec}{', random init' if random_init else ''}) on {len(batch.input_ids)} "
            f"{cfg.task.name} dev examples")
        encoder = reinit_top_layers(pretrained.make_encoder(), int(cfg.reinit_top_layers), int(cfg.seed))
        for layer, hidden in layer_states(encoder, *batch).items():
            rows.append({"encoder": name, "layer": layer, **state_stats(hidden, batch.attention_mask)._asdict()})
    return rows


def markdown(rows: Sequence[dict]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for row in rows:
        cells = [row["encoder"], row["layer"]] + [f"{row[k]:.3g}" if k == "dim_variance" else f"{row[k]:.2f}"
                                                  for k in StateStats._fields]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m electra_ablate.probes.states", description=__doc__.split("\n\n")[0],
        epilog="example:\n  python -m electra_ablate.probes.states electra=<run id> bert=<run id> "
        "--random-init-of electra \\\n    --examples 512 --override glue_data.max_seq_length=64",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("encoders", nargs="+", help="NAME=<pretrained dir | MLflow pre-training run id | hf:...>")
    p.add_argument("--random-init-of", default=None,
                   help="add random initialisation of this encoder's shape and vocabulary (fine-tuning's draw)")
    p.add_argument("--examples", type=int, default=512, help="the first N dev examples (default 512)")
    p.add_argument("--override", action="append", default=[],
                   help="a fine-tuning config override (conf/finetune.yaml), e.g. glue_data.max_seq_length=64, "
                        "task=sst2 (the default), seed=1 (random init's draw); repeatable")
    p.add_argument("--out", type=Path, default=None, help="also write the table to this markdown file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    a = parse_args(argv)
    if a.examples < 2:
        raise BenchError(f"--examples {a.examples}: the cosines between examples need at least 2")
    overrides = ["task=sst2", *a.override]
    message = cli.unknown_key_message("finetune", overrides)
    if message:
        raise BenchError(message)
    rows = measure(parse_arms(a.encoders, a.random_init_of), overrides, a.examples)
    table = markdown(rows)
    print(table, end="")
    if a.out is not None:
        write_text(a.out, table)
    return rows


@cli.one_line_errors
def cli_main() -> None:
    """Console entry: a refused option ends in one line (common/cli.py)."""
    main()


if __name__ == "__main__":
    cli_main()
