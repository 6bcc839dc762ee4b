"""The generator's vocabulary head at `cpu_regime_30k` (section `head`): why its passes over the logits stay.

The head of an ELECTRA step, forward and backward, on its own at the preset's shape (prediction slots x the
generator's embedding width -> 30,522 pieces, bf16 autocast, fp32 loss, accuracy and sampler), three ways,
interleaved call by call from the same weights and random numbers:

- eager: the objectives' own code (`objectives/base.py`: `fp32_scores`, `mlm_loss`, the argmax, `sample_tokens`).
- row blocks: the same kernels on blocks of rows, each block's fp32 logits small enough to stay in cache, the
  log-softmax recomputed in backward from the bf16 logits instead of kept. Every kernel works row by row, so the
  result is the same to the bit (checked in the section); only the memory traffic differs.
- compiled: the same function under torch.compile (inductor fuses the passes; its reductions round differently).

Beside them, each pass over the full (N, V) logits alone, with the bytes it reads and writes per second: a plain
copy moves memory at the machine's rate; a pass far below that rate is bound by its arithmetic, which neither
blocking nor fusing removes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from electra_ablate.bench.builds import compose_config, encoder_configs, load_data
from electra_ablate.bench.settings import Report, Settings, log
from electra_ablate.objectives import positions
from electra_ablate.objectives.base import IGNORE, fp32_scores, mlm_loss, sample_tokens

PRESET = "cpu_regime_30k"
BLOCK_ROWS = 16  # 16 x 30,522 fp32 logits: 2 MB, within a core's share of the last-level cache
SAMPLER = "inverse_cdf"  # runtime.sampler's default


def head_shape(s: Settings) -> tuple[int, int, int]:
    """(prediction slots per batch, the generator's embedding width, the vocabulary) of the preset's ELECTRA step."""
    cfg = compose_config(s, "tiny", f"experiment={PRESET}", "objective=electra", keep_shape=True)
    _, gen = encoder_configs(cfg, load_data(cfg, s.device, 1))
    slots = positions.max_predictions(cfg.objective.mask_prob, cfg.data.max_seq_length,
                                      cfg.objective.max_predictions_per_seq)
    return cfg.data.batch_size * slots, gen.embedding_size, gen.vocab_size


def eager_head(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor):
    """What `GeneratorObjective.corrupt` does with the generator's logits: loss, hits, samples."""
    scores = fp32_scores(logits)
    loss = mlm_loss(scores, targets, weights)
    detached = scores.detach()
    return loss, detached.argmax(-1) == targets, sample_tokens(detached, 1.0, SAMPLER)


class _RowBlocks(torch.autograd.Function):
    """Per-row losses, argmax and inverse-CDF samples from bf16 logits, computed `BLOCK_ROWS` rows at a time with
    the kernels `eager_head` calls; backward recomputes each block's log-softmax from the saved bf16 logits."""

    @staticmethod
    def forward(ctx, logits, targets, u):
        n = logits.shape[0]
        losses, argmax, sampled = torch.empty(n), torch.empty(n, dtype=torch.long), torch.empty(n, dtype=torch.long)
        for i in range(0, n, BLOCK_ROWS):
            rows = slice(i, i + BLOCK_ROWS)
            x = logits[rows].float()
            losses[rows] = F.nll_loss(torch.log_softmax(x, -1), targets[rows], reduction="none")
            argmax[rows] = x.argmax(-1)
            cdf = torch.softmax(x, -1).cumsum_(-1)
            sampled[rows] = torch.searchsorted(cdf, u[rows] * cdf[:, -1:], right=True).squeeze(1)
        ctx.save_for_backward(logits, targets)
        ctx.mark_non_differentiable(argmax, sampled)
        return losses, argmax, sampled.clamp_(max=logits.shape[-1] - 1)

    @staticmethod
    def backward(ctx, grad, _argmax, _sampled):
        logits, targets = ctx.saved_tensors
        out, total = torch.empty_like(logits), torch.ones(())
        for i in range(0, logits.shape[0], BLOCK_ROWS):
            rows = slice(i, i + BLOCK_ROWS)
            lsm = torch.log_softmax(logits[rows].float(), -1)
            g = torch.ops.aten.nll_loss_backward(grad[rows], lsm, targets[rows], None, 0, IGNORE, total)
            out[rows] = torch.ops.aten._log_softmax_backward_data(g, lsm, -1, torch.float32)
        return out, None, None


def blocked_head(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor):
    u = torch.rand(logits.shape[0], 1)  # the draw `sample_tokens` makes, at the same point of the stream
    losses, argmax, sampled = _RowBlocks.apply(logits, targets, u)
    w = weights.float()
    return (losses * w).sum() / w.sum().clamp(min=1.0), argmax == targets, sampled


class HeadCase:
    """The head's input (N, H) and weights, and one forward and backward of a head function from them."""

    def __init__(self, n: int, width: int, vocab: int):
        gen = torch.Generator().manual_seed(0)
        self.hidden = torch.randn(n, width, generator=gen)
        self.weight = (torch.randn(vocab, width, generator=gen) * width**-0.5).requires_grad_()
        self.bias = torch.zeros(vocab, requires_grad=True)
        self.targets = torch.randint(0, vocab, (n,), generator=gen)
        self.targets[::10] = IGNORE  # unused slots: weight 0 and ignored by the loss, as in a real batch
        self.weights = self.targets != IGNORE

    def run(self, head: Callable) -> tuple[torch.Tensor, ...]:
        self.weight.grad = self.bias.grad = None
        hidden = self.hidden.clone().requires_grad_()
        torch.manual_seed(1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = F.linear(hidden, self.weight, self.bias)
        loss, hits, sampled = head(logits, self.targets, self.weights)
        loss.backward()
        return loss.detach(), hits, sampled, self.weight.grad, self.bias.grad, hidden.grad


def _differences(got: tuple, want: tuple) -> str:
    """'none' when every output and gradient equals eager's to the bit, else what differs."""
    names = ("loss", "hits", "samples", "weight gradient", "bias gradient", "input gradient")
    diff = [f"{name} ({int((a != b).sum())} of {a.numel()})" for name, a, b in zip(names, got, want, strict=True)
            if not torch.equal(a, b)]
    return "none" if not diff else ", ".join(diff)


PASSES = (  # (name, function of the fp32 logits x, their bf16 copy xb, the log-softmax lsm; bytes moved per element)
    ("copy (the memory rate)", lambda x, xb, lsm: x.clone(), 8),
    ("cast bf16 -> fp32", lambda x, xb, lsm: xb.float(), 6),
    ("log-softmax", lambda x, xb, lsm: torch.log_softmax(x, -1), 8),
    ("argmax", lambda x, xb, lsm: x.argmax(-1), 4),
    ("max (a plain reduction)", lambda x, xb, lsm: x.amax(-1), 4),
    ("softmax", lambda x, xb, lsm: torch.softmax(x, -1), 8),
    ("cumulative sum", lambda x, xb, lsm: x.cumsum(-1), 8),
    ("log-softmax backward", lambda x, xb, lsm: torch.ops.aten._log_softmax_backward_data(x, lsm, -1, x.dtype), 12),
    ("cast fp32 -> bf16", lambda x, xb, lsm: x.bfloat16(), 6),
)


def _median_s(fn: Callable, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def section_head(s: Settings, rep: Report) -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(s.threads)
    try:
        n, width, vocab = head_shape(s)
        case = HeadCase(n, width, vocab)
        variants = {"eager": eager_head, "row blocks": blocked_head}
        want = case.run(eager_head)
        same = {"eager": "none", "row blocks": _differences(case.run(blocked_head), want)}
        compiled, first_s = torch.compile(eager_head), 0.0
        try:
            t0 = time.perf_counter()
            compiled_out = case.run(compiled)
            first_s = time.perf_counter() - t0
            variants["compiled"], same["compiled"] = compiled, _differences(compiled_out, want)
        except Exception as error:  # inductor needs a C++ compiler on CPU: the other rows still say what they say
            rep.notes.append(f"The head's compiled variant was not timed: torch.compile failed ({type(error).__name__}).")
            log(f"head compiled: not timed ({type(error).__name__}: {str(error)[:200]})")
        for _ in range(s.warmup):
            for fn in variants.values():
                case.run(fn)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(s.piece_reps):  # interleaved: eager, row blocks, compiled, eager, ...
            for name, fn in variants.items():
                times[name].append(_median_s(lambda fn=fn: case.run(fn), 1))  # one call, timed
        eager_s = statistics.median(times["eager"])
        for name in variants:
            sec = statistics.median(times[name])
            rep.head.append({"variant": name, "rows": n, "width": width, "vocab": vocab, "s": sec,
                             "speedup": eager_s / sec, "differs": same[name], "times": times[name],
                             **({"compile_s": max(0.0, first_s - sec)} if name == "compiled" else {})})
            log(f"head {name}: {1000 * sec:.1f} ms forward and backward, {eager_s / sec:.2f}x eager")
        x = (torch.randn(n, vocab, generator=torch.Generator().manual_seed(2)) * 3).bfloat16().float()
        xb, lsm = x.bfloat16(), torch.log_softmax(x, -1)
        for name, fn, per_element in PASSES:
            fn(x, xb, lsm)
            sec = _median_s(lambda fn=fn: fn(x, xb, lsm), max(3, s.piece_reps))
            rep.head_passes.append({"pass": name, "s": sec, "gb_s": per_element * x.numel() / sec / 1e9})
    finally:
        torch.set_num_threads(previous)
