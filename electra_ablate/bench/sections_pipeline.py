"""The sections that time the stages around pre-training: fine-tuning throughput (`finetune`), the data loader
alone (`data`) and a cold corpus build (`build`)."""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from hydra.utils import instantiate

from electra_ablate.bench.builds import autocast, compose_config, encoder_configs, load_data, tokens
from electra_ablate.bench.measure import interleaved, median, sync
from electra_ablate.bench.settings import Report, Settings, log
from electra_ablate.data.corpus_build import build_or_load_corpus
from electra_ablate.data.corpus_files import TextFiles
from electra_ablate.data.tokenizer import load_tokenizer
from electra_ablate.finetuning.data import LengthBucketBatchSampler, collate
from electra_ablate.finetuning.system import FinetuneSystem, OptimSettings, layerwise_param_groups
from electra_ablate.glue.features import featurize
from electra_ablate.glue.readers import read_tsv
from electra_ablate.glue.tasks import get_task
from electra_ablate.models import fast
from electra_ablate.models.encoder import ElectraModel


def section_finetune(s: Settings, rep: Report, model: str, task_name: str = "sst2") -> None:
    """Fine-tuning examples/s: FinetuneSystem's forward and loss, backward, clipping, AdamW with layer-wise lrs,
    at each precision, with fast and with torch dropout masks (`runtime.fast_dropout`), all interleaved."""
    cfg = compose_config(s, model)
    task = get_task(task_name)
    batch_size = 32 if s.device.type == "cpu" else 128
    n_batches = 2 if s.quick else 4
    examples = read_tsv(task, s.data_dir / "glue", "train")
    if model == s.models[0]:  # padding of one epoch of the training split (no timing): once per run
        subset = examples[: 2000] if s.quick else examples
        lengths = featurize(subset, load_tokenizer(cfg.data.vocab_file, True), 128, task.is_regression).lengths
        shuffled = np.random.default_rng(0).permutation(len(lengths))
        for label, batches_of in (
            ("shuffled, padded to the batch's longest (default)",
             [shuffled[i : i + batch_size] for i in range(0, len(shuffled), batch_size)]),
            ("length buckets (`glue_data.length_buckets=true`)",
             list(LengthBucketBatchSampler(lengths, batch_size, seed=0))),
        ):
            padded = sum(len(ix) * int(lengths[ix].max()) for ix in batches_of)
            rep.finetune_padding.append({"task": task_name.upper(), "batching": label, "examples": len(lengths),
                                         "real_tokens": int(lengths.sum()), "padded_tokens": padded})
    batches = finetune_batches(s, cfg, examples, task, batch_size, n_batches)
    disc_cfg, _ = encoder_configs(cfg, load_data(cfg, s.device, 1))
    steps, meta = {}, {}
    for p, (label, on) in ((p, v) for p in s.precisions for v in (("fast dropout", True), ("torch dropout", False))):
        steps[f"{p}|{label}"] = finetune_step(s, compose_config(s, model, f"runtime.precision={p}"), disc_cfg, task,
                                             batches, on)
        meta[f"{p}|{label}"] = (p, label)
    timed, _ = interleaved(steps, len(batches), 1, s.piece_reps, s.device)
    mean_len = statistics.mean(bt["input_ids"].shape[1] for bt in batches)
    for key, (p, label) in meta.items():
        rep.finetune.append({"model": model, "task": task_name.upper(), "precision": p, "variant": label,
                             "batch": batch_size, "padded_len": mean_len, "step_s": median(timed[key]),
                             "examples_per_s": batch_size / median(timed[key])})
    log(f"finetune {model}: " + ", ".join(f"{k} {batch_size / median(v):.1f} ex/s" for k, v in timed.items()))


def finetune_batches(s: Settings, cfg, examples: list, task, batch_size: int, n_batches: int) -> list[dict]:
    """`n_batches` training batches of a fixed random draw of `examples`, featurized as fine-tuning does."""
    order = np.random.default_rng(0).permutation(len(examples))[: batch_size * n_batches]
    features = featurize([examples[i] for i in order], load_tokenizer(cfg.data.vocab_file, True), 128,
                         task.is_regression)
    batches = []
    for j in range(n_batches):
        items = []
        for i in range(j * batch_size, (j + 1) * batch_size):
            a, e = features.offsets[i], features.offsets[i + 1]
            items.append((features.input_ids[a:e], features.token_type_ids[a:e], features.labels[i], i))
        batches.append({k: v.to(s.device) for k, v in collate(items).items()})
    return batches


