"""An independent ELECTRA trained beside ours on the same batches, masks and steps, so a training curve that stalls
can be told apart: the regime (both stall) or a defect of this implementation (only ours does).

`python -m electra_ablate.probes.curve <pre-training overrides> [--steps N] [--log-every K] [--out CSV]` composes
conf/pretrain.yaml from the overrides as `python -m electra_ablate.pretrain` does, seeds and builds the data and
our networks in the same order (so ours starts from the weights that pre-training run starts from and sees its
batches in its order), and builds the reference of the speed benchmark (bench/builds.py): transformers'
`ElectraForMaskedLM` + `ElectraForPreTraining` with tied embeddings and Gumbel-max sampling, with the same Adam
update, parameter groups, clipping and schedule (optim/schedule.py: linear warm-up over optim.warmup_steps,
linear decay to zero at trainer.max_steps). The reference starts from a key-by-key copy of our initial weights,
so the two curves differ only by the implementations and by their random draws (dropout, samples).

Each step takes the next batch (trainer.accumulate_grad_batches micro-batches), masks it once with our
objective's masking, shared by both, and lets each generator sample its own replacements; then each takes its
optimizer step. Row 0 is both networks as built, on the first batch with dropout off and in fp32: with the same
weights and mask the two generators' logits, MLM loss and accuracy agree to rounding, a check of the wiring that is
printed. Every K steps a row per implementation averages the steps since the previous row, as pre-training logs its
train/* metrics: MLM loss and accuracy at the masked positions, the discriminator's loss and accuracy over the
non-pad tokens, the share of them replaced, its ROC AUC over all those tokens (`disc_auc`: exact, scikit-learn;
`disc_auc_binned`: the 200-bin histogram train/disc_auc logs), tokens/s of the training step alone (the shared
masking and the reference's metrics are not timed) and the learning rate. The rows go to a CSV, rewritten
atomically at each row, and a markdown table of the curves is printed at the end.

Only configs the reference can express run (`builds.reference_problems`: post-LayerNorm blocks with biases,
objective=electra, a neural generator, shared embeddings, fixed weights, joint training); others are refused
before any data is built.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytorch_lightning as pl
import torch
from omegaconf import DictConfig
from sklearn.metrics import roc_auc_score

from electra_ablate.bench.builds import (Data, FastPath, OursRunner, RefOutput, TransformersRunner, compose_pretrain,
                                         reference_problems, tokens)
from electra_ablate.bench.measure import sync
from electra_ablate.bench.settings import BenchError, log, resolve_device
from electra_ablate.common import cli
from electra_ablate.common import precision as precision_lib
from electra_ablate.common.io import write_text
from electra_ablate.objectives import positions as slots
from electra_ablate.objectives.base import Batch, Masked, ObjectiveOutput, ratio
from electra_ablate.training import build
from electra_ablate.training.auc import BinnedAUC

IMPLEMENTATIONS = ("ours", "transformers")
# Averaged as (sum, count) pairs over a row's steps, named as pre-training logs them (train/<name>).
PAIRS = ("mlm_loss", "masked_lm_accuracy", "disc_loss", "disc_accuracy", "replaced_fraction")
COLUMNS = ("step", "tokens", "implementation", *PAIRS, "disc_auc", "disc_auc_binned", "tokens_per_s", "lr")
# Row 0, same weights and mask, dropout off, fp32: a larger gap between the generators' logits (relative to the
# largest) means the reference does not compute what ours does; rounding is about 1e-6, independent weights ~1.
WIRING_TOLERANCE = 1e-4


# ------------------------------------------------------------------------------------------- metrics


@dataclass
class Window:
    """One implementation's metrics over the steps since its last row: (sum, count) pairs on the device, the
    discriminator's scored tokens, and the seconds and tokens of its training steps."""

    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    scores: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0

    def add(self, sums: dict[str, torch.Tensor], probs, labels, weights) -> None:
        """(2,) [sum, count] pairs of PAIRS; (N,) replaced probabilities, 0/1 labels and bool weights."""
        for k in PAIRS:
            self.sums[k] = self.sums[k] + sums[k] if k in self.sums else sums[k]
        self.scores.append((probs.detach().float().reshape(-1), labels.reshape(-1).bool(), weights.reshape(-1).bool()))

    def close(self) -> dict[str, float]:
        """The row's values; the window starts again empty."""
        out = {k: float(v[0] / v[1].clamp(min=1)) for k, v in self.sums.items()}
        probs, labels, weights = (torch.cat(x).cpu() for x in zip(*self.scores))
        kept = labels[weights].numpy()
        one_class = kept.all() or not kept.any()  # no ROC curve: every token replaced, or none
        out["disc_auc"] = math.nan if one_class else float(roc_auc_score(kept, probs[weights].numpy()))
        binned = BinnedAUC()
        binned.update(probs, labels, weights)
        out["disc_auc_binned"] = float(binned.compute())
        out["tokens_per_s"] = self.tokens / self.seconds if self.seconds else math.nan
        self.sums, self.scores, self.tokens, self.seconds = {}, [], 0, 0.0
        return out


