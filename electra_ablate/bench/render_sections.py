"""The sections of reports/benchmarks.md after the headline pre-training comparison (render.py), one function
each, in the order of the file, and the number formats every section uses. Each returns its lines, none when
the run skipped it."""

from __future__ import annotations

import math

from electra_ablate.bench.settings import LAYOUT_STEPS_PER_REP, NO_GPU_NOTE, Report
from electra_ablate.models import fast


def fmt(x: float, digits: int = 3) -> str:
    """`digits` decimals; an empty cell for a value not measured (None or NaN)."""
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def si(x: float, unit: str = "") -> str:
    """Two decimals with an SI prefix: 3.20 GFLOP/s."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix}{unit}"
    return f"{x:.2f} {unit}"


def device_label(rep: Report) -> str:
    return "GPU" if rep.settings.device.type == "cuda" else "CPU"


def pretrain_rows(rep: Report) -> dict[tuple[str, str, str], dict]:
    """Pre-training rows by (config, implementation key, precision)."""
    return {(r["model"], r["key"], r["precision"]): r for r in rep.pretrain}


def equal_work(rep: Report) -> list[str]:
    if not rep.equal:
        return []
    L = [
        "## Equal work: same weights, same corrupted batch, same losses and gradients",
        "",
        "Our weights are copied into the transformers models key by key (`hf.to_transformers_state_dict`); "
        "dropout is off (eval mode); both compute their losses on the batch our objective masked and our "
        "generator sampled (so masking and sampling randomness are shared); fp32. Then both backpropagate and "
        "every parameter gradient is compared (largest absolute difference over that tensor's largest "
        "gradient, or 1e-3 of the largest gradient anywhere if that is larger). Pass: losses within 1e-4 relative, "
        "gradients within 1e-3.",
        "",
        "| config | masked | replaced | loss | ours | transformers | relative difference | gradients compared "
        "| worst gradient difference | result |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rep.equal:
        for i, (k, (a, b)) in enumerate(r["values"].items()):
            tail = (f"{r['grads_compared']} | {r['grad_rel']:.1e} | {'pass' if r['passed'] else 'FAIL'} |"
                    if i == 0 else "| | |")
            L.append(f"| {r['model'] if i == 0 else ''} | {r['masked'] if i == 0 else ''} | "
                     f"{r['replaced'] if i == 0 else ''} | {k} | {a:.6f} | {b:.6f} | {r['rel'][k]:.1e} | {tail}")
    L.append("")
    return L


def shapes(rep: Report) -> list[str]:
    if not rep.shapes:
        return []
    L = [
        "## Our step by batch size and sequence length",
        "",
        "The same step as the main comparison (runtime defaults) at other shapes; the precisions of a shape are "
        "interleaved on the same batches, the shapes run one after another. tokens/s counts padded tokens.",
        "",
        "| config | batch | sequence | precision | step (s) | tokens/s | vs the shape's first precision |",
        "|---|---|---|---|---|---|---|",
    ]
    first = {}
    for r in rep.shapes:
        k = (r["model"], r["batch_size"], r["seq_len"])
        first.setdefault(k, r["step_s"])
        L.append(f"| {r['model']} | {r['batch_size']} | {r['seq_len']} | {r['precision']} | {fmt(r['step_s'])} | "
                 f"{r['tokens_per_s']:.0f} | {first[k] / r['step_s']:.2f}x |")
    L.append("")
    return L


def pieces(rep: Report) -> list[str]:
    if not rep.pieces:
        return []
    L = [
        "## The fast path, piece by piece",
        "",
        "Each row: our default step (the runtime defaults of this device) against the same step with that "
        "one piece switched, interleaved on the same batches. switched / default > 1: the default is faster.",
        "",
        "| config | piece | default | switched to | default: s/step | switched: s/step | switched / default |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rep.pieces:
        L.append(f"| {r['model']} | `{r['piece']}` | {r['default']} | {r['switched']} | {fmt(r['default_s'])} | "
                 f"{fmt(r['switched_s'])} | {r['switched_s'] / r['default_s']:.2f}x |")
    L += ["", "Fast dropout granularity: rates are realised exactly to 1/65536 (16-bit lanes): p = 0.1 drops "
          f"with probability {fast.effective_rate(0.1):.6f}; survivors are scaled by 1/(1 - that).", ""]
    return L


def compiled(rep: Report) -> list[str]:
    if not rep.compiled:
        return []
    L = [
        "## torch.compile (`runtime.compile=true`)",
        "",
        "Networks compiled in place (`nn.Module.compile`, state-dict keys unchanged), dynamo reset and an "
        "empty inductor cache folder per run; compile time = the warm-up steps (one per batch) minus as many "
        "compiled steps.",
        "",
        "| config | variant | step (s) | vs eager | compile time (s) |",
        "|---|---|---|---|---|",
    ]
    eager = {r["model"]: r["step_s"] for r in rep.compiled if r["variant"] == "eager"}
    for r in rep.compiled:
        L.append(f"| {r['model']} | {r['variant']} | {fmt(r['step_s'])} | {eager[r['model']] / r['step_s']:.2f}x | "
                 f"{fmt(r['compile_s'], 1)} |")
    L.append("")
    return L


def bert(rep: Report) -> list[str]:
    if not rep.bert:
        return []
    L = [
        "## BERT vs ELECTRA step time",
        "",
        "Our step, same batches; the paper (section 3.2) notes a same-size generator costs about twice a BERT "
        "step (our generator MLM head runs only on the masked positions).",
        "",
        "| config | objective | step (s) | / BERT |",
        "|---|---|---|---|",
    ]
    for r in rep.bert:
        L.append(f"| {r['model']} | {r['variant']} | {fmt(r['step_s'])} | {r['ratio']:.2f}x |")
    L.append("")
    return L


def finetune(rep: Report) -> list[str]:
    if not rep.finetune:
        return []
    L = [
        "## Fine-tuning throughput",
        "",
        "`FinetuneSystem` (encoder + [CLS] classifier) forward, loss, backward, clipping and AdamW with "
        "layer-wise learning rates, on shuffled real training batches padded to their longest sequence; every "
        "row of a config interleaved on the same batches. Dropout masks: torch's own (what fine-tuning uses) "
        "or the fast masks and attention that pre-training installs with `runtime.fast_dropout=true`; "
        "/ fastest = this row's step over the config's fastest row.",
        "",
        "| config | task | precision | dropout masks | batch | mean padded length | step (s) | examples/s "
        "| / fastest |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    best = {}
    for r in rep.finetune:
        best[r["model"]] = min(best.get(r["model"], math.inf), r["step_s"])
    for r in rep.finetune:
        L.append(f"| {r['model']} | {r['task']} | {r.get('precision', '')} | {r['variant']} | {r['batch']} | "
                 f"{r['padded_len']:.0f} | {fmt(r['step_s'])} | {r['examples_per_s']:.1f} | "
                 f"{r['step_s'] / best[r['model']]:.2f}x |")
    if rep.finetune_padding:
        L += ["", "Padding over one epoch of the training split (counted, not timed); the step's cost grows with "
              "the padded tokens. Length buckets change which examples share a batch, so they are an option "
              "(`glue_data.length_buckets`, part of the run identity), not a default.", "",
              "| task | batching | examples | real tokens | padded tokens | padded / real |",
              "|---|---|---|---|---|---|"]
        for r in rep.finetune_padding:
            L.append(f"| {r['task']} | {r['batching']} | {r['examples']} | {r['real_tokens']} | "
                     f"{r['padded_tokens']} | {r['padded_tokens'] / r['real_tokens']:.2f}x |")
    L.append("")
    return L


def data_loader(rep: Report) -> list[str]:
    if not rep.data:
        return []
    need: dict[str, float] = {}  # the fastest of our training steps (any precision): what the loader must feed
    for r in rep.pretrain:
        if r["key"] == "ours":
            need[r["model"]] = max(need.get(r["model"], 0.0), r["tokens_per_s"])
    L = [
        "## Data loader alone",
        "",
        "`PretrainDataModule.train_dataloader()` (memory-mapped token cache, batches collated in the workers"
        + (", pinned memory and non-blocking copies" if device_label(rep) == "GPU" else "") + "), after worker start-up.",
        "",
        "| config | workers | batch | batches/s | tokens/s | x the training step's tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rep.data:
        ratio = r["tokens_per_s"] / need[r["model"]] if r["model"] in need else float("nan")
        L.append(f"| {r['model']} | {r['workers']} | {r['batch']} | {r['batches_per_s']:.1f} | "
                 f"{r['tokens_per_s']:.0f} | {fmt(ratio, 0)} |")
    L.append("")
    return L


def memory(rep: Report) -> list[str]:
    if not rep.memory:
        return []
    s = rep.settings
    L = [
        "## Peak memory and gradient accumulation",
        "",
        "Each row is a fresh process that builds one configuration and trains it for 2 steps. CPU: the "
        "resident-set high-water mark minus the resident set just before the networks were built (so "
        "torch's libraries and the memory-mapped token cache are not counted); GPU: "
        "`torch.cuda.max_memory_allocated`. Accumulation = `trainer.accumulate_grad_batches`.",
        "",
        "| config | implementation | micro-batch | accumulation | global batch | peak memory (MiB) | step (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rep.memory:
        L.append(f"| {r['model']} | {'this harness' if r['impl'] == 'ours' else 'transformers'} | "
                 f"{r['batch_size']} x {s.seq_len} | {r['accumulate']} | {r['global_batch']} | "
                 f"{r['peak_mib']:.0f} | {fmt(r['step_s'])} |")
    L += ["", f"GPU memory at the paper's batch sizes: not measured ({NO_GPU_NOTE})." if device_label(rep) == "CPU" else "", ""]
    return L


def syncs(rep: Report) -> list[str]:
    if rep.syncs is None or "sync" not in rep.settings.sections:
        return []
    L = [
        "## Host-device synchronisation in the training step",
        "",
        "Operations in one training step (forward, backward, clipping, optimizer) that make a CUDA device "
        "wait for the host, found with a `TorchDispatchMode` on this run's device, with the line that issued "
        "them (and the library function they happened in). On CPU they cost nothing.",
        "",
        "| config | operation | why it synchronises | call site | inside | per step | syncs on CUDA |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rep.syncs:
        L.append(f"| {r['model']} | `{r['op']}` | {r['why']} | {r['site']} | {r['lib']} | {r['count']} | "
                 f"{r['cuda']} |")
    if not rep.syncs:
        L.append("| | none found | | | | | |")
    n_sync = sum(r["count"] for r in rep.syncs if r["cuda"] == "yes")
    L += ["", f"Synchronising operations per training step on a CUDA device: {n_sync}.", ""]
    return L


def corpus_build(rep: Report) -> list[str]:
    if not rep.build:
        return []
    L = [
        "## Corpus build",
        "",
        "A cold build of pre-training examples from text files (`data=text_files`, `electra_ablate.data.corpus_build`): "
        "content hashes, streaming decompression, tokenization in worker processes (`tokenizers`), the "
        f"reference's example builder (sequence length {rep.settings.seq_len}), the cache written. CPU seconds are those "
        "of the main process and its workers; word pieces per CPU-second x cores is the rate on that many "
        "otherwise idle cores.",
        "",
        "| corpus | MiB on disk | workers | shards | word pieces | examples | wall (s) | word pieces/s | "
        "CPU (s) | word pieces per CPU-second | load average at start |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rep.build:
        L.append(f"| {r['corpus']} | {fmt(r['mb'], 1)} | {r['workers']} | {r['shards']} | {r['tokens']} | "
                 f"{r['examples']} | {r['wall_s']:.1f} | {r['tokens_per_s']:.0f} | {r['cpu_s']:.1f} | "
                 f"{r['tokens_per_cpu_s']:.0f} | {r['load']:.2f} |")
    L.append("")
    return L


def presets(rep: Report) -> list[str]:
    rows = [r for r in rep.throughput if r["kind"] == "preset"]
    if not rows:
        return []
    base = next(r for r in rows if r["objective"] == "bert")  # the first preset's BERT step (sections_presets)
    L = ["## A step at each CPU preset", "",
         "Pre-training steps at the shape of each named preset (conf/experiment/; the overrides beside it as given), "
         "at the runtime default precision, interleaved step by step on each preset's own batches "
         f"({rep.settings.warmup} warm-up and {rep.settings.piece_reps} timed steps each, medians), one thread, "
         f"so every ratio to `{base['preset']}`'s BERT step is taken under the same load. FLOPs: the paper's "
         "accounting per step.", "",
         f"| preset | objective | vocabulary | batch | s/step | tokens/s | time / `{base['preset']}` BERT step "
         f"| FLOPs / `{base['preset']}` BERT step | core-hours per 1,000 steps |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = " ".join((f"`{r['preset']}`", *r["overrides"]))
        L.append(f"| {name} | {r['objective']} | {r['vocab']} | {r['batch'][0]} x {r['batch'][1]} | {fmt(r['step_s'])} "
                 f"| {r['tokens_per_s']:.0f} | {r['step_s'] / base['step_s']:.2f}x | {r['flops'] / base['flops']:.2f}x "
                 f"| {r['core_h_per_1k_steps']:.2f} |")
    L.append("")
    return L


def throughput(rep: Report) -> list[str]:
    attention = [r for r in rep.throughput if r["kind"] == "attention"]
    layouts = [r for r in rep.throughput if r["kind"] == "layout"]
    if not attention and not layouts:
        return []
    exp = rep.settings.throughput_experiment
    L = ["## Tokens per CPU-hour at the sweep's shape", "",
         f"Pre-training steps of `experiment={exp}` (conf/experiment/{exp}.yaml; batch x sequence as below), at the "
         "runtime default precision. Attention: torch's fused SDPA against the same math written out "
         f"(`runtime.cpu_attention`), interleaved step by step on the same batches ({rep.settings.warmup} warm-up "
         f"and {rep.settings.piece_reps} timed steps each, medians), one thread; sdpa / this > 1: written out is "
         "faster.", "",
         "| objective | batch | `cpu_attention` | s/step | tokens/s | tokens per CPU-hour | sdpa / this |",
         "|---|---|---|---|---|---|---|"]
    base = {r["objective"]: r["step_s"] for r in attention if r["attention"] == "sdpa"}
    for r in attention:
        ratio = base[r["objective"]] / r["step_s"]
        L.append(f"| {r['objective']} | {r['batch'][0]} x {r['batch'][1]} | {r['attention']} | {fmt(r['step_s'])} | "
                 f"{r['tokens_per_s']:.0f} | {si(r['tokens_per_s'] * 3600)} | {ratio:.2f}x |")
    if layouts:
        one = layouts[0]["tokens_per_cpu_hour"]
        L += ["", "Process layouts (BERT, `cpu_attention=math`): fresh processes that build, warm up, wait for each "
              f"other and then time {LAYOUT_STEPS_PER_REP * rep.settings.piece_reps} steps each, together. Tokens per "
              "CPU-hour = the layout's tokens/s x 3600 / "
              "the cores it occupies (at most all of them).", "",
              "| layout | tokens/s per job | tokens/s, all jobs | tokens per CPU-hour | / one 1-thread job |",
              "|---|---|---|---|---|"]
        for r in layouts:
            L.append(f"| {r['layout']} | {', '.join(f'{x:.0f}' for x in r['per_job'])} | {r['tokens_per_s']:.0f} | "
                     f"{si(r['tokens_per_cpu_hour'])} | {r['tokens_per_cpu_hour'] / one:.2f}x |")
    L.append("")
    return L


def notes(rep: Report) -> list[str]:
    if not rep.notes:
        return []
    return ["## Notes", ""] + [f"- {n}" for n in rep.notes] + [""]


def capture(rep: Report) -> list[str]:
    if not rep.capture:
        return []
    L = [
        "## The captured step (`runtime.compile=step`)",
        "",
        "The whole loss (masking, generator, sampling, discriminator, losses, metric sums) compiled as one graph with "
        "fullgraph=True, forward and backward, on batches padded to the sequence length (`runtime.static_shapes`), "
        "against the eager step; both from the same initial weights on the same batches, interleaved. Compile time = "
        "the first steps minus as many steady ones. Own peak memory (GPU only): the variant's peak allocation above what "
        "was allocated before it was built (weights, gradients, optimizer state, activations, CUDA-graph pool). Loss gap: the largest relative difference of the two per-step "
        "losses (inductor draws its own random numbers, so the masks and samples differ and the gap is not zero).",
        "",
        "| config | batch | variant | step (s) | tokens/s | vs eager | compile (s) | own peak memory (MiB) | loss gap |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    eager = {r["model"]: r["step_s"] for r in rep.capture if r["variant"] == "eager"}
    for r in rep.capture:
        L.append(f"| {r['model']} | {r['batch']} | {r['variant']} | {fmt(r['step_s'], 4)} | {r['tokens_per_s']:,.0f} | "
                 f"{eager[r['model']] / r['step_s']:.2f}x | {fmt(r['compile_s'], 1)} | {fmt(r['peak_mib'], 0)} | "
                 f"{r['loss_gap']:.2%} over {r['steps_compared']} steps |")
    L.append("")
    return L


def loop(rep: Report) -> list[str]:
    if not rep.loop:
        return []
    r0 = rep.loop[0]
    L = [
        "## The training loop against the step alone",
        "",
        f"The same config trained by Lightning as pre-training trains it (`bench/loop.py`: the Trainer, checkpoints "
        f"every {r0['checkpoint_every']} steps, the data loader with {r0['workers']} workers and pinned memory on a "
        f"GPU, metric windows of {r0['window']} steps), tokens/s the median of the windows after the first, against "
        "the isolated step on batches already on the device. The loop should keep 90% or more of the step.",
        "",
        "| config | variant | step alone (s) | step alone tokens/s | loop tokens/s | loop / step | train/mfu | windows |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rep.loop:
        L.append(f"| {r['model']} | {r['variant']} | {fmt(r['step_s'], 4)} | {r['step_tokens_per_s']:,.0f} | "
                 f"{r['loop_tokens_per_s']:,.0f} | {r['ratio']:.0%} | {fmt(r['mfu'], 3)} | {r['windows']} |")
    L.append("")
    return L