def finetune_step(s: Settings, pcfg, disc_cfg, task, batches: list[dict], fast_dropout: bool = True,
                  pooling: str = "cls"):
    """One fine-tuning step on batch i as `step(i)`: FinetuneSystem's forward and loss under `pcfg`'s precision,
    backward, clipping, AdamW with the reference's layer-wise learning rates."""
    optim = OptimSettings(lr=1e-4, layerwise_lr_decay=0.8, reference_off_by_one=True, betas=(0.9, 0.999), eps=1e-6,
                          weight_decay=0.01, warmup_fraction=0.1)
    system = FinetuneSystem(ElectraModel(disc_cfg), task, optim, {}, pooling=pooling).to(s.device)
    fast.set_fast_dropout(system, fast_dropout)
    system.train()
    groups = layerwise_param_groups([(n, p) for n, p in system.named_parameters()], optim.lr,
                                    optim.layerwise_lr_decay, disc_cfg.num_hidden_layers, True, optim.weight_decay)
    opt = torch.optim.AdamW(groups, lr=optim.lr, betas=optim.betas, eps=optim.eps)

    def step(i):
        bt = batches[i % len(batches)]
        with autocast(pcfg, s.device):
            loss = system.loss(system(bt["input_ids"], bt["attention_mask"], bt["token_type_ids"]), bt["labels"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(system.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def section_data(s: Settings, rep: Report, model: str) -> None:
    """The data loader on its own: batches/s and tokens/s after its workers have started."""
    cfg = compose_config(s, model)
    n = 10 if s.quick else 60
    for workers in (0, 2):
        dm = instantiate(cfg.data, cache_dir=cfg.paths.cache_dir, seed=cfg.seed, num_workers=workers,
                         pin_memory=s.device.type == "cuda")
        dm.prepare()
        it: Iterator = iter(dm.train_dataloader())
        next(it)  # worker start-up is paid once per run, not per step
        t0 = time.perf_counter()
        n_tokens = 0
        for _ in range(n):
            bt = next(it)
            if s.device.type == "cuda":
                bt = {k: v.to(s.device, non_blocking=True) for k, v in bt.items()}
            n_tokens += tokens(bt)
        sync(s.device)
        dt = time.perf_counter() - t0
        rep.data.append({"model": model, "workers": workers, "batch": cfg.data.batch_size,
                         "batches_per_s": n / dt, "tokens_per_s": n_tokens / dt})
        del it
    rates = [f"{d['workers']} workers {d['tokens_per_s']:.0f} tok/s" for d in rep.data[-2:]]
    log("data loader: " + ", ".join(rates))


def section_build(s: Settings, rep: Report) -> None:
    """A cold corpus build (data=text_files): word pieces per second, wall clock and per CPU-second."""
    if s.build_paths:
        paths = list(s.build_paths)
    else:
        paths = [str(s.data_dir / "corpus" / ("enwiki_sample_5mb.txt" if s.quick else "enwiki_2014_slice.txt.xz"))]
    source = TextFiles(paths)
    cache = tempfile.mkdtemp(prefix="bench_build_")  # cold: hashing, tokenizing and example building all timed
    try:
        load = os.getloadavg()
        cpu0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        built = build_or_load_corpus(source, vocab_file=s.data_dir / "vocab" / "bert-base-uncased-vocab.txt",
                                     cache_dir=cache, max_seq_length=s.seq_len, workers=s.build_workers,
                                     max_docs=s.build_max_docs)
        wall = time.perf_counter() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        # Worker processes are reaped when the build ends, so RUSAGE_CHILDREN holds their CPU time.
        cpu = sum(b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime for a, b in zip(cpu0, cpu1))
        meta = built.meta
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    rep.build.append({
        "corpus": ", ".join(Path(p).name for p in paths)
        + (f" (first {s.build_max_docs} documents)" if s.build_max_docs else ""),
        "mb": source.total_bytes / 2**20 if not s.build_max_docs else float("nan"),
        "workers": meta["build_workers"], "shards": meta["num_shards"], "tokens": meta["num_tokens"],
        "examples": meta["num_examples"], "wall_s": wall, "cpu_s": cpu, "load": load[0],
        "tokens_per_s": meta["num_tokens"] / wall, "tokens_per_cpu_s": meta["num_tokens"] / cpu,
    })
    log(f"corpus build: {meta['num_tokens'] / wall:.0f} word pieces/s with {meta['build_workers']} workers "
        f"({meta['num_tokens'] / cpu:.0f} per CPU-second)")
