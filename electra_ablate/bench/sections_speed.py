"""The sections that time our pre-training step: against the transformers reference at each precision
(`pretrain`), by batch size and sequence length (`shapes`), each fast-path piece switched (`pieces`),
`torch.compile` (`compile`) and BERT vs ELECTRA (`bert`)."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import replace

import torch

from electra_ablate.bench.builds import FastPath, OursRunner, TransformersRunner, compose_config, load_data, tokens
from electra_ablate.bench.measure import (executed_flops, interleaved, matmul_peak, median, model_shapes, paper_flops,
                                          sync)
from electra_ablate.bench.settings import Report, Settings, log
from electra_ablate.common import precision as precision_lib

# Batch sizes and sequence lengths of the shapes section (the tiny model's step at the sizes a CPU run would pick).
SHAPES = ((32, 64), (128, 64), (32, 128), (128, 128))


def section_shapes(s: Settings, rep: Report, model: str) -> None:
    """Our step's tokens/s by batch size and sequence length, each precision interleaved on the same batches."""
    for batch_size, seq_len in SHAPES:
        shaped = replace(s, seq_len=seq_len)
        runners, data = {}, None
        for p in s.precisions:
            cfg = compose_config(shaped, model, f"runtime.precision={p}", batch_size=batch_size)
            data = data or load_data(cfg, s.device, 2)
            runners[p] = OursRunner(cfg, data, s.device, FastPath.from_runtime(cfg, s.device))
        b = data.batches
        timed, _ = interleaved({p: (lambda r: lambda i: r.step([b[i]]))(r) for p, r in runners.items()},
                               len(b), 1, s.piece_reps, s.device)
        mean_tokens = statistics.mean(tokens(x) for x in b)
        for p in runners:
            rep.shapes.append({"model": model, "batch_size": batch_size, "seq_len": seq_len, "precision": p,
                               "step_s": median(timed[p]), "tokens_per_s": mean_tokens / median(timed[p])})
        log(f"shapes {model} {batch_size}x{seq_len}: " + ", ".join(f"{p} {median(v):.3f}s" for p, v in timed.items()))
        del runners


def section_pretrain(s: Settings, rep: Report, model: str) -> None:
    """Ours vs transformers at each precision, all interleaved on the same batches: step time, tokens/s, FLOPs,
    share of the matmul peak measured at the same precision."""
    runners: dict[tuple[str, str], OursRunner | TransformersRunner] = {}
    data = cfg = None
    for p in s.precisions:
        cfg = compose_config(s, model, f"runtime.precision={p}")
        data = data or load_data(cfg, s.device, max(2, min(4, s.warmup + s.reps)))
        fp = FastPath.from_runtime(cfg, s.device)
        runners[("ours", p)] = OursRunner(cfg, data, s.device, fp)
        runners[("transformers", p)] = TransformersRunner(cfg, data, s.device, fp.fused_adam)
    b = data.batches
    n_tok = tokens(b[0])
    rep.peaks[model] = {}
    for p in s.precisions:
        dtype = torch.bfloat16 if p == precision_lib.BF16 else torch.float32
        peaks = matmul_peak(model_shapes(cfg, n_tok, data.dm.vocab_size), s.device, reps=10 if not s.quick else 2,
                            dtype=dtype)
        rep.peaks[model][p] = {"shapes": peaks, "peak": max(peaks.values())}
    timed, _ = interleaved({f"{impl}|{p}": (lambda r: lambda i: r.step([b[i]]))(r) for (impl, p), r in runners.items()},
                           len(b), s.warmup, s.reps, s.device)
    first = s.precisions[0]
    ours0 = runners[("ours", first)]
    flops_paper = paper_flops(ours0, cfg, b[0]["input_ids"].shape[0], b[0]["input_ids"].shape[1])
    # Executed FLOPs do not depend on the precision: counted once per implementation.
    executed = {impl: executed_flops(lambda r=runners[(impl, first)]: r.step([b[0]])) for impl in ("ours", "transformers")}
    mean_tokens = statistics.mean(tokens(x) for x in b)
    for (impl, p), runner in runners.items():
        steps = timed[f"{impl}|{p}"]
        step_s = median(steps)
        peak = rep.peaks[model][p]["peak"]
        rep.pretrain.append({
            "model": model, "impl": runner.label, "key": impl, "precision": p,
            "batch": f"{cfg.data.batch_size} x {s.seq_len}", "step_s": step_s, "steps": steps,
            "tokens_per_s": mean_tokens / step_s, "flops_paper": flops_paper, "flops_executed": executed[impl],
            "achieved_paper": flops_paper / step_s, "share_paper": flops_paper / step_s / peak,
            "achieved_executed": executed[impl] / step_s, "share_executed": executed[impl] / step_s / peak,
        })
    log(f"pretrain {model}: " + ", ".join(f"{k} {median(v):.3f}s" for k, v in timed.items()))