def add_ours(window: Window, out: ObjectiveOutput) -> None:
    """Our objective's own (sum, count) pairs and scored tokens, as PretrainSystem accumulates them."""
    window.add(out.sums, out.disc_probs, out.disc_labels, out.disc_weights)


def add_reference(window: Window, out: RefOutput, batch: dict[str, torch.Tensor], m: Masked) -> None:
    """The same metrics computed from the reference's outputs alone."""
    real = batch["attention_mask"].bool()  # (B, T): the discriminator's loss covers the non-pad tokens
    correct = (out.gen_logits.argmax(-1) == batch["input_ids"]) & m.selected  # (B, T)
    agree = ((out.disc_logits > 0) == out.replaced) & real
    sums = {"mlm_loss": ratio(out.mlm_loss, 1), "masked_lm_accuracy": ratio(correct.sum(), m.selected.sum()),
            "disc_loss": ratio(out.disc_loss, 1), "disc_accuracy": ratio(agree.sum(), real.sum()),
            "replaced_fraction": ratio((out.replaced & real).sum(), real.sum())}
    window.add(sums, torch.sigmoid(out.disc_logits.float()), out.replaced, real)


# ------------------------------------------------------------------------------------------- the two runs


class SideBySide:
    """Ours and the reference from the same initial weights, each step on the same batch and masks."""

    def __init__(self, cfg: DictConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        pl.seed_everything(cfg.seed, workers=True)  # as pre-training starts: same data order, same initial weights
        torch.set_float32_matmul_precision(cfg.runtime.matmul_precision)
        dm = build.data_module(cfg)
        dm.prepare()
        data = Data(dm, dm.special, [])
        fp = FastPath.from_runtime(cfg, device)
        self.ours = OursRunner(cfg, data, device, fp)
        self.ref = TransformersRunner(cfg, data, device, fp.fused_adam)
        self.ref.load_from(self.ours)
        self.batches = iter(dm.train_dataloader())
        objective = self.ours.system.objective
        self.draw = objective.mask  # our masking, drawn once per micro-batch for both
        self.pending: list[Masked] = []
        objective.mask = lambda batch: self.pending.pop(0)  # our step takes the shared masks in order
        self.seen: list[ObjectiveOutput] = []
        accumulate = self.ours.system.accumulate

        def record(out: ObjectiveOutput, batch: dict[str, torch.Tensor]) -> None:
            self.seen.append(out)
            accumulate(out, batch)

        self.ours.system.accumulate = record
        self.windows = {name: Window() for name in IMPLEMENTATIONS}

    def next_batch(self) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device) for k, v in next(self.batches).items()}

    def initial(self) -> float:
        """Both networks as built on the first batch, dropout off, in fp32: the windows get row 0's values.
        Returns the largest difference between the generators' logits at the masked positions relative to the
        largest logit: rounding when the reference computes what ours computes, order 1 when it does not."""
        batch = self.next_batch()
        m = self.draw(Batch(**batch))
        self.batches = _chain_first(batch, self.batches)  # step 1 still trains on the first batch
        nets = (self.ours.system, self.ref.gen, self.ref.disc)
        for net in nets:
            net.eval()
        matmul = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")  # no TF32 (GPU): the check is then to fp32 rounding
        with torch.no_grad():
            self.pending.append(m)
            add_ours(self.windows["ours"], self.ours.system.objective(Batch(**batch), self.ours.nets))
            ref = self.ref.forward(batch, m)
            add_reference(self.windows["transformers"], ref, batch, m)
            ours_logits = self.ours.nets.generator.masked_logits(  # (B x N, V) at the prediction slots
                m.input_ids, batch["attention_mask"], batch["token_type_ids"], m.positions.index)
        torch.set_float32_matmul_precision(matmul)
        for net in nets:
            net.train()
        used = slots.flat(m.positions.weights)
        ref_logits = slots.flat(slots.gather(ref.gen_logits, m.positions.index))[used]  # (B, T, V) -> (masked, V)
        return float((ours_logits[used] - ref_logits).abs().max() / ref_logits.abs().max())

    def step(self) -> int:
        """One training step of each; returns the tokens it trained on."""
        micro = [self.next_batch() for _ in range(self.cfg.trainer.accumulate_grad_batches)]
        masks = [self.draw(Batch(**b)) for b in micro]
        n = sum(tokens(b) for b in micro)
        self.pending.extend(masks)
        seconds, _ = _timed(lambda: self.ours.step(micro), self.device)
        for out in self.seen:
            add_ours(self.windows["ours"], out)
        self.seen.clear()
        seconds_ref, outs = _timed(lambda: self.ref.step(micro, masks), self.device)
        for out, b, m in zip(outs, micro, masks):
            add_reference(self.windows["transformers"], out, b, m)
        for name, s in (("ours", seconds), ("transformers", seconds_ref)):
            self.windows[name].tokens += n
            self.windows[name].seconds += s
        return n

    def rows(self, step: int, tokens_seen: int) -> list[dict]:
        lrs = {"ours": self.ours.scheduler.get_last_lr()[0], "transformers": self.ref.scheduler.get_last_lr()[0]}
        return [{"step": step, "tokens": tokens_seen, "implementation": name, **self.windows[name].close(),
                 "lr": lrs[name]} for name in IMPLEMENTATIONS]


