"""Every command the README and docs/*.md show, run the way a user runs it; the lab notebook's, composed.

The other tests compose configs in Python; these start the documented commands in fresh processes, on the
hermetic data folder (conftest.py), in a temporary ELECTRA_ABLATE_HOME and working directory, with reports
sent to a temporary folder, so a command that stops working, or no longer writes what the text says it
writes, fails here. tests/docs_commands.py reads the commands out of the markdown.

Each documented command is looked up in COMMANDS by its text (or in SKIP_PATTERNS by its program):

- `Smoke`: run it at smoke scale. `args` shrink it (a `key=value` replaces the command's own value of `key`,
  else is appended; `--flag value` likewise), `replace` substitutes placeholders and paths in the text
  (values may come from another documented command's smoke run: `FromRun`), `check` asserts what the text
  says the command writes. Expensive ones are marked `slow`.
- `Skip`: not run here, with the reason (a GPU, a cluster, the network, a server, an install, the test
  suite itself). pytest shows the reason.

The dated lab notebook (docs/notebook/**) is history: its commands need no entry, are never run, and those of a
Hydra entry point are composed like any other (`notebook_spec` fills their placeholders), so an entry whose
command no longer composes against today's configs shows up.

A command in neither fails `test_documented_command_runs`, in the default run: a newly documented command
gets smoke settings or a skip reason before it is merged. Every command of a Hydra entry point (pretrain,
finetune, sweep, report), skipped ones included, is also composed in-process by
`test_documented_command_composes` (default run, about a second each): its keys pass the command line's key
check and Hydra composes it (a sweep or a report: every job's config too). So a command that needs a GPU
is still checked as far as a CPU machine can check it.

`test_quick_sweep_report_shows_a_run_off_the_majority_class` (slow) reads the report of the README's main
job, fine-tuned long enough to learn the hermetic SST-2, as a user reads it.

Subprocesses get OMP_NUM_THREADS=1 unless the command sets it: on 2 cores shared with other jobs, two torch
threads per process were 3x slower than one.
"""

from __future__ import annotations

import dataclasses
import lzma
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from docs_commands import DocCommand, documented_commands, in_notebook, normalize, program, split_env

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
COMMANDS_FOUND = documented_commands(REPO)
HYDRA_ENTRY_POINTS = {"electra_ablate.pretrain": "pretrain", "electra_ablate.finetune": "finetune",
                      "electra_ablate.sweep": "sweep", "electra_ablate.report": "sweep"}
TIMEOUT_S = 1800

# --- smoke-scale settings -----------------------------------------------------------------------------------

# A 2-step pre-training run on a few hundred documents of the hermetic corpus, whatever the model size.
PRETRAIN_2_STEPS = ("trainer.max_steps=2", "optim.warmup_steps=1", "data.max_docs=200", "data.batch_size=4",
                    "data.max_seq_length=64", "runtime.num_workers=0", "trainer.enable_progress_bar=false")
# The tiny shape of conftest.TINY_PRETRAIN (2 layers, hidden 64; conf/debug/smoke.yaml): fine-tuning it is seconds.
TINY_SHAPE = ("debug=smoke",)
FINETUNE_SMALL = ("glue_data.max_train_examples=16", "glue_data.max_eval_examples=16", "glue_data.max_seq_length=32",
                  "task.epochs=1", "runtime.num_workers=0", "trainer.enable_progress_bar=false")
# The quick sweep shrunk, but with enough fine-tuning that a tiny encoder leaves the majority class of the
# hermetic data (128 training rows: 20 epochs are 80 steps; STS-B keeps the sweep's own 3 epochs).
QUICK_EPOCHS = 20


def hydra_list(key: str, items) -> str:
    """`key=['a=1','b=2']`: Hydra reads an unquoted `=` inside a list as a syntax error."""
    return f"{key}=[{','.join(repr(i) for i in items)}]"


QUICK_PRETRAIN = hydra_list("pretrain_overrides", [*TINY_SHAPE, "trainer.max_steps=2", "optim.warmup_steps=1",
                                                   "data.max_docs=200", "data.batch_size=8"])
QUICK_FINETUNE = hydra_list("finetune_overrides", [f"task.epochs={QUICK_EPOCHS}"])


@dataclass(frozen=True)
class FromRun:
    """A value produced by the smoke run of another documented command (`attr` of its Result)."""

    command: str
    attr: str  # run_id | pretrained_dir
    dummy: str = "0" * 32  # stands in when a command is only composed


@dataclass(frozen=True)
class Skip:
    reason: str
    replace: dict = field(default_factory=dict)  # placeholders, for the composition check


@dataclass(frozen=True)
class Smoke:
    args: tuple[str, ...] = ()
    replace: dict = field(default_factory=dict)  # text -> str ("{tmp}": the command's folder) or FromRun
    check: Callable | None = None  # check(result, runner)
    slow: bool = True
    setup: Callable | None = None  # setup(tmp): write the files the substituted command reads
    pythonpath: tuple[str, ...] = ()  # extra entries (tests/: the toy objective of docs/architecture.md)


@dataclass
class Result:
    doc: str
    words: list[str]
    tmp: Path
    returncode: int
    output: str
    seconds: float

    @property
    def shell(self) -> str:
        return shlex.join(self.words)

    def error_line(self) -> str:
        lines = [x for x in self.output.splitlines() if x.strip()]
        errors = [x for x in lines if x.startswith(("error:", "Error", "ERROR")) or "Error:" in x or "Exception" in x]
        return (errors or lines or ["(no output)"])[-1].strip()

    def _pretrained(self) -> tuple[str, str, str]:
        # The outcome pretrain ends with (electra_ablate/pretrain.py): its name, then its checkpoint and run id.
        found = re.findall(r"^pre-trained (\S+) \(\w+\).*?^  checkpoint: (\S+); MLflow run ([0-9a-f]{32})$",
                           self.output, re.M | re.S)
        assert found, f"`{self.shell}` printed no 'pre-trained <name> ... checkpoint: <dir>; MLflow run <id>' outcome"
        return found[-1]

    @property
    def run_id(self) -> str:
        return self._pretrained()[2]

    @property
    def pretrained_dir(self) -> str:
        return self._pretrained()[1]


