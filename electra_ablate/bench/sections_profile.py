"""Where a `cpu_regime_30k` step's time goes (section `profile`): BERT's and ELECTRA's pre-training step at the
preset's shape, and a fine-tuning step of its discriminator (SST-2, batch 32, mean pooling as the CPU recipes), in
this process (freed memory kept, as every entry point keeps it): each operation's own (self) time summed by family:
matmuls, the 30,522-way head, attention, layer norm, elementwise, dropout, the optimizer and clipping, the
embeddings' lookup and gradient, autocast's casts (of tensors other than the head's), and what runs outside
operations (the step's wall time less its operations').

Each kernel is timed where it is dispatched (`OpTimer`, a TorchDispatchMode: forward and backward, an operation
called inside another counted once, as its own time), not under torch.profiler: the profiler's records are
allocated from the heap between a step's tensors, so under it the heap fragments and a 30k step faults again
(about 250,000 minor faults a step, the head's fills and copies tripled) where it does not without it. The timer's
few Python objects a kernel live in Python's own arenas; the step's minor faults under it are reported.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from electra_ablate.bench.builds import FastPath, OursRunner, compose_config, encoder_configs, load_data
from electra_ablate.bench.sections_pipeline import finetune_batches, finetune_step
from electra_ablate.bench.settings import Report, Settings, log
from electra_ablate.common import precision as precision_lib
from electra_ablate.glue.readers import read_tsv
from electra_ablate.glue.tasks import get_task

PRESET = "cpu_regime_30k"
OBJECTIVES = ("bert", "electra")
HEAD = "the vocabulary head (every operation on a vocabulary-sized tensor)"
# (family, words of an operation's name), first match wins. The first two go by name whatever the operands (the
# optimizer's update and the embeddings' lookup and gradient touch the vocabulary-sized table); after them an
# operation on a vocabulary-sized tensor is the head's, whatever its name (its matmul, the cast of its weight,
# log-softmax, loss and sampling).
FAMILIES = (
    ("optimizer and clipping", ("adam", "optimizer", "_foreach_", "clip_grad", "linalg_vector_norm")),
    ("embeddings (lookup and gradient)", ("embedding", "index_select", "index_add", "scatter_add", "index_put")),
    ("attention (scores, softmax, weighted sum)", ("bmm", "baddbmm", "softmax", "scaled_dot_product", "attention")),
    ("matmuls (projections, feed-forward)", ("aten::mm", "aten::addmm", "aten::matmul", "aten::linear")),
    ("layer norm", ("layer_norm",)),
    ("dropout", ("dropout", "bernoulli")),
)
CASTS = ("autocast casts", ("aten::to", "aten::_to_copy"))  # by the whole name: aten::topk is no cast
OUTSIDE = "outside operations (Python, autograd bookkeeping, the timer's own)"
ELEMENTWISE = "elementwise and the rest"


def family(name: str, shapes: list, vocab: int) -> str:
    """The family of one operation (its name as the profiler gives it, its operands' shapes)."""
    lowered = name.lower()
    if not name.startswith("aten::"):  # a Python scope: the optimizer's step, or autograd's own work
        return next((f for f, words in FAMILIES[:1] if any(w in lowered for w in words)), OUTSIDE)
    by_name = next((f for f, words in FAMILIES[:2] if any(w in lowered for w in words)), None)
    if by_name is not None:
        return by_name
    if any(vocab in s for s in shapes if isinstance(s, (list, tuple))):
        return HEAD
    if lowered in CASTS[1]:
        return CASTS[0]
    return next((f for f, words in FAMILIES[2:] if any(w in lowered for w in words)), ELEMENTWISE)


class OpTimer(TorchDispatchMode):
    """Each dispatched kernel's own wall time, by (name, operand shapes); a kernel that dispatches others (a
    composite's parts) is charged its time less theirs."""

    def __init__(self):
        super().__init__()
        self.seconds: dict[tuple[str, tuple], float] = {}
        self._inner = [0.0]  # the time of the kernels called inside the one running, per level

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._inner.append(0.0)
        t0 = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        elapsed = time.perf_counter() - t0
        inner = self._inner.pop()
        self._inner[-1] += elapsed
        name = func._schema.name
        if not name.startswith("profiler::"):  # record_function's markers: no work of their own
            key = (name, _shapes(args))
            self.seconds[key] = self.seconds.get(key, 0.0) + elapsed - inner
        return out


def _shapes(args) -> tuple:
    """The shapes of the tensor operands (a list's first tensor for a list of them: foreach and cat)."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(tuple(a.shape))
        elif isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            out.append(tuple(a[0].shape))
    return tuple(out)


def _faults_and_seconds(step: Callable[[int], object], steps: int) -> tuple[float, float]:
    """(minor faults, seconds) per step over `steps` calls of `step(i)` (getrusage: this process)."""
    before, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    for i in range(steps):
        step(i)
    seconds = (time.perf_counter() - t0) / steps
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / steps, seconds


def profile_row(s: Settings, what: str, step: Callable[[int], object], vocab: int, steps: int) -> dict:
    """`step` warmed up, timed as it runs, then kernel by kernel: seconds by family and the largest operations."""
    for i in range(s.warmup):
        step(i)
    faults, seconds = _faults_and_seconds(step, steps)
    timer = OpTimer()
    with timer:
        timed_faults, timed_seconds = _faults_and_seconds(step, steps)
    by_family: dict[str, float] = {}
    by_op: dict[tuple[str, str], float] = {}  # (family, operation) -> s/step
    for (name, shapes), total in timer.seconds.items():
        key, sec = family(name, [list(x) for x in shapes], vocab), total / steps
        by_family[key] = by_family.get(key, 0.0) + sec
        by_op[(key, name)] = by_op.get((key, name), 0.0) + sec
    outside = max(0.0, timed_seconds - sum(by_family.values()))  # beside any kernel family() put there
    by_family[OUTSIDE] = by_family.get(OUTSIDE, 0.0) + outside
    largest = {f: [(op, sec) for (g, op), sec in sorted(by_op.items(), key=lambda kv: -kv[1]) if g == f][:3]
               for f in by_family}
    return {"objective": what, "preset": PRESET, "vocab": vocab, "steps": steps, "step_s": seconds,
            "faults_per_step": faults, "timed_step_s": timed_seconds, "timed_faults_per_step": timed_faults,
            "families": dict(sorted(by_family.items(), key=lambda kv: -kv[1])), "largest": largest}


def profile_step(s: Settings, objective: str, steps: int) -> dict:
    cfg = compose_config(s, "tiny", f"experiment={PRESET}", f"objective={objective}", keep_shape=True)
    data = load_data(cfg, s.device, 3)
    runner = OursRunner(cfg, data, s.device, FastPath.from_runtime(cfg, s.device))
    row = profile_row(s, objective, lambda i: runner.step([data.batches[i % 3]]),
                      runner.system.model.config.vocab_size, steps)
    return {**row, "precision": precision_lib.resolve(cfg.runtime.precision, s.device.type)}


def profile_finetune(s: Settings, steps: int, task_name: str = "sst2", batch_size: int = 32) -> dict:
    """The fine-tuning step of the preset's discriminator on `task_name`, as the CPU recipes run it."""
    cfg = compose_config(s, "tiny", f"experiment={PRESET}", keep_shape=True)
    task = get_task(task_name)
    batches = finetune_batches(s, cfg, read_tsv(task, s.data_dir / "glue", "train"), task, batch_size, 3)
    disc_cfg, _ = encoder_configs(cfg, load_data(cfg, s.device, 1))
    step = finetune_step(s, cfg, disc_cfg, task, batches, pooling="mean")
    # No vocabulary head here: the embedding table's updates are the optimizer's or elementwise, by their names.
    row = profile_row(s, f"fine-tuning ({task_name.upper()}, batch {batch_size})", step, -1, steps)
    return {**row, "precision": precision_lib.resolve(cfg.runtime.precision, s.device.type)}


def section_profile(s: Settings, rep: Report) -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(s.threads)
    try:
        rows = [profile_step(s, objective, s.piece_reps) for objective in OBJECTIVES]
        for row in [*rows, profile_finetune(s, s.piece_reps)]:
            rep.profile.append(row)
            log(f"profile {PRESET} {row['objective']}: {row['step_s']:.3f} s a step, {row['timed_step_s']:.3f} s "
                "timed kernel by kernel")
    finally:
        torch.set_num_threads(previous)