# FastPath field -> (description when true / the default value, description of the other value).
PIECES = {
    "masked_only_logits": ("generator MLM logits only at the masked positions", "logits at all B x T positions, then selected"),
    "sampler": ("inverse-CDF sampling: one uniform per masked position", "Gumbel-max: one uniform per vocabulary entry"),
    "hidden_dropout": ("fast hidden-state dropout masks (16-bit lanes)", "torch dropout (`bernoulli_` masks)"),
    "attention_dropout": ("explicit softmax attention with fast dropout masks",
                          "torch SDPA with its own dropout (its math path on CPU)"),
    "fused_adam": ("fused AdamW", "for-loop AdamW"),
}


def _switched(name: str, value):
    return ("gumbel" if value == "inverse_cdf" else "inverse_cdf") if name == "sampler" else not value


def _describe(name: str, value) -> str:
    fast_label, other_label = PIECES[name]
    return fast_label if (value == "inverse_cdf" if name == "sampler" else value) else other_label


def section_pieces(s: Settings, rep: Report, model: str) -> None:
    """Our default step against the same step with one piece switched, interleaved on the same batches."""
    cfg = compose_config(s, model)
    data = load_data(cfg, s.device, 2)
    default = FastPath.from_runtime(cfg, s.device)
    b = data.batches
    base = OursRunner(cfg, data, s.device, default)
    for name in PIECES:
        if s.device.type == "cuda" and name in ("hidden_dropout", "attention_dropout"):
            continue  # on CUDA both settings are torch's own dropout and SDPA kernels
        value = getattr(default, name)
        switched = _switched(name, value)
        other = OursRunner(cfg, data, s.device, replace(default, **{name: switched}))
        timed, _ = interleaved({"default": lambda i: base.step([b[i]]), "switched": lambda i: other.step([b[i]])},
                               len(b), 1, s.piece_reps, s.device)
        rep.pieces.append({"model": model, "piece": name, "default": _describe(name, value),
                           "switched": _describe(name, switched), "default_s": median(timed["default"]),
                           "switched_s": median(timed["switched"])})
        log(f"piece {model} {name}: default {median(timed['default']):.3f}s switched {median(timed['switched']):.3f}s")
        del other


def section_compile(s: Settings, rep: Report, model: str) -> None:
    """Eager vs `torch.compile` of the networks in place (`runtime.compile=networks`). Inside a compiled graph fast
    dropout defers to torch's dropout, which inductor generates itself (models/fast.py), so one compiled variant.

    Dynamo is reset before each variant and inductor writes to an empty cache folder, so the compile time is a
    cold compile (kernels compiled for the first variant may still be reused in memory by the second).
    """
    import torch._dynamo

    cache = tempfile.mkdtemp(prefix="bench_inductor_")
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    try:
        _compile_variants(s, rep, model, torch._dynamo)
    finally:
        if previous is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


def _compile_variants(s: Settings, rep: Report, model: str, dynamo) -> None:
    cfg = compose_config(s, model)
    data = load_data(cfg, s.device, 2)
    full = FastPath.from_runtime(cfg, s.device)
    b = data.batches
    rows = {}
    for label, fp in (("eager", full), ("compiled networks", replace(full, compile=True))):
        dynamo.reset()
        runner = OursRunner(cfg, data, s.device, fp)
        first = []
        for i in range(len(b)):  # one step per batch shape: the compile (and a recompile for a new T) happens here
            sync(s.device)
            t0 = time.perf_counter()
            runner.step([b[i]])
            sync(s.device)
            first.append(time.perf_counter() - t0)
        timed, _ = interleaved({label: lambda i: runner.step([b[i]])}, len(b), 0, s.piece_reps, s.device)
        step_s = median(timed[label])
        rows[label] = {"model": model, "variant": label, "step_s": step_s,
                       "compile_s": max(0.0, sum(first) - len(first) * step_s) if fp.compile else 0.0}
        log(f"compile {model} {label}: step {step_s:.3f}s, compile {rows[label]['compile_s']:.1f}s")
        del runner
    rep.compiled.extend(rows.values())


def section_bert(s: Settings, rep: Report, model: str) -> None:
    """Step time of ELECTRA with a 1/4-size and a same-size generator, relative to BERT (paper section 3.2)."""
    variants = {
        "bert": ("objective=bert",),
        "electra, generator 1/4": ("objective=electra", "generator.hidden_size=0.25"),
        "electra, generator 1/1": ("objective=electra", "generator.hidden_size=1.0"),
    }
    runners = {}
    data = None
    for label, extra in variants.items():
        cfg = compose_config(s, model, *extra)
        data = data or load_data(cfg, s.device, 2)
        runners[label] = OursRunner(cfg, data, s.device, FastPath.from_runtime(cfg, s.device))
    b = data.batches
    timed, _ = interleaved({k: (lambda r: lambda i: r.step([b[i]]))(r) for k, r in runners.items()},
                           len(b), 1, s.piece_reps, s.device)
    bert = median(timed["bert"])
    for k in variants:
        rep.bert.append({"model": model, "variant": k, "step_s": median(timed[k]), "ratio": median(timed[k]) / bert})
    log(f"bert vs electra {model}: " + ", ".join(f"{k} {median(v):.3f}s" for k, v in timed.items()))