# --- checks: what the text says each command writes ---------------------------------------------------------


def check_pretrained(result: Result, runner: Runner) -> None:
    """README: a run writes under <outputs>/pretrain/<experiment>/<config hash>/ `checkpoints/last.ckpt` and the
    pre-trained network `pretrained/final`."""
    final = Path(result.pretrained_dir)
    run_dir = final.parent.parent
    assert final == run_dir / "pretrained" / "final" and run_dir.parent.parent == runner.home / "pretrain", final
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert {"config.json", "model.pt"} <= {p.name for p in final.iterdir()}, sorted(final.iterdir())


def check_durable(result: Result, runner: Runner) -> None:
    """docs/reliability.md: the run's last checkpoint (pointed at) and its final export are in the durable store
    too, under the run folder's path below the outputs folder."""
    import json

    check_pretrained(result, runner)
    area = result.tmp / Path(result.pretrained_dir).parent.parent.relative_to(runner.home)
    assert json.loads((area / "checkpoints" / "latest.json").read_text())["step"] == 2
    assert (area / "pretrained" / "final.json").is_file()


def check_finetuned(*expected: tuple[str, int]) -> Callable:
    """Each (task, seed) fine-tuned to a final score, as its own FINISHED MLflow run."""

    def check(result: Result, runner: Runner) -> None:
        for task, seed in expected:
            assert re.search(rf"\b{task} seed={seed}: final/\w+=", result.output), f"no final score for {task} seed={seed}"
        finished = {(r.data.tags.get("task"), r.data.tags.get("seed")) for r in runner.runs(kind="finetune")}
        assert {(t, str(s)) for t, s in expected} <= finished, finished

    return check


def check_report(name: str, variants: tuple[str, ...], ran: bool = True) -> Callable:
    """reports/<name>.md (under the report_dir the test passed): when the sweep ran, a row per variant in its
    tables and no failed or missing job; when nothing ran (the report alone), every variant listed missing."""

    def check(result: Result, runner: Runner) -> None:
        path = result.tmp / "reports" / f"{name}.md"
        said = (f"report: {path}", f"report: {path.relative_to(result.tmp)}")  # relative below the working directory
        assert any(s in result.output for s in said), f"the command did not say it wrote {path}"
        text = path.read_text()
        # The console ends with the outcome: the main table (a row per variant) and one line per verdict.
        outcome = result.output[result.output.rindex(f"{name} (scale "):]
        if ran:
            assert "dev, median over fine-tuning seeds:" in outcome, result.output
            for v in variants:
                assert re.search(rf"^  {re.escape(v)}\b", outcome, re.M), f"no console row for {v}:\n{outcome}"
            assert re.search(r"^verdicts on .+ \(95% multi-bootstrap interval, points\):$", outcome, re.M), outcome
        missing = section(text, "Failed and missing runs")
        for v in variants:
            if ran:
                assert re.search(rf"^\| {re.escape(v)}\b", text, re.M), f"no row for variant {v} in {path}"
            else:
                assert re.search(rf"^- pre-training {re.escape(v)} seed \d+ .*: missing", missing, re.M), missing
        if ran:
            assert missing.strip() == "None: every job of the grid finished.", missing

    return check


def check_long_dry_run(result: Result, runner: Runner) -> None:
    """docs/findings.md: the long run's dry run prices its two pre-training jobs and launches nothing."""
    assert "electra_ablate.pretrain -m" in result.output and not runner.runs("cpu_long", kind="pretrain")
    assert re.search(r"^  pretrain: 2 job\(s\), about \d+\.\d core-hours$", result.output, re.M), result.output


def check_dry_run_cost(result: Result, runner: Runner) -> None:
    """docs/usage.md: a dry run prints the commands and the core-hours of each phase, each variant's line saying what
    its step cost rests on (here a `cpu_regime` step: the hermetic vocabulary's 2,200 pieces are nearer its 2,000
    than BERT's 30,522), and launches nothing."""
    assert "electra_ablate.pretrain -m" in result.output and not runner.runs("cpu_regime_30k", kind="pretrain")
    assert re.search(r"^  pretrain: 6 job\(s\), about \d+\.\d core-hours$", result.output, re.M), result.output
    for variant, jobs in (("bert", 3), ("electra", 3)):
        line = rf"^    {variant}: {jobs} job\(s\), [\d,]+ steps x \d+\.\d\d s = \d+\.\d core-hours \(cpu_regime"
        assert re.search(line, result.output, re.M), result.output
    assert "  step costs: reports/benchmarks_presets.json (" in result.output


def check_exported(result: Result, runner: Runner) -> None:
    """README: export writes discriminator/ (or mlm/) and generator/ directories transformers loads."""
    for part in ("discriminator", "generator"):
        assert (result.tmp / "exported" / part / "config.json").is_file(), sorted((result.tmp / "exported").rglob("*"))


def check_bench_throughput(result: Result, runner: Runner) -> None:
    out = result.tmp / "reports" / "benchmarks_throughput.md"
    text = out.read_text() if out.is_file() else ""
    assert "## Tokens per CPU-hour at the sweep's shape" in text and "| one 1-thread job |" in text, out


def check_bench_build(result: Result, runner: Runner) -> None:
    out = result.tmp / "reports" / "benchmarks_corpus_build.md"
    assert out.is_file() and "word pieces/s" in out.read_text(), out


def check_curve(result: Result, runner: Runner) -> None:
    """docs/usage.md's curve probe: a row per implementation in the CSV under <outputs>/curves/, the table printed."""
    (path,) = (runner.home / "curves").glob("electra-vs-transformers-*.csv")
    assert ",ours," in path.read_text() and ",transformers," in path.read_text()
    assert "| step | tokens | ours: MLM loss" in result.output


def check_pilot_csv(result: Result, runner: Runner) -> None:
    """docs/usage.md's pilot: its windows, one row per logged step, in the CSV the command names."""
    lines = (result.tmp / "pilots" / "lr5e-4.csv").read_text().splitlines()
    assert lines[0].startswith("name,step,tokens,") and [line.split(",")[:2] for line in lines[1:]] == [
        ["lr5e-4", "1"], ["lr5e-4", "2"], ["lr5e-4", "3"]], lines


