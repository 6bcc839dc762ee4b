"""What each arm of a sweep was, read back from its runs: the pre-training it had (steps, tokens, FLOPs), the
encoder shape and vocabulary it was fine-tuned with. The report states the scale of every verdict from this,
and warns when the arms it compares differ in anything but their weights.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from electra_ablate.report import carries
from electra_ablate.tracking import runs as tracking

# Pre-training params that fix the encoder's shape (the pretrain config's `model` group).
SHAPE_KEYS = ("model.embedding_size", "model.hidden_size", "model.num_hidden_layers", "model.num_attention_heads",
              "model.intermediate_size")


def file_sha256(path: Path) -> str | None:
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def run_vocab_sha256(run) -> str | None:
    """A pre-training run's vocabulary digest: its recorded param, else the vocab.txt of its saved network."""
    recorded = run.data.params.get(tracking.PARAM_VOCAB_SHA256)
    if recorded:
        return recorded
    checkpoint = run.data.tags.get(tracking.TAG_CHECKPOINT)
    return file_sha256(Path(checkpoint) / "vocab.txt") if checkpoint else None


def shape_of(run) -> tuple[str, ...] | None:
    params = run.data.params
    if not all(k in params for k in SHAPE_KEYS):
        return None
    return tuple(params[k] for k in SHAPE_KEYS)


def _millions(n: float) -> str:
    return f"{n / 1e6:.1f}M"


def pretraining_numbers(run) -> dict | None:
    """{steps, batch, seq, tokens, flops (None when not logged)} of one finished pre-training run, or None
    when its parameters do not say."""
    p = run.data.params
    try:
        steps = int(p["trainer.max_steps"])
        batch = int(p["data.batch_size"]) * int(p.get("trainer.accumulate_grad_batches", 1))
        seq = int(p["data.max_seq_length"])
    except (KeyError, ValueError):
        return None
    return {"steps": steps, "batch": batch, "seq": seq, "tokens": steps * batch * seq,
            "flops": run.data.metrics.get("flops/total")}


def pretraining_scale(run) -> str:
    """'600 steps x 128 x 64 = 4.9M tokens, 1.2e+14 FLOPs' for one finished pre-training run."""
    n = pretraining_numbers(run)
    if n is None:
        return "scale not recorded"
    return f"{n['steps']} steps x {n['batch']} x {n['seq']} = {_millions(n['tokens'])} tokens" + (
        f", {n['flops']:.2g} FLOPs" if n["flops"] else "")


def numbers(spec, pretrain_states) -> dict[str, dict | None]:
    """Variant label -> pretraining_numbers of its first finished run; None for an arm without pre-training."""
    out: dict[str, dict | None] = {}
    for s in pretrain_states:
        if s.run is not None and s.job.variant not in out:
            out[s.job.variant] = pretraining_numbers(s.run)
    for v in spec.variants:
        if v.random_init_of is not None or v.pretrained == "none":
            out[v.label] = None
    return out


def describe(spec, pretrain_states) -> dict[str, str]:
    """Variant label -> one phrase for its pre-training (the first finished run; runs of a variant share it)."""
    first = {}
    for s in pretrain_states:
        if s.run is not None:
            first.setdefault(s.job.variant, s.run)
    out = {}
    for v in spec.variants:
        if v.label in first:
            out[v.label] = f"{pretraining_scale(first[v.label])} per pre-training run"
        elif v.random_init_of is not None:
            out[v.label] = f"no pre-training (random weights shaped like {v.random_init_of})"
        elif v.pretrained == "none":
            out[v.label] = "no pre-training"
        elif v.pretrained is not None:
            out[v.label] = f"imported `{v.pretrained}`"
    return out


def shape_warning(spec, pretrain_states) -> str | None:
    """A warning when pre-trained arms (and the random arms shaped like them) differ in encoder shape."""
    shapes: dict[str, set] = {}
    for s in pretrain_states:
        if s.run is not None and (shape := shape_of(s.run)) is not None:
            shapes.setdefault(s.job.variant, set()).add(shape)
    for v in spec.variants:
        if v.random_init_of in shapes:
            shapes[v.label] = shapes[v.random_init_of]
    if len({x for xs in shapes.values() for x in xs}) <= 1:
        return None
    listing = "; ".join(f"{label} " + ", ".join("x".join(x) for x in sorted(xs)) for label, xs in shapes.items())
    return (f"**Warning: the arms compared here differ in encoder shape** ({'/'.join(SHAPE_KEYS)}: {listing}): a "
            "difference between them mixes the objective with the architecture.")


