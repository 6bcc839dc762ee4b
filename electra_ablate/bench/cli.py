"""Pre-training speed: this harness against a Hugging Face transformers script, and the fast path piece by piece.

`python -m electra_ablate.bench` writes reports/benchmarks.md. The reference is what a researcher
would write around transformers: `ElectraForPreTraining` + `ElectraForMaskedLM` with tied embeddings, SDPA
attention, dropout 0.1, MLM logits at every position (as `ElectraForMaskedLM` computes them), Gumbel-max
sampling over all positions (the reference implementation's `sample_from_softmax`), our Adam update
(optim.bias_correction) with the same parameter groups, schedule and gradient clipping. Ours is the `electra` objective built exactly as
`training/build.py` builds it (`build_networks` + the configured algorithm's `PretrainSystem`), stepped as Lightning
steps it (training_step, backward, clip, optimizer and scheduler step). Both see the same real batches of the
Wikipedia sample, interleaved A B A B after warm-up; the report gives medians and their ratio.

Also measured in the same run: the fp32 matmul peak at the model's shapes (for the share of peak), FLOPs per
step (paper accounting, `electra_ablate.models.flops`, and the FLOPs actually executed, counted by
`torch.utils.flop_counter`), peak memory (a fresh process per configuration), an equal-work check (identical
weights and corrupted batch must give the same losses and gradients), each fast-path piece on/off,
`torch.compile`, BERT vs ELECTRA step time, fine-tuning examples/s, the data loader alone, the operations
in a training step that would make a CUDA device synchronise with the host, and a cold corpus build (word
pieces/s of `data=text_files`, section `build`), and tokens per CPU-hour at a sweep's own shape by attention path
and process layout (section `throughput`).

The package keeps measuring and writing apart: `settings` (what a run is asked, the machine, the `Report` every
section fills), `builds` (the two networks and the batches), `measure` (timing, FLOPs, syncs, memory), one
module per group of sections (`sections_speed`, `sections_checks`, `sections_pipeline`), `render` and
`render_sections` (the markdown), and this module (the command line and the order the sections run in).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

import torch

from electra_ablate.bench.measure import memory_probe
from electra_ablate.bench.render import render
from electra_ablate.bench.sections_checks import section_equal, section_memory, section_sync
from electra_ablate.bench.sections_pipeline import section_build, section_data, section_finetune
from electra_ablate.bench.sections_allocator import allocator_probe, section_allocator
from electra_ablate.bench.sections_presets import section_presets
from electra_ablate.bench.sections_profile import section_profile
from electra_ablate.bench.sections_head import section_head
from electra_ablate.bench.sections_throughput import section_throughput, throughput_probe
from electra_ablate.bench.sections_speed import (section_bert, section_compile, section_pieces, section_pretrain,
                                                 section_shapes)
from electra_ablate.bench.sections_capture import section_capture, section_loop
from electra_ablate.bench.step_costs import write_step_costs
from electra_ablate.bench.settings import (CONF_DIR, DEFAULT_OUT, DEFAULT_SECTIONS, NO_GPU_NOTE, PRECISIONS, PROBE_TAG,
                                           REPO, SECTIONS,
                                           BenchError, Report, Settings, default_data_dir, default_precisions,
                                           log, machine_info, resolve_device)
from electra_ablate.common import cli, stops
from electra_ablate.common.io import write_text


def _precisions(arg: str | None, device_type: str) -> tuple[str, ...]:
    """--precisions as the runtime.precision values to time, fp32 first (the base of the ratios)."""
    if arg is None:
        return default_precisions(device_type)
    requested = [x for x in arg.split(",") if x]
    bad = sorted(set(requested) - set(PRECISIONS))
    precisions = tuple(p for p in PRECISIONS if p in requested)
    if bad or not precisions:
        raise BenchError(f"--precisions {arg!r}: {bad or 'empty'} not benchmarked; give a comma-separated subset of "
                         f"{','.join(PRECISIONS)}")
    return precisions


def parse_args(argv: list[str] | None) -> tuple[Settings, Path]:
    p = argparse.ArgumentParser(
        prog="python -m electra_ablate.bench", description=__doc__.split("\n\n")[0],
        epilog="examples:\n  python -m electra_ablate.bench --models tiny,small\n"
        "  python -m electra_ablate.bench --models tiny --sections build --out reports/benchmarks_corpus_build.md\n"
        "  python -m electra_ablate.bench --models tiny --sections throughput --out reports/benchmarks_throughput.md\n"
        "  python -m electra_ablate.bench --quick --models tiny --out /tmp/bench.md",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="tiny,small", help="conf/model options, comma-separated (default tiny,small)")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    p.add_argument("--batch-size", type=int, default=None, help="default 32 on CPU, 128 on GPU")
    p.add_argument("--seq-len", type=int, default=128, help="sequence length (default 128)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before each measurement (default 2)")
    p.add_argument("--reps", type=int, default=5, help="timed steps per implementation in the main comparison")
    p.add_argument("--piece-reps", type=int, default=5, help="timed steps per row in the other sections")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(),
                   help=f"torch threads (default {torch.get_num_threads()}: what torch uses here)")
    p.add_argument("--accumulate", type=int, default=4,
                   help="gradient-accumulation probe: micro-batches of --batch-size per step (default 4: 32 x 4 = "
                        "the paper's ELECTRA-Small batch of 128)")
    p.add_argument("--precisions", default=None,
                   help="runtime.precision values to time side by side in the pre-training and fine-tuning sections "
                        "(default: 32-true,bf16-mixed on a CPU with avx512_bf16 or AMX, 32-true on other CPUs, "
                        "bf16-mixed on CUDA)")
    p.add_argument("--compile-models", default="tiny", help="configs for the torch.compile, capture and loop sections "
                                                            "(slow to compile)")
    p.add_argument("--sections", default=",".join(DEFAULT_SECTIONS),
                   help=f"comma-separated subset of {','.join(SECTIONS)} (default: all but capture and loop)")
    p.add_argument("--data-dir", type=Path, default=None, help="the shared data folder (default: $ELECTRA_ABLATE_DATA "
                                                               "or ../shared/data)")
    p.add_argument("--cache-dir", type=Path, default=REPO / "outputs" / "cache", help="token cache (paths.cache_dir)")
    p.add_argument("--override", action="append", default=[], help="a Hydra override for every config (repeatable)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the markdown report to write (default "
                   "reports/benchmarks.md)")
    p.add_argument("--json", type=Path, default=None, help="also write the measured rows of every section here (JSON), "
                                                           "for programs that read the results (bench/gpu_check.py)")
    p.add_argument("--quick", action="store_true", help="1 warm-up and 2 timed steps everywhere (tests, smoke runs)")
    p.add_argument("--build-paths", default="", help="comma-separated files, folders or globs for the corpus-build "
                                                     "section (default: the Wikipedia slice; --quick: the sample)")
    p.add_argument("--build-workers", type=int, default=None, help="tokenizer processes in the corpus-build section "
                                                                   "(default: --threads)")
    p.add_argument("--build-max-docs", type=int, default=None, help="stop the corpus build after this many documents")
    p.add_argument("--throughput-experiment", default="cpu_regime",
                   help="conf/experiment option whose shape the throughput section times (default cpu_regime)")
    p.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.probe is not None:
        return None, a.probe  # type: ignore[return-value]
    device = resolve_device(a.device)
    sections = tuple(x for x in a.sections.split(",") if x)
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise BenchError(f"unknown --sections {unknown}; valid: {', '.join(SECTIONS)}")
    data_dir = (a.data_dir or default_data_dir()).resolve()
    if not (data_dir / "corpus").is_dir():
        raise BenchError(f"no corpus under {data_dir}; pass --data-dir or set ELECTRA_ABLATE_DATA to the shared data folder")
    models = tuple(x for x in a.models.split(",") if x)
    for m in models:
        if not (CONF_DIR / "model" / f"{m}.yaml").is_file():
            valid = ", ".join(sorted(f.stem for f in (CONF_DIR / "model").glob("*.yaml")))
            raise BenchError(f"unknown --models entry {m!r}; valid: {valid}")
    precisions = _precisions(a.precisions, device.type)
    quick = a.quick
    command = "python -m electra_ablate.bench " + " ".join(shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))
    s = Settings(
        models=models, device=device, batch_size=a.batch_size or (128 if device.type == "cuda" else 32),
        seq_len=a.seq_len, warmup=1 if quick else a.warmup, reps=2 if quick else a.reps,
        piece_reps=2 if quick else a.piece_reps, threads=a.threads, data_dir=data_dir,
        cache_dir=a.cache_dir.resolve(), overrides=tuple(a.override), sections=sections, quick=quick,
        compile_models=tuple(x for x in a.compile_models.split(",") if x), accumulate=a.accumulate, command=command,
        precisions=precisions,
        build_paths=tuple(x for x in a.build_paths.split(",") if x), build_workers=a.build_workers or a.threads,
        build_max_docs=a.build_max_docs, throughput_experiment=a.throughput_experiment,
    )
    return s, (a.out, a.json)


def run(s: Settings) -> Report:
    torch.set_num_threads(s.threads)
    torch.manual_seed(0)
    rep = Report(s)
    rep.machine = machine_info(s)
    for model in s.models:
        if "equal" in s.sections:
            section_equal(s, rep, model)
        if "pretrain" in s.sections:
            section_pretrain(s, rep, model)
    last = s.models[-1]
    if "shapes" in s.sections:
        section_shapes(s, rep, s.models[0])
    for name, fn in (("pieces", section_pieces), ("bert", section_bert), ("data", section_data), ("sync", section_sync)):
        if name in s.sections:
            fn(s, rep, last)
    if "finetune" in s.sections:
        for model in s.models:
            section_finetune(s, rep, model)
    if "compile" in s.sections:
        for model in s.compile_models:
            section_compile(s, rep, model)
    for name, fn in (("capture", section_capture), ("loop", section_loop)):
        if name in s.sections:
            for model in s.compile_models:
                fn(s, rep, model)
    if "memory" in s.sections:
        for model in s.models:
            section_memory(s, rep, model)
    if "build" in s.sections:
        section_build(s, rep)
    if "throughput" in s.sections:
        section_throughput(s, rep)
    if "presets" in s.sections:
        section_presets(s, rep)
    if "allocator" in s.sections:
        section_allocator(s, rep)
    if "profile" in s.sections:
        section_profile(s, rep)
    if "head" in s.sections:
        section_head(s, rep)
    rep.machine["load_end"] = os.getloadavg()
    rep.notes += [
        "The reference masks tokens with this package's `mask_tokens` (the same cost as ours) and computes no "
        "metrics; our step also accumulates its metric sums and AUROC counts on the device, as in training.",
        "Our step runs `PretrainSystem.training_step`, backward, `clip_grad_norm_`, the optimizer and the LR "
        "scheduler, i.e. what Lightning's automatic optimisation runs per step, without the trainer's own "
        "bookkeeping (a few milliseconds).",
        "The equal-work check uses our generator's samples for both implementations; that our inverse-CDF "
        "sampler draws from the same distribution as Gumbel-max is tested in tests/test_objectives.py.",
    ]
    if s.device.type == "cpu":
        rep.notes.append(f"GPU rows are empty: {NO_GPU_NOTE}.")
    return rep


def main(argv: list[str] | None = None) -> Report | None:
    s, out = parse_args(argv)
    if s is None:  # --probe: one memory measurement in this fresh process
        spec = json.loads(out)
        probe = {"throughput": throughput_probe, "allocator": allocator_probe}.get(spec.get("kind"), memory_probe)
        print(PROBE_TAG + json.dumps(probe(spec)), flush=True)
        return None
    out, json_out = out
    try:
        rep = run(s)
    except stops.Stopped:
        stops.report(f"the benchmark wrote no report to {out} (it has no MLflow run); the same command runs it again")
        raise
    write_text(out, render(rep))
    costs = write_step_costs(rep, out)  # the presets' and throughput's steps, for a sweep's dry run (sweep/cost.py)
    if costs is not None:
        log(f"wrote {costs}")
    if json_out is not None:
        rows = {k: v for k, v in vars(rep).items() if k not in ("settings", "peaks")}
        write_text(json_out, json.dumps(rows, default=str, indent=1))
    log(f"wrote {out}")
    return rep


@cli.one_line_errors
def cli_main() -> None:
    """Console entry: a refused option ends in one line, and so does a stop (common/cli.py)."""
    main()