def check_gpu_smoke(result: Result, runner: Runner) -> None:
    """docs/gpu.md's dry run: every part of the GPU check ran, and the report reads their results."""
    text = (result.tmp / "benchmarks_gpu_smoke.md").read_text()
    for part in ("speed", "capture", "loop", "pilot", "sweep"):
        assert re.search(rf"^\| {part} \| [^|]+ \| ok \|", text, re.M), (part, text[:3000])
    assert "| the quick sweep at smoke size, end to end through joblib_gpu | ok | yes |" in text
    assert "### The captured step" in text and "### The training loop against the step alone" in text


def check_my_objective(result: Result, runner: Runner) -> None:
    check_pretrained(result, runner)
    run = runner.client().get_run(result.run_id)
    assert run.data.tags.get("objective") == "my_objective", run.data.tags


def check_joblib_pretrain(result: Result, runner: Runner) -> None:
    """docs/reliability.md: exit code 0, both runs FINISHED."""
    seeds = {r.data.tags.get("seed") for r in runner.runs(kind="pretrain", objective="bert")
             if r.data.params.get("trainer.max_steps") == "4"}
    assert {"0", "1"} <= seeds, seeds


def check_states(*names: str):
    def check(result: Result, runner: Runner) -> None:
        """docs/usage.md's states probe: a row per (encoder, layer), the output the classifier reads among them."""
        for name in (*names, "random init"):
            assert f"| {name} | embeddings |" in result.output and f"| {name} | output |" in result.output, name
    return check


def section(text: str, title: str) -> str:
    """The body of a markdown `## title` section."""
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    return m.group(1) if m else ""


# --- setups: files a substituted command reads --------------------------------------------------------------