def _chain_first(first: dict[str, torch.Tensor], rest):
    yield first
    yield from rest


def _timed(f, device: torch.device):
    sync(device)
    t0 = time.perf_counter()
    result = f()
    sync(device)
    return time.perf_counter() - t0, result


# ------------------------------------------------------------------------------------------- output


def write_csv(path: Path, rows: list[dict]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text(path, buf.getvalue())  # atomic: a reader sees the previous rows or these


def progress(rows: list[dict]) -> str:
    return f"step {rows[0]['step']}: " + " | ".join(
        f"{r['implementation']} MLM {r['mlm_loss']:.3f} acc {r['masked_lm_accuracy']:.1%} disc {r['disc_loss']:.3f} "
        f"AUC {r['disc_auc']:.3f} replaced {r['replaced_fraction']:.1%} {r['tokens_per_s']:,.0f} tokens/s"
        for r in rows)


def markdown(rows: list[dict]) -> str:
    """step | tokens | each implementation's MLM loss / accuracy / discriminator AUC; then tokens/s."""
    by_step: dict[int, dict[str, dict]] = {}
    for r in rows:
        by_step.setdefault(r["step"], {})[r["implementation"]] = r
    lines = ["| step | tokens | " + " | ".join(f"{name}: MLM loss / acc / disc AUC" for name in IMPLEMENTATIONS) + " |",
             "|---:|---:|" + "---|" * len(IMPLEMENTATIONS)]
    for step, pair in by_step.items():
        cells = [f"{pair[n]['mlm_loss']:.3f} / {pair[n]['masked_lm_accuracy']:.1%} / {pair[n]['disc_auc']:.3f}"
                 for n in IMPLEMENTATIONS]
        lines.append(f"| {step} | {pair[IMPLEMENTATIONS[0]]['tokens']:,} | " + " | ".join(cells) + " |")
    speed = {n: statistics.median(r["tokens_per_s"] for r in rows if r["implementation"] == n and r["step"] > 0)
             for n in IMPLEMENTATIONS}
    lines += ["", "Row 0: the networks as built, on the first batch, dropout off, fp32. Training step alone, median "
              "tokens/s over the rows: " + ", ".join(f"{n} {v:,.0f}" for n, v in speed.items()) + "."]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- command line


@dataclass(frozen=True)
class Result:
    rows: list[dict]  # COLUMNS, one per implementation per logged step
    out: Path
    wiring_gap: float  # row 0: largest |ours - transformers| generator logit at the masked positions / largest logit


def compose(overrides: list[str]) -> DictConfig:
    """The pre-training config of `overrides`, refused when a key is misspelt or the reference cannot match it."""
    message = cli.unknown_key_message("pretrain", overrides)
    if message:
        raise BenchError(message)
    cfg = compose_pretrain([f"paths.output_dir={tempfile.gettempdir()}/electra_ablate_curve", *overrides])
    problems = reference_problems(cfg)
    if problems:
        raise BenchError("; ".join(problems))
    return cfg


def run(cfg: DictConfig, steps: int, log_every: int, out: Path, device: torch.device) -> Result:
    pair = SideBySide(cfg, device)
    log(f"{steps} steps of {cfg.trainer.accumulate_grad_batches} x {cfg.data.batch_size} x {cfg.data.max_seq_length} "
        f"tokens on {device.type}, {precision_lib.resolve(cfg.runtime.precision, device.type)}, both implementations")
    gap = pair.initial()
    rows = pair.rows(0, 0)
    mlm = {r["implementation"]: r["mlm_loss"] for r in rows}
    verdict = ("the reference computes what ours computes" if gap <= WIRING_TOLERANCE else
               f"above {WIRING_TOLERANCE:g}: the reference does NOT compute what ours computes from the same weights, "
               "so the curves below do not compare the implementations alone")
    log(f"row 0 (our initial weights in both, first batch, same mask, dropout off, fp32): generator MLM loss ours "
        f"{mlm['ours']:.6f}, transformers {mlm['transformers']:.6f}; largest logit difference {gap:.1e} of the "
        f"largest logit: {verdict}")
    write_csv(out, rows)
    seen = 0
    for step in range(1, steps + 1):
        seen += pair.step()
        if step % log_every == 0 or step == steps:
            rows += pair.rows(step, seen)
            write_csv(out, rows)
            log(progress(rows[-len(IMPLEMENTATIONS):]))
    return Result(rows, out, gap)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m electra_ablate.probes.curve", description=__doc__.split("\n\n")[0],
        epilog="example:\n  python -m electra_ablate.probes.curve model=tiny data=wiki data.max_docs=40000 "
        "data.train_vocab_size=2000 \\\n    data.max_seq_length=64 data.batch_size=128 optim.lr=1e-3 "
        "optim.warmup_steps=60 trainer.max_steps=750 runtime.num_workers=0",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", help="pre-training overrides of conf/pretrain.yaml, as "
                                                "python -m electra_ablate.pretrain takes them")
    p.add_argument("--steps", type=int, default=None, help="steps to train (default trainer.max_steps; the learning "
                                                           "rate decays to zero at trainer.max_steps whatever this is)")
    p.add_argument("--log-every", type=int, default=25, help="steps per row of the curves (default 25)")
    p.add_argument("--out", type=Path, default=None, help="the CSV to write (default <paths.output_root>/curves/"
                                                          "electra-vs-transformers-<date>-<time>.csv)")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    return p.parse_intermixed_args(argv)


def main(argv: list[str] | None = None) -> Result:
    a = parse_args(argv)
    device = resolve_device(a.device)
    if a.log_every < 1:
        raise BenchError(f"--log-every {a.log_every}: give a positive number of steps")
    cfg = compose(a.overrides)
    steps = cfg.trainer.max_steps if a.steps is None else a.steps
    if not 1 <= steps <= cfg.trainer.max_steps:
        raise BenchError(f"--steps {steps}: give 1 to trainer.max_steps={cfg.trainer.max_steps} (the learning rate "
                         "is zero from there; raise trainer.max_steps to train longer)")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = a.out or Path(cfg.paths.output_root) / "curves" / f"electra-vs-transformers-{stamp}.csv"
    result = run(cfg, steps, a.log_every, out, device)
    print(markdown(result.rows), flush=True)
    log(f"wrote {out}")
    return result


@cli.one_line_errors
def cli_main() -> None:
    """Console entry: a refused option ends in one line (common/cli.py)."""
    main()


if __name__ == "__main__":
    cli_main()