def scale_sentences(results, scale: Mapping[str, str]) -> list[str]:
    """One plain sentence per verdict: the claim, what we found, and the scale it was found at."""
    out = []
    for v in results:
        c = v.claim
        arms = list(dict.fromkeys(c.better + c.worse))
        where = "; ".join(f"{a}: {scale[a]}" for a in arms if a in scale)
        note = v.note
        if v.verdict == "degenerate":
            out.append(f"- {c.text}: **degenerate**, no comparison ({note}{'' if not where else '; ' + where}).")
            continue
        if v.difference is None:
            out.append(f"- {c.text}: not run.")
            continue
        d = v.difference
        rests = carries.phrase(v.verdict, getattr(v, "without", {}))
        out.append(f"- {c.text}: **{v.verdict}** ({d.estimate:+.1f} points, 95% interval [{d.low:+.1f}, {d.high:+.1f}]"
                   f"{'' if not where else '; ' + where}){'' if not note else f'; {note}'}"
                   f"{'' if not rests else f'; it {rests}'}.")
    return out


def end_of_pretraining(run) -> dict[str, float | None]:
    """What one finished pre-training run reached in its last logged window (train metrics averaged over the
    window's batches): the encoder's masked-LM accuracy where the encoder is a masked LM (BERT, Replace MLM,
    All-Tokens MLM: at the masked positions), the generator's where there is one, each also apart at the
    positions whose input was [MASK] and those that kept the original (where copying the input is right); the
    generator's sampled accuracy; the discriminator's ROC AUC, precision, recall and replaced share where there
    is a discriminator. None where the objective has no such number (or the run predates it)."""
    m = run.data.metrics
    detector = "train/disc_auc" in m  # ELECTRA's objectives: masked_lm_accuracy is then the generator's
    own = {part: m.get(f"train/masked_lm_accuracy{part}") for part in ("", "_at_mask", "_at_kept")}
    gen = {part: m.get(f"train/gen_masked_lm_accuracy{part}", own[part] if detector else None) for part in own}
    out = {f"encoder_mlm_accuracy{part}": None if detector else own[part] for part in own}
    out |= {f"generator_mlm_accuracy{part}": gen[part] for part in gen}
    return out | {"sampled_mlm_accuracy": m.get("train/sampled_masked_lm_accuracy"),
                  "disc_auc": m.get("train/disc_auc"), "disc_precision": m.get("train/disc_precision"),
                  "disc_recall": m.get("train/disc_recall"), "replaced_fraction": m.get("train/replaced_fraction")}


COLLAPSE_DOC = "docs/notebook/2026-11-27-electra-collapse.md"
COLLAPSE_SECTION = "Why ELECTRA checkpoints fine-tune to one class"
# Below this discriminator AUC at the end of pre-training, the replaced-token signal has barely formed: at CPU
# scale ELECTRA's discriminator stays near 0.5 for its first millions of tokens (docs/notebook/2026-11-27-electra-collapse.md).
FORMED_AUC = 0.6


def why_degenerate(spec, pretrain_states, label: str) -> str:
    """What the arm's own pre-training curves say about a fine-tuning that learned nothing, and where to read on."""
    variant = spec.variant(label)
    if variant.random_init_of is not None or variant.pretrained == "none":
        cause = "it was not pre-trained, so the fine-tuning recipe itself learned nothing"
    else:
        ends = [end_of_pretraining(s.run) for s in pretrain_states if s.run is not None and s.job.variant == label]
        aucs = sorted(e["disc_auc"] for e in ends if e["disc_auc"] is not None)
        accs = sorted(e["encoder_mlm_accuracy"] for e in ends if e["encoder_mlm_accuracy"] is not None)
        if aucs:
            auc = aucs[len(aucs) // 2]
            cause = (f"its discriminator ended pre-training at ROC AUC {auc:.2f} (chance is 0.50)"
                     + (": its replaced-token signal had barely formed" if auc < FORMED_AUC else
                        ": the signal had formed, so the fine-tuning failed to read it"))
        elif accs:
            cause = f"its masked-LM accuracy ended pre-training at {100 * accs[len(accs) // 2]:.1f}%"
        else:
            cause = "its pre-training logged no end metrics"
    return f"{cause}; see {COLLAPSE_DOC}, \"{COLLAPSE_SECTION}\""