def write_text_corpora(tmp: Path) -> None:
    """README's `data.paths=[/corpora/wiki,/corpora/books/*.txt.zst]`: a folder of plain text and zstd files."""
    import zstandard

    with lzma.open(Path(os.environ["ELECTRA_ABLATE_DATA"]) / "corpus" / "enwiki_2014_slice.txt.xz", "rt") as f:
        text = f.read()
    docs = text.split("\n\n")
    half = len(docs) // 2
    (tmp / "corpora" / "wiki").mkdir(parents=True)
    (tmp / "corpora" / "books").mkdir(parents=True)
    for i in range(2):
        part = docs[i * half // 2:(i + 1) * half // 2]
        (tmp / "corpora" / "wiki" / f"part{i}.txt").write_text("\n\n".join(part) + "\n")
        book = "\n\n".join(docs[half + i * half // 2:half + (i + 1) * half // 2]) + "\n"
        (tmp / "corpora" / "books" / f"book{i}.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(book.encode()))


def write_my_conf(tmp: Path) -> None:
    """docs/architecture.md's `objective/<name>.yaml` in a folder of one's own, naming tests/toy_variants.py's
    objective as `my_objective.MyObjective`, a subclass of tests/toy_variants.py's."""
    (tmp / "my_conf" / "objective").mkdir(parents=True)
    (tmp / "my_conf" / "objective" / "my_objective.yaml").write_text(
        "_target_: my_objective.MyObjective\nmask_prob: 0.15\n")
    # The module names the option (common/variants.py): my_objective.py, importable from the command's folder.
    (tmp / "my_objective.py").write_text(
        "from toy_variants import ShuffledTokenDetection\n\n\nclass MyObjective(ShuffledTokenDetection):\n"
        "    pass\n")


def write_cpu_regime_2x2(tmp: Path) -> None:
    """sweeps/cpu_regime.yaml with 2 pre-training and 2 fine-tuning seeds and one intermediate checkpoint (at
    half of the smoke's 2 steps): the same presets, arms and report."""
    text = (REPO / "sweeps" / "cpu_regime.yaml").read_text()
    text, n = re.subn(r"^seeds: \[.*\]$", "seeds: [0, 1]", text, flags=re.M)
    text, m = re.subn(r"^pretrain_seeds: \[.*\]$", "pretrain_seeds: [0, 1]", text, flags=re.M)
    text, k = re.subn(r"^checkpoints: \[.*\]$", "checkpoints: [0.5, 1.0]", text, flags=re.M)
    assert n == m == k == 1, "sweeps/cpu_regime.yaml no longer sets seeds, pretrain_seeds and checkpoints at the top"
    (tmp / "cpu_regime.yaml").write_text(text)


def check_holds_current(result: Result, runner: Runner) -> None:
    """docs/findings.md: the tables are rewritten in place, so the smoke only asks whether they are current."""
    assert "'What holds at CPU scale' is current" in result.output, result.output


def check_regime_report(result: Result, runner: Runner) -> None:
    """The cpu_regime report: every arm, and both recipe sections naming the presets and their deviations."""
    check_report("cpu_regime", ("bert", "electra", "none"))(result, runner)
    text = (result.tmp / "reports" / "cpu_regime.md").read_text()
    assert "named preset `cpu_regime` (conf/experiment/cpu_regime.yaml)" in section(text, "Pre-training recipe")
    assert "LayerNorm placement (post = BERT's and ELECTRA's block): pre (paper: post)" in text
    assert "named recipe `cpu_regime` (conf/recipe/cpu_regime.yaml)" in section(text, "Fine-tuning recipe")
    assert "sentence representation (cls = the final [CLS] state): mean (paper: cls)" in text


# --- the tables ---------------------------------------------------------------------------------------------

PRETRAIN_SMALL = ("python -m electra_ablate.pretrain objective=electra sharing=embeddings model=small "
                  "generator.hidden_size=0.25 seed=3 trainer.max_steps=1000")
QUICK = "python -m electra_ablate.sweep sweep=quick"
REPORT_DIR = "report_dir={tmp}/reports"
RUN_ID = FromRun(PRETRAIN_SMALL, "run_id")
PRETRAINED_DIR = FromRun(PRETRAIN_SMALL, "pretrained_dir", dummy="/nonexistent/pretrained/final")
QUICK_SMOKE = Smoke((QUICK_PRETRAIN, QUICK_FINETUNE, REPORT_DIR), check=check_report("quick", ("electra", "bert", "none")))
PYTEST = "runs the test suite itself (this module is part of it)"
GPU = "needs GPUs"
# The lab notebook's commands are history: composed against today's configs, never run. Its placeholders, for the
# composition: a pre-trained directory stands in for any <...> (notebook_spec), these for the others.
NOTEBOOK_SKIP = "a dated entry of the lab notebook (docs/notebook/): composed, not run"
NOTEBOOK_PLACEHOLDERS = {"<pilot overrides>": "objective=bert optim.lr=1e-3"}

COMMANDS: dict[str, Smoke | Skip] = {
    # README: quick start
    "bash setup.sh && . .venv/bin/activate": Skip("makes a virtual environment and installs packages (network)"),
    "bash setup.sh": Skip("makes a virtual environment and installs packages (network)"),
    QUICK: QUICK_SMOKE,
    "OMP_NUM_THREADS=1 python -m electra_ablate.sweep sweep=cpu_regime hydra/launcher=joblib hydra.launcher.n_jobs=2":
        Smoke((QUICK_PRETRAIN, hydra_list("finetune_overrides", FINETUNE_SMALL[:3] + ("task.epochs=1",)), REPORT_DIR),
              replace={"sweep=cpu_regime": "sweep={tmp}/cpu_regime.yaml"}, setup=write_cpu_regime_2x2,
              check=check_regime_report),
    # docs/findings.md: what holds at CPU scale (the tables' command); docs/presets.md: the ablation sweeps at scale cpu
    "python -m electra_ablate.report.holds":
        Smoke(replace={"report.holds": "report.holds --check"}, check=check_holds_current, slow=False),
    **{f"OMP_NUM_THREADS=1 python -m electra_ablate.sweep sweep={name} scale=cpu hydra/launcher=joblib "
       "hydra.launcher.n_jobs=2": Skip("about 3 hours of two cores; every job's config composes "
                                       "(test_documented_command_composes), and the cpu_regime sweep's smoke runs "
                                       "the same presets end to end")
       for name in ("table5_efficiency", "weight_sharing", "generator_size", "training_algorithms")},
    # docs/findings.md and docs/presets.md: the preset at the paper's vocabulary, its sweeps and its step costs
    "OMP_NUM_THREADS=1 python -m electra_ablate.sweep sweep=cpu_regime_30k hydra/launcher=joblib hydra.launcher.n_jobs=2":
        Skip("9-10 hours of two free cores; every job's config composes (test_documented_command_composes), and the "
             "cpu_regime sweep's smoke runs the same pipeline end to end"),
    **{f"OMP_NUM_THREADS=1 python -m electra_ablate.sweep sweep={name} scale=cpu_30k hydra/launcher=joblib "
       "hydra.launcher.n_jobs=2": Skip("hours of two cores; every job's config composes "
                                       "(test_documented_command_composes)")
       for name in ("table5_efficiency", "weight_sharing", "generator_size", "training_algorithms")},
    'python -m electra_ablate.sweep sweep=table1_small scale=small "phases=[finetune,report]"':
        Skip("Small-size fine-tuning; every job's config composes (test_documented_command_composes), and "
             "tests/test_report.py fine-tunes and reports an unfinished run's saved checkpoints on a store it fills"),
    "python -m electra_ablate.sweep sweep=cpu_regime_30k dry_run=true": Smoke(check=check_dry_run_cost),
    "OMP_NUM_THREADS=1 python -m electra_ablate.sweep sweep=cpu_long hydra/launcher=joblib hydra.launcher.n_jobs=2":
        Skip("the long run: about 15 core-hours of pre-training; every job's config composes "
             "(test_documented_command_composes), and tests/test_sweeps.py checks its budget and checkpoints"),
    "python -m electra_ablate.sweep sweep=cpu_long dry_run=true": Smoke(check=check_long_dry_run),
    ("OMP_NUM_THREADS=1 python -m electra_ablate.sweep sweep=cpu_long_protocol precision=32-true hydra/launcher=joblib "
     "hydra.launcher.n_jobs=2"):
        Skip("the long run's finals under a second recipe: about 9 core-hours on the long run's store; every job's "
             "config composes (test_documented_command_composes), tests/test_recipes.py runs the recipe axis on a "
             "store it fills, and tests/test_cpu_long_store.py checks its dry run plans exactly 60 runs on the store"),
    # docs/usage.md: results bundles
    "ELECTRA_ABLATE_HOME=/path/to/store python -m electra_ablate.results export sweep=cpu_long":
        Skip("reads the long run's store (../shared/cpu_long restored; minutes); reports/cpu_long/runs is what it "
             "wrote, and tests/test_results.py exports stores it fills, byte for byte twice"),
    "python -m electra_ablate.results render sweep=cpu_long report_dir=/tmp/check":
        Skip("renders the long run's 339 runs (minutes); tests/test_results.py::"
             "test_a_committed_report_re_renders_from_its_bundle_alone (slow) runs it for every committed bundle"),
    "diff <(sed 1,3d reports/cpu_long.md) <(sed 1,3d /tmp/check/cpu_long.md)":
        Skip("compares the render above with the committed report; "
             "tests/test_results.py::test_a_committed_report_re_renders_from_its_bundle_alone (slow) does the same"),
    "python -m electra_ablate.results render sweep=cpu_long bootstrap_seed=1 report_dir=/tmp/seed1":
        Skip("renders the long run's 339 runs (minutes); tests/test_results.py renders bundles, and draws a report's "
             "bootstraps from another seed"),
    "ELECTRA_ABLATE_HOME=/path/to/store python -m electra_ablate.results import sweep=cpu_long_protocol":
        Skip("merges into the long run's store (minutes); tests/test_results.py imports into stores it fills: "
             "skipped runs, conflicts, a live writer"),
    "python -m electra_ablate.report sweep=cpu_regime_30k":
        Smoke((REPORT_DIR,), check=check_report("cpu_regime_30k", ("electra", "bert"), ran=False)),
    # docs/usage.md: the probes
    "python -m electra_ablate.probes.states electra=<final dir> bert=<final dir> --random-init-of bert":
        Smoke(("--examples 8",), replace={"<final dir>": PRETRAINED_DIR}, check=check_states("electra", "bert")),
    ("OMP_NUM_THREADS=1 python -m electra_ablate.probes.curve model=tiny data=wiki data.max_docs=40000 "
     "data.train_vocab_size=2000 data.max_seq_length=64 data.batch_size=128 optim.lr=1e-3 optim.warmup_steps=60 "
     "trainer.max_steps=750 runtime.num_workers=0"):
        Smoke(("debug=smoke", "data.max_docs=200", "data.batch_size=4", "optim.warmup_steps=1", "trainer.max_steps=3",
               "--log-every 1"), check=check_curve, slow=False),
    ("python -m electra_ablate.probes.pilot lr5e-4 experiment=cpu_regime objective=electra trainer.max_steps=4944 "
     "optim.lr=5e-4 --out pilots/lr5e-4.csv"):
        Smoke((*PRETRAIN_2_STEPS, "debug=smoke", "trainer.max_steps=3", "logger.log_every_n_steps=1"),
              check=check_pilot_csv, slow=False),
    ("OMP_NUM_THREADS=1 python -m electra_ablate.bench --models tiny --sections allocator --warmup 2 --piece-reps 4 "
     "--threads 1 --out reports/benchmarks_allocator.md"):
        Skip("times each preset's steps on the real corpus in 16 fresh processes (minutes); tests/test_bench.py runs "
             "the section at test sizes"),
    "python scripts/freed_memory_job.py --out /tmp/freed_memory_job":
        Skip("five cpu_regime_30k pre-training jobs on the real corpus (minutes); tests/test_allocator.py pre-trains "
             "with and without the setting at test size"),
    "python -m electra_ablate.pretrain experiment=cpu_regime_30k data.max_docs=2000 trainer.max_steps=16":
        Skip("the job scripts/freed_memory_job.py times (16 steps at the 30k preset on the real corpus); "
             "tests/test_allocator.py pre-trains with and without the setting at test size"),
    "python -m electra_ablate.bench --models tiny --sections presets --out reports/benchmarks_presets.md":
        Skip("times the presets on the real corpus (minutes); tests/test_bench.py runs the section at test sizes"),
    ("OMP_NUM_THREADS=1 python -m electra_ablate.bench --models tiny --sections profile --warmup 2 --piece-reps 3 "
     "--threads 1 --out reports/benchmarks_profile.md"):
        Skip("times the 30k preset's steps kernel by kernel on the real corpus (minutes); tests/test_bench.py runs the "
             "section at test sizes"),
    ("OMP_NUM_THREADS=1 python -m electra_ablate.bench --models tiny --sections head --warmup 2 --piece-reps 7 "
     "--threads 1 --out reports/benchmarks_head.md"):
        Skip("times the 30k preset's vocabulary head three ways (a compile and the full 30,522-way logits, minutes); "
             "tests/test_bench.py runs the section at test sizes"),
    "python -m electra_ablate.bench --models tiny --sections pretrain,capture --out reports/benchmarks_peak.md":
        Skip("times ours against transformers and compiles the whole step on the real corpus (minutes); "
             "tests/test_bench.py runs the pretrain section at test sizes, the GPU check's smoke run the capture one"),
    # README: the paper's sweeps on GPUs and clusters
    "python -m electra_ablate.sweep sweep=table5_efficiency scale=base hydra/launcher=joblib_gpu hydra.launcher.n_jobs=8":
        Skip(GPU + " (8, one job per GPU)"),
    "python -m electra_ablate.sweep sweep=table1_small scale=small hydra/launcher=slurm_gpu hydra.launcher.partition=<partition>":
        Skip("needs a SLURM cluster with GPUs", replace={"<partition>": "gpu"}),
    "python -m electra_ablate.sweep sweep=generator_size scale=base hydra/launcher=ray_gpu hydra.launcher.ray.init.address=auto":
        Skip("needs the `ray` extra and a Ray cluster with GPUs"),
    "python -m electra_ablate.sweep sweep=weight_sharing scale=base \"pretrain_overrides=['trainer=ddp']\"":
        Skip(GPU + " (trainer=ddp spans every GPU of the machine)"),
    "python -m electra_ablate.report sweep=table1_small scale=small":
        Smoke((REPORT_DIR,), check=check_report("table1_small", ("electra", "bert"), ran=False)),
    # README: speed
    "python -m electra_ablate.bench --models tiny,small": Skip("the full-size benchmark (tens of minutes on a CPU)"),
    "python -m electra_ablate.bench --models tiny --sections build --out reports/benchmarks_corpus_build.md":
        Smoke(("--quick", "--threads 1", "--build-workers 1", "--build-max-docs 200", "--cache-dir {tmp}/cache"),
              check=check_bench_build),
    "python -m electra_ablate.bench --models tiny --sections throughput --out reports/benchmarks_throughput.md":
        Smoke(("--quick", "--override data.batch_size=8", "--cache-dir {tmp}/cache"), check=check_bench_throughput),
    # README: pre-train one variant, corpora of the paper's size
    PRETRAIN_SMALL: Smoke(PRETRAIN_2_STEPS, check=check_pretrained, slow=False),
    "python -m electra_ablate.pretrain experiment=small": Smoke(PRETRAIN_2_STEPS, check=check_pretrained),
    "python -m electra_ablate.pretrain experiment=small data=text_files 'data.paths=[/corpora/wiki,/corpora/books/*.txt.zst]'":
        Smoke(PRETRAIN_2_STEPS, replace={"/corpora/": "{tmp}/corpora/"}, setup=write_text_corpora,
              check=check_pretrained),
    "python -m electra_ablate.pretrain experiment=small data=hf_dataset data.name=Skylion007/openwebtext data.streaming=true":
        Skip("streams a dataset from the Hugging Face hub (network)"),
    # README: fine-tune on GLUE
    "python -m electra_ablate.finetune pretrained=<MLflow run id | pretrained dir | hf:<dir or hub id> | none> task=rte seed=7":
        Smoke(FINETUNE_SMALL, replace={"<MLflow run id | pretrained dir | hf:<dir or hub id> | none>": PRETRAINED_DIR},
              check=check_finetuned(("rte", 7))),
    "python -m electra_ablate.finetune -m pretrained=<run id> task=rte,mrpc,stsb seed=0,1,2,3,4,5,6,7,8,9":
        Smoke(("seed=0", *FINETUNE_SMALL), replace={"<run id>": RUN_ID},
              check=check_finetuned(("rte", 0), ("mrpc", 0), ("stsb", 0))),
    # README: Hugging Face transformers
    "python -m electra_ablate.export <pre-training run id | pretrained dir> exported/":
        Smoke(replace={"<pre-training run id | pretrained dir>": RUN_ID}, check=check_exported, slow=False),
    # README: MLflow
    "mlflow ui --backend-store-uri sqlite:///outputs/mlflow.db --host 127.0.0.1 --port 5000": Skip("starts a server"),
    # docs/reliability.md and docs/scaling.md: the durable store (a real S3 server: tests/test_durable_s3.py)
    "ELECTRA_ABLATE_DURABLE_ROOT=s3://my-bucket/electra python -m electra_ablate.pretrain objective=electra":
        Smoke((*PRETRAIN_2_STEPS, *TINY_SHAPE), replace={"s3://my-bucket/electra": "file://{tmp}"},
              check=check_durable),
    "mlflow server --host 0.0.0.0 --port 5000 --backend-store-uri postgresql+psycopg2://mlflow@db.internal/mlflow "
    "--artifacts-destination s3://my-bucket/mlflow":
        Skip("starts a server (tests/test_durable_s3.py starts one on PostgreSQL and a local S3 server)"),
    "export MLFLOW_TRACKING_URI=http://mlflow.internal:5000":
        Skip("the environment of a sweep against a team's tracking server"),
    "export ELECTRA_ABLATE_DURABLE_ROOT=s3://my-bucket/electra AWS_ENDPOINT_URL=https://s3.internal":
        Skip("the environment of a sweep against a team's bucket (tests/test_durable_s3.py: a local S3 server)"),
    # docs/architecture.md: add your own objective
    "python -m electra_ablate.pretrain 'hydra.searchpath=[file:///path/to/my_conf]' objective=my_objective":
        Smoke((*PRETRAIN_2_STEPS, "model=tiny", *TINY_SHAPE), replace={"/path/to/my_conf": "{tmp}/my_conf"},
              setup=write_my_conf, pythonpath=(str(TESTS),), check=check_my_objective),
    # docs/presets.md: the presets one run at a time
    "OMP_NUM_THREADS=1 python -m electra_ablate.pretrain experiment=cpu_regime objective=bert":
        Smoke((*PRETRAIN_2_STEPS, *TINY_SHAPE), check=check_pretrained),
    "python -m electra_ablate.pretrain experiment=cpu_regime_30k debug=smoke trainer.max_steps=2 data.max_docs=200":
        Smoke(PRETRAIN_2_STEPS, check=check_pretrained),
    "python -m electra_ablate.finetune -m recipe=cpu_regime pretrained=<run id> task=sst2 seed=0,1,2,3,4":
        Smoke(("seed=0", *FINETUNE_SMALL), replace={"<run id>": RUN_ID}, check=check_finetuned(("sst2", 0))),
    # docs/dashboard.md
    "python scripts/dashboard_check.py --out docs/dashboard_runs.png":
        Skip("needs headless Chromium (apt-get install chromium), and writes a figure of the docs"),
    "python scripts/dashboard_check.py --store sqlite:///outputs/mlflow.db --experiment quick":
        Skip("needs headless Chromium (apt-get install chromium) and the store of a finished quick sweep"),
    # docs/reliability.md
    "python -m electra_ablate.export": Skip("names the entry point without arguments; README's export command runs it"),
    "mlflow db upgrade sqlite:///...": Skip("recovery advice for a broken store, its path left out"),
    "for k in 0 1 2 3 4 5 6 7; do python worker.py sqlite:///$D/mlflow.db e 12 w$k & done; wait":
        Skip("a measurement recipe: worker.py is WRITER in tests/test_reliability.py, which runs it"),
    ("python -m electra_ablate.pretrain -m objective=bert seed=0,1 model=tiny model.hidden_size=64 "
     "model.embedding_size=32 model.num_hidden_layers=2 model.num_attention_heads=2 model.intermediate_size=128 "
     "data.max_seq_length=64 data.batch_size=16 data.max_docs=400 data.train_vocab_size=2000 trainer.max_steps=4 "
     "optim.warmup_steps=1 paths.root_dir=$D hydra/launcher=joblib hydra.launcher.n_jobs=2"):
        Smoke(replace={"$D": "{tmp}"}, check=check_joblib_pretrain),
    # docs/gpu.md
    "bash scripts/gpu_prepare.sh": Skip("downloads wheels from the package registry (network) into .gpu/"),
    "python -m electra_ablate.bench.gpu_check --device cpu --smoke --out /tmp/benchmarks_gpu_smoke.md":
        Smoke(("--out {tmp}/benchmarks_gpu_smoke.md", "--work {tmp}/gpu_check"), check=check_gpu_smoke),
    "python -m electra_ablate.bench --models small --compile-models small --sections capture,loop --out /tmp/capture.md":
        Skip("compiles ELECTRA-Small on a CPU (tens of minutes); the dry run above runs these sections at the tiny size"),
    # docs/scaling.md
    "python -m electra_ablate.sweep sweep=<name>": dataclasses.replace(QUICK_SMOKE, replace={"<name>": "quick"}),
}
# Whole classes of commands, whatever their arguments.
SKIP_PATTERNS = [
    (re.compile(r"^python -m pytest\b"), PYTEST),
    (re.compile(r"^mlflow ui\b"), "starts a server"),
    (re.compile(r"^pip install\b"), "installs packages (network)"),
    (re.compile(r"^apt-get install\b"), "installs system packages (root, network)"),
]


def notebook_spec(cmd: DocCommand) -> Skip:
    """A command of the lab notebook: skipped with the notebook's reason, its placeholders filled for composing."""
    replace = {p: "/nonexistent/pretrained/final" for p in re.findall(r"<[^<>]+>", cmd.text)}
    replace |= {k: v for k, v in NOTEBOOK_PLACEHOLDERS.items() if k in cmd.text}
    return Skip(NOTEBOOK_SKIP, replace)


def spec_of(cmd: DocCommand) -> Smoke | Skip | None:
    if in_notebook(cmd):
        return notebook_spec(cmd)
    if cmd.text in COMMANDS:
        return COMMANDS[cmd.text]
    for pattern, reason in SKIP_PATTERNS:
        if pattern.search(cmd.text):
            return Skip(reason)
    return None


# --- running ------------------------------------------------------------------------------------------------


def apply_args(words: list[str], args: tuple[str, ...]) -> list[str]:
    """Each `key=value` replaces the word setting `key` (else is appended); `--flag [value]` likewise."""
    words = list(words)
    for arg in args:
        if arg.startswith("--"):
            flag, *value = arg.split(" ", 1)
            if flag in words:
                i = words.index(flag)
                words[i + 1:i + 1 + len(value)] = value
            else:
                words += [flag, *value]
            continue
        key = arg.split("=", 1)[0]
        same = [i for i, w in enumerate(words) if w.split("=", 1)[0].lstrip("+~") == key]
        if same:
            words[same[0]] = arg
        else:
            words.append(arg)
    return words


def substitute(text: str, spec: Smoke | Skip, tmp: Path, value: Callable[[FromRun], str]) -> str:
    for old, new in spec.replace.items():
        text = text.replace(old, value(new) if isinstance(new, FromRun) else new.format(tmp=tmp))
    return text


def command_words(cmd_text: str, spec: Smoke | Skip, tmp: Path, value: Callable[[FromRun], str]) -> tuple[dict, list[str]]:
    env, words = split_env(substitute(cmd_text, spec, tmp, value))
    if isinstance(spec, Smoke):
        words = apply_args(words, tuple(a.format(tmp=tmp) for a in spec.args))
    return env, words


class Runner:
    """Runs documented commands once each per session, in one ELECTRA_ABLATE_HOME (so that a run id one
    command prints is found by the next), each in a folder of its own as working directory."""

    def __init__(self, root: Path):
        self.root = root
        self.home = root / "home"
        self.results: dict[str, Result] = {}

    def value(self, ref: FromRun) -> str:
        result = self.run(ref.command)
        if result.returncode:
            pytest.fail(f"needs the smoke run of `{ref.command}`, which failed: {result.error_line()}")
        return getattr(result, ref.attr)

    def run(self, text: str) -> Result:
        spec = COMMANDS[text]
        # Cached by the command line as run, its own folder left as "{tmp}": README's `sweep=quick` and
        # docs/scaling.md's `sweep=<name>` run once. Values from other commands' runs are resolved here.
        key = shlex.join(command_words(text, spec, Path("{tmp}"), self.value)[1])
        if key in self.results:
            return self.results[key]
        tmp = Path(tempfile.mkdtemp(prefix="cmd", dir=self.root))
        env_prefix, words = command_words(text, spec, tmp, self.value)
        if spec.setup:
            spec.setup(tmp)
        if words[0] in ("python", "python3"):
            words[0] = sys.executable
        env = {k: v for k, v in os.environ.items()
               if k not in ("MLFLOW_TRACKING_URI", "ELECTRA_ABLATE_ROOT", "PYTEST_CURRENT_TEST")}
        env.update(PYTHONPATH=os.pathsep.join([str(REPO), *spec.pythonpath]), ELECTRA_ABLATE_HOME=str(self.home),
                   HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")
        env.update(env_prefix)
        tic = time.perf_counter()
        proc = subprocess.run(words, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=TIMEOUT_S)
        result = Result(text, words, tmp, proc.returncode, proc.stdout, time.perf_counter() - tic)
        print(f"{time.perf_counter() - tic:6.1f} s  exit {proc.returncode}  {result.shell}")
        self.results[key] = result
        return result

    def client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(f"sqlite:///{self.home}/mlflow.db")

    def runs(self, experiment: str | None = None, kind: str | None = None, **tags: str) -> list:
        """FINISHED runs of the shared store, by experiment and tags."""
        client = self.client()
        exps = [e.experiment_id for e in client.search_experiments() if experiment in (None, e.name)]
        filters = ["attributes.status = 'FINISHED'"] + ([f"tags.kind = '{kind}'"] if kind else [])
        filters += [f"tags.{k} = '{v}'" for k, v in tags.items()]
        return client.search_runs(exps, " and ".join(filters), max_results=1000) if exps else []


@pytest.fixture(scope="session")
def runner(tmp_path_factory) -> Runner:
    return Runner(tmp_path_factory.mktemp("docs_commands"))


@pytest.fixture(scope="module", autouse=True)
def _checkout_untouched():
    """No documented command run here may write into the checkout (its committed reports, docs, outputs)."""

    def snapshot():
        files = [p for d in ("reports", "docs", "sweeps", "conf") for p in (REPO / d).rglob("*") if p.is_file()]
        return ({p: (p.stat().st_mtime_ns, p.stat().st_size) for p in files},
                {d: (REPO / d).exists() for d in ("outputs", "exported", "multirun")})

    before = snapshot()
    yield
    after = snapshot()
    changed = sorted(str(p.relative_to(REPO)) for p in set(before[0]) | set(after[0]) if before[0].get(p) != after[0].get(p))
    assert not changed and before[1] == after[1], f"the smoke runs wrote into the checkout: {changed} {after[1]}"


def params(select: Callable[[DocCommand], bool] = lambda c: True) -> list:
    out = []
    for cmd in COMMANDS_FOUND:
        if not select(cmd):
            continue
        spec = spec_of(cmd)
        slow = isinstance(spec, Smoke) and spec.slow
        out.append(pytest.param(cmd, id=cmd.id, marks=[pytest.mark.slow] if slow else []))
    return out


def test_the_docs_show_commands():
    """The extraction itself: the README's main job is among the commands found."""
    assert QUICK in {c.text for c in COMMANDS_FOUND} and len(COMMANDS_FOUND) >= 20


def test_every_table_entry_is_still_documented():
    """A command dropped from the docs leaves its entry behind: remove it too."""
    stale = sorted(set(COMMANDS) - {c.text for c in COMMANDS_FOUND})
    assert not stale, f"COMMANDS has entries no document shows any more: {stale}"


@pytest.mark.parametrize("cmd", params())
def test_documented_command_runs(cmd: DocCommand, runner: Runner):
    spec = spec_of(cmd)
    if spec is None:
        pytest.fail(f"new documented command: add smoke overrides or a skip reason to COMMANDS in {Path(__file__).name}:\n"
                    f"    {cmd.text!r}")
    if isinstance(spec, Skip):
        pytest.skip(spec.reason)
    result = runner.run(cmd.text)
    assert result.returncode == 0, (f"`{result.shell}` (in {result.tmp}) exited with {result.returncode}: "
                                    f"{result.error_line()}\n--- last lines ---\n"
                                    + "\n".join(result.output.splitlines()[-40:]))
    if spec.check:
        spec.check(result, runner)


def is_hydra_entry_point(cmd: DocCommand) -> bool:
    words = normalize(cmd.text).split()
    while words and "=" in words[0] and not words[0].startswith("-"):
        words.pop(0)
    return program(cmd.text) in ("python", "python3") and words[1:2] == ["-m"] and words[2] in HYDRA_ENTRY_POINTS


def first_of_each_sweep(overrides: list[str]) -> list[str]:
    """A multirun's overrides with every swept key at its first value: the first job's command line."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out = []
    for text, o in zip(overrides, OverridesParser.create().parse_overrides(overrides)):
        out.append(f"{text.split('=', 1)[0]}={next(iter(o.sweep_string_iterator()))}" if o.is_sweep_override() else text)
    return out


@pytest.mark.parametrize("cmd", [pytest.param(c, id=c.id) for c in COMMANDS_FOUND if is_hydra_entry_point(c)])
def test_documented_command_composes(cmd: DocCommand, tmp_path, monkeypatch):
    """The command line passes the entry point's key check and composes, as the process would before it does
    any work; for a sweep or a report, every job's config composes too (sweep.compose.validate)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from electra_ablate.common import cli
    from electra_ablate.sweep.compose import context_from_cfg, validate

    spec = spec_of(cmd)
    if spec is None:
        pytest.fail(f"new documented command: add smoke overrides or a skip reason to COMMANDS in {Path(__file__).name}")
    monkeypatch.setenv("ELECTRA_ABLATE_HOME", str(tmp_path / "home"))
    if isinstance(spec, Smoke) and spec.setup:
        spec.setup(tmp_path)
        monkeypatch.syspath_prepend(str(tmp_path))  # modules the setup wrote, as the command's folder has them
    if isinstance(spec, Smoke) and spec.pythonpath:
        monkeypatch.syspath_prepend(spec.pythonpath[0])
    _, words = split_env(substitute(cmd.text, spec, tmp_path, lambda ref: ref.dummy))
    config, args = HYDRA_ENTRY_POINTS[words[2]], words[3:]
    message = cli.unknown_key_message(config, args)
    assert message is None, f"the command line's key check refuses `{cmd.text}`: {message}"
    overrides = [a for a in args if not a.startswith("-")]
    if "-m" in args or "--multirun" in args:
        overrides = first_of_each_sweep(overrides)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(cli.CONF_DIR), version_base="1.3"):
            cfg = compose(config, overrides=overrides, return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    if config == "sweep":
        validate(context_from_cfg(cfg))


# --- the quick sweep's report, read as a user reads it ------------------------------------------------------


def markdown_table(text: str) -> list[dict[str, str]]:
    """The rows of the first markdown table in `text`, as {header: cell}."""
    lines = [x for x in text.splitlines() if x.startswith("|")]
    cells = [[c.strip().strip("*") for c in x.strip("|").split("|")] for x in lines]
    return [dict(zip(cells[0], row)) for row in cells[2:]]


def majority_share(tsv: Path, label_column: int = -1) -> float:
    rows = tsv.read_text().splitlines()[1:]
    labels = [r.split("\t")[label_column] for r in rows if r.strip()]
    return 100 * max(labels.count(x) for x in set(labels)) / len(labels)


@pytest.mark.slow
def test_quick_sweep_report_shows_a_run_off_the_majority_class(runner: Runner):
    """README's main job at smoke scale, fine-tuned long enough to leave the hermetic MRPC's majority class: the
    report it writes must show at least one fine-tuning run whose dev accuracy is not the majority class's share (a
    report where every arm sits on the majority class says nothing, and is what a broken fine-tuning path looks
    like)."""
    result = runner.run(QUICK)
    assert result.returncode == 0, result.error_line()
    text = (result.tmp / "reports" / "quick.md").read_text()
    spread = [r for r in markdown_table(section(text, "Spread over fine-tuning seeds")) if r["task"] == "MRPC"]
    assert {r["variant"] for r in spread} == {"electra", "bert", "none"}, spread
    majority = round(majority_share(Path(os.environ["ELECTRA_ABLATE_DATA"]) / "glue" / "MRPC" / "dev.tsv", 0), 1)
    scores = {r["variant"]: (float(r["min"]), float(r["median"]), float(r["max"])) for r in spread}
    print(f"MRPC dev accuracy (min, median, max) per arm after {QUICK_EPOCHS} epochs: {scores}; majority {majority}")
    assert any(lo != majority or hi != majority for lo, _, hi in scores.values()), (
        f"every fine-tuning run of every arm scored the majority share {majority}: {scores}")


def test_extraction_handles_continuations_prompts_comments_and_env(tmp_path):
    (tmp_path / "README.md").write_text(
        "Text with `python -m electra_ablate.bench --models\ntiny` inline.\n\n"
        "```bash\n# a comment\n$ OMP_NUM_THREADS=1 python -m x a=1 \\\n  b='c # d'   # trailing\n\n"
        "python -m y 'k=[1,2]'\n```\n\n```\nconf/   a folder\n```\n\n```yaml\nkey: python -m z\n```\n\n"
        "Run:\n\n    mlflow ui --port 1\n    http://127.0.0.1:5000/\n")
    found = [(c.line, c.where, c.text) for c in documented_commands(tmp_path)]
    assert found == [(1, "inline", "python -m electra_ablate.bench --models tiny"),
                     (6, "fenced", "OMP_NUM_THREADS=1 python -m x a=1 b='c # d'"),
                     (9, "fenced", "python -m y 'k=[1,2]'"),
                     (22, "indented", "mlflow ui --port 1")]
    assert split_env(found[1][2]) == ({"OMP_NUM_THREADS": "1"}, ["python", "-m", "x", "a=1", "b=c # d"])
    assert apply_args(["p", "seed=0,1", "+x=1"], ("seed=0", "x=2", "--out o")) == ["p", "seed=0", "x=2", "--out", "o"]
