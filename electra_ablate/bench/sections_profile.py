"""Where a `cpu_regime_30k` step's time goes (section `profile`): BERT's and ELECTRA's step at the preset's shape,
in this process (freed memory kept, as every entry point keeps it), under torch.profiler, each operation's own
(self) CPU time summed by family: matmuls, the 30,522-way head, attention, layer norm, elementwise, dropout, the
optimizer and clipping, the embeddings' lookup and gradient, autocast's casts (of tensors other than the head's),
and what runs outside operations.
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from electra_ablate.bench.builds import FastPath, OursRunner, compose_config, load_data
from electra_ablate.bench.settings import Report, Settings, log
from electra_ablate.common import precision as precision_lib

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
OUTSIDE = "outside operations (Python, autograd bookkeeping)"
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


def profile_step(s: Settings, objective: str, steps: int) -> dict:
    cfg = compose_config(s, "tiny", f"experiment={PRESET}", f"objective={objective}", keep_shape=True)
    data = load_data(cfg, s.device, 3)
    runner = OursRunner(cfg, data, s.device, FastPath.from_runtime(cfg, s.device))
    vocab = runner.system.model.config.vocab_size
    for i in range(s.warmup):
        runner.step([data.batches[i % 3]])
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for i in range(steps):
            runner.step([data.batches[i % 3]])
    by_family: dict[str, float] = {}
    by_op: dict[tuple[str, str], float] = {}  # (family, operation) -> s/step
    for event in prof.key_averages(group_by_input_shape=True):
        key, seconds = family(event.key, event.input_shapes or [], vocab), event.self_cpu_time_total / 1e6 / steps
        by_family[key] = by_family.get(key, 0.0) + seconds
        by_op[(key, event.key)] = by_op.get((key, event.key), 0.0) + seconds
    largest = {f: [(op, sec) for (g, op), sec in sorted(by_op.items(), key=lambda kv: -kv[1]) if g == f][:3]
               for f in by_family}
    return {"objective": objective, "preset": PRESET, "vocab": vocab, "steps": steps,
            "precision": precision_lib.resolve(cfg.runtime.precision, s.device.type),
            "families": dict(sorted(by_family.items(), key=lambda kv: -kv[1])), "largest": largest}


def section_profile(s: Settings, rep: Report) -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(s.threads)
    try:
        for objective in OBJECTIVES:
            row = profile_step(s, objective, s.piece_reps)
            rep.profile.append(row)
            log(f"profile {PRESET} {objective}: {sum(row['families'].values()):.3f} s of operations per step")
    finally:
        torch.set_num_threads(previous)
