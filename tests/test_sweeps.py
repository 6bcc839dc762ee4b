"""Sweep files and the sweep runner: every sweep composes with the real configs and names only existing
options and keys, variants get the settings their paper table needs (equal FLOPs where the paper compares at
equal compute), bad sweep files fail with one clear message, the GPU placement of parallel jobs never puts
two jobs on one GPU (tested with fake GPUs), and a miniature sweep runs end to end (slow)."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import get_class, instantiate
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from electra_ablate.models import flops
from electra_ablate.models.encoder import EncoderConfig
from electra_ablate.report.build import write_report
from electra_ablate.sweep.compose import SweepContext, config_text, fresh_hydra, make_context, quote, validate
from electra_ablate.sweep.gpus import GpuSlot, _ALL_GPUS_ENV, gpu_candidates, visible_gpus
from electra_ablate.sweep.jobs import Checkpoint, FinetuneKey, PretrainJob
from electra_ablate.sweep.launch import check_launcher, launcher_overrides, shell_join
from electra_ablate.sweep.spec import CONF_DIR, SweepError, load_sweep
from electra_ablate.tracking import runs as tracking
from electra_ablate.training.build import config_step_flops

REPO = Path(__file__).resolve().parent.parent
SWEEP_FILES = sorted(p.stem for p in (REPO / "sweeps").glob("*.yaml"))
MODEL_KEYS = ("embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def scales_of(name: str) -> list[str | None]:
    return list(yaml.safe_load((REPO / "sweeps" / f"{name}.yaml").read_text()).get("scales") or [None])


def context(name, scale, tmp_path: Path, data_dir: Path) -> SweepContext:
    paths = {"root_dir": str(tmp_path), "data_dir": str(data_dir), "output_root": str(tmp_path / "outputs"),
             "cache_dir": str(tmp_path / "cache")}
    return make_context(name, scale, paths, f"sqlite:///{tmp_path}/mlflow.db")


ALL = [(name, scale) for name in SWEEP_FILES for scale in scales_of(name)]


@pytest.mark.parametrize("name, scale", ALL, ids=[f"{n}-{s}" for n, s in ALL])
def test_every_sweep_composes_with_existing_options(name, scale, tmp_path, data_dir):
    ctx = context(name, scale, tmp_path, data_dir)
    composed = validate(ctx)
    assert sorted(composed) == sorted(v.label for v in ctx.spec.pretrained_variants)
    for v in ctx.spec.pretrained_variants:
        cfg = composed[v.label]
        assert (cfg.sweep.name, cfg.sweep.variant, cfg.sweep.keep_going) == (ctx.spec.name, v.label, True)
        assert cfg.seed == ctx.spec.pretrain_seeds[0]
        exported = list(cfg.trainer.export_fractions)
        # Every checkpoint it fine-tunes is exported; a scale may export more (to keep the identity of another
        # sweep's runs, which it reuses: table5_efficiency at scale cpu).
        assert set(f for f in ctx.spec.checkpoints if f < 1) <= set(exported)
        assert exported == [f for f in ctx.spec.checkpoints if f < 1] or cfg.preset in ("cpu_regime", "cpu_regime_30k")
        for f in exported:  # every intermediate checkpoint falls on a whole step
            assert (f * cfg.trainer.max_steps) == int(f * cfg.trainer.max_steps), (v.label, f)


def encoder(cfg) -> EncoderConfig:
    vocab_size = cfg.data.train_vocab_size or 30522  # a trained vocabulary has the size asked for
    return EncoderConfig(vocab_size=vocab_size, **{k: cfg.model[k] for k in MODEL_KEYS})


def budget(cfg) -> float:
    """Training FLOPs of a composed pre-training config (two-stage: generator steps, then discriminator steps)."""
    disc = encoder(cfg)
    gen = get_class(cfg.generator._target_).network_config(disc, cfg.generator)
    args = (disc, gen, get_class(cfg.objective._target_).flops, cfg.data.batch_size, cfg.data.max_seq_length)
    steps = cfg.trainer.max_steps
    if cfg.algorithm.name == "two_stage":
        switch = cfg.algorithm.get("switch_fraction", 0.5)
        return steps * (switch * flops.pretrain_flops_per_step(*args, stage="generator")
                        + (1 - switch) * flops.pretrain_flops_per_step(*args, stage="discriminator"))
    return flops.pretrain_flops_per_step(*args) * steps


@pytest.mark.parametrize("scale", scales_of("training_algorithms"))
def test_training_algorithms_get_equal_compute(scale, tmp_path, data_dir):
    ctx = context("training_algorithms", scale, tmp_path, data_dir)
    cfgs = {v.label: ctx.compose_pretrain(PretrainJob(v.label, 0)) for v in ctx.spec.pretrained_variants}
    assert {c.algorithm.name for c in cfgs.values()} == {"joint", "two_stage", "adversarial"}
    budgets = {k: budget(c) for k, c in cfgs.items()}
    for k, b in budgets.items():
        assert b == pytest.approx(budgets["joint"], rel=0.01), (k, budgets)
    for k, c in cfgs.items():  # a dry run (sweep/cost.py) counts each stage's steps at that stage's FLOPs
        per_step = config_step_flops(c, encoder(c).vocab_size)
        stages = get_class(c.algorithm._target_).stage_steps(c)
        assert sum(stages.values()) == c.trainer.max_steps
        assert sum(n * per_step[stage] for stage, n in stages.items()) == pytest.approx(budgets[k], rel=1e-9), k


@pytest.mark.parametrize("scale", scales_of("table1_small"))
def test_table1_bert_gets_equal_compute(scale, tmp_path, data_dir):
    ctx = context("table1_small", scale, tmp_path, data_dir)
    electra, bert = (ctx.compose_pretrain(PretrainJob(v, 0)) for v in ("electra", "bert"))
    assert budget(bert) == pytest.approx(budget(electra), rel=0.10)  # equal compute, as Table 1 compares them
    if scale == "small":
        assert (electra.trainer.max_steps, bert.trainer.max_steps) == (1_000_000, 1_450_000)  # paper Table 6


EVIDENCE = [("cpu_evidence", scale) for scale in scales_of("cpu_evidence")] + [("quick", "tiny")]


@pytest.mark.parametrize("name, scale", EVIDENCE, ids=[f"{n}-{s}" for n, s in EVIDENCE])
def test_evidence_sweeps_compare_matched_arms_at_equal_compute(name, scale, tmp_path, data_dir):
    ctx = context(name, scale, tmp_path, data_dir)
    electra, bert = (ctx.compose_pretrain(PretrainJob(v, 0)) for v in ("electra", "bert"))
    assert budget(bert) == pytest.approx(budget(electra), rel=0.01)  # the paper's FLOPs accounting
    assert encoder(bert) == encoder(electra) and electra.data == bert.data  # same shape, vocabulary and data
    assert bert.trainer.max_steps > electra.trainer.max_steps
    none = ctx.spec.variant("none")
    assert none.random_init_of == "electra" and none not in ctx.spec.pretrained_variants


def test_a_sweeps_per_task_settings_reach_each_tasks_runs(tmp_path, data_dir):
    """quick cuts MRPC and STS-B below recipe=cpu_glue's settings with `per_task` keys of its scale."""
    from electra_ablate.finetuning import run as finetuning
    ctx = context("quick", "tiny", tmp_path, data_dir)
    ckpt = Checkpoint("bert", 0, "0" * 32, 1, True, 1.0)
    ctx.write_finetune_config(ckpt)
    got = {}
    for task in ctx.spec.tasks:
        ft = ctx.compose_finetune([ctx.searchpath, f"+sweep_checkpoint={ckpt.config_name}", f"task={task}"])
        (spec, task_cfg), = finetuning.selected_tasks(ft)
        cfg, task_cfg = finetuning.for_task(ft, spec.name, task_cfg)
        got[task] = (cfg.glue_data.max_train_examples, task_cfg.epochs, cfg.glue_data.max_seq_length)
    assert got == {"mrpc": (1000, 3, 128), "stsb": (1200, 3, 128)}


def test_a_report_at_another_scale_than_the_default_is_named_for_it(tmp_path, data_dir):
    """One sweep's reports at two scales sit side by side: the default scale keeps <name>.md."""
    assert load_sweep("table5_efficiency").report_name == "table5_efficiency"  # default_scale: tiny
    assert load_sweep("table5_efficiency", "tiny").report_name == "table5_efficiency"
    assert load_sweep("table5_efficiency", "cpu").report_name == "table5_efficiency_cpu"
    assert load_sweep("table1_small", "small").report_name == "table1_small"
    ctx = context("weight_sharing", "cpu", tmp_path, data_dir)
    path = write_report(ctx, tracking.setup(ctx.tracking_uri, ctx.experiment), tmp_path / "reports")
    assert path == tmp_path / "reports" / "weight_sharing_cpu.md" and path.is_file()
    assert not (tmp_path / "reports" / "weight_sharing.md").exists()


def test_scales_change_what_they_say(tmp_path, data_dir):
    base = context("table5_efficiency", "base", tmp_path, data_dir)
    cfg = base.compose_pretrain(PretrainJob("bert", 0))
    assert (cfg.model.name, cfg.objective.name, cfg.data.max_seq_length, cfg.trainer.max_steps) == ("base", "bert", 512, 1_000_000)
    assert base.compose_pretrain(PretrainJob("electra_15", 0)).trainer.max_steps == 766_000
    gen = context("generator_size", "tiny", tmp_path, data_dir).spec
    assert len(gen.variants) == 12 and gen.variant("d64-g1_4").axes == {"discriminator": "d64", "generator": "g1_4"}
    cfg = context("generator_size", "tiny", tmp_path, data_dir).compose_pretrain(PretrainJob("d64-unigram", 0))
    assert cfg.model.hidden_size == 64 and cfg.generator._target_.endswith("UnigramGenerator")
    quick = load_sweep("quick")
    assert set(quick.tasks) <= {"cola", "sst2", "mrpc", "stsb", "rte"}  # local GLUE data only
    assert len(quick.seeds) == 3 and quick.paper == "table5_efficiency"
    evidence = load_sweep("cpu_evidence")
    assert len(evidence.pretrain_seeds) >= 3 and len(evidence.seeds) >= 5
    small = load_sweep("cpu_evidence", "small")
    assert small.variant("electra").pretrain["model"] == "small" and len(small.seeds) == 10


BAD = {
    "unknown top-level key": ("name: x\ntasks: [rte]\nvariant: {a: {}}\n", r"unknown key\(s\) \['variant'\]"),
    "scale not defined": ("tasks: [rte]\nvariants: {a: {}}\nscales: {tiny: {}}\n", r"scale=None is not one of its scales \['tiny'\]"),
    "label with a dot": ("tasks: [rte]\nvariants: {g0.5: {}}\n", r"label 'g0.5' may only use"),
    "baseline": ("tasks: [rte]\nbaseline: b\nvariants: {a: {}}\n", r"baseline 'b' is not a variant"),
    "no final checkpoint": ("tasks: [rte]\ncheckpoints: [0.5]\nvariants: {a: {}}\n", r"include 1.0"),
    "unknown task": ("tasks: [rtee]\nvariants: {a: {}}\n", r"tasks=\['rtee'\] must be"),
    "scale names unknown variant": ("tasks: [rte]\nvariants: {a: {}}\ndefault_scale: t\nscales: {t: {variants: {b: {}}}}\n",
                                    r"scales.t.variants names \['b'\]"),
    "pre-trained variants beside axes": ("tasks: [rte]\naxes: {g: {a: {}, b: {}}}\nvariants: {c: {objective: bert}}\n",
                                         r"beside `axes`, `variants` may only add arms without pre-training .*not \['c'\]"),
    "a scale adds a pre-trained arm beside axes": ("tasks: [rte]\naxes: {g: {a: {}}}\ndefault_scale: t\n"
                                                   "scales: {t: {variants: {c: {objective: bert}}}}\n", r"scales.t.variants names \['c'\]"),
    "pretrained with overrides": ("tasks: [rte]\nvariants: {a: {pretrained: 'hf:x', objective: bert}}\n", r"would be ignored"),
    "random init of an unknown variant": ("tasks: [rte]\nvariants: {a: {}, none: {random_init_of: b}}\n",
                                          r"random_init_of='b', which must name a pre-trained variant"),
    "random init of a pretrained variant": ("tasks: [rte]\nvariants: {h: {pretrained: 'hf:x'}, none: {random_init_of: h}}\n",
                                            r"random_init_of='h', which must name a pre-trained variant"),
    "random init with overrides": ("tasks: [rte]\nvariants: {a: {}, none: {random_init_of: a, objective: bert}}\n",
                                   r"random encoders shaped like a, so its pre-training overrides \['objective'\] would be ignored"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_sweep_files_fail_with_one_clear_message(case, tmp_path):
    text, message = BAD[case]
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SweepError, match=message):
        load_sweep(path)


@pytest.mark.parametrize("override, message", [
    ("trainer.max_step: 5", r"\['trainer.max_step'\] are not keys of the pretrain config"),
    ("objective: electraa", "electraa"),
])
def test_misspelt_keys_and_options_fail_before_any_job(override, message, tmp_path, data_dir):
    path = tmp_path / "typo.yaml"
    path.write_text(f"tasks: [rte]\nvariants:\n  a: {{{override}}}\n")
    with pytest.raises(Exception, match=message):
        validate(context(path, None, tmp_path, data_dir))


def test_generated_configs_nest_dotted_keys_and_refuse_a_key_below_a_value():
    text = config_text({"objective": "bert", "trainer.max_steps": 5, "optim.lr": 1e-3, "run_name": "1e-3"},
                       {"sweep": {"name": "s"}, "trainer": {"export_fractions": [0.5]}}, "test")
    assert text.startswith("# @package _global_\n# test\n")
    assert OmegaConf.to_container(OmegaConf.create(text)) == {
        "defaults": [{"override /objective": "bert"}], "trainer": {"max_steps": 5, "export_fractions": [0.5]},
        "optim": {"lr": 1e-3}, "run_name": "1e-3", "sweep": {"name": "s"}}  # a float-like string stays a string
    with pytest.raises(SweepError, match=r"override trainer.max_steps.x sets a key below a plain value"):
        config_text({"trainer.max_steps": 5, "trainer.max_steps.x": 1}, {}, "test")


def test_unknown_sweep_lists_the_known_ones():
    with pytest.raises(SweepError, match=r"no sweep named 'table9'.*known sweeps: .*quick"):
        load_sweep("table9")


@pytest.mark.parametrize("value", ["/tmp/a-b/c.d", "sqlite:////x y/m.db", "it's", "true", "007", "a,b", "${x}", "a=b", " x", "f(1)", "[1]", 0.5, 3, None])
def test_quoted_values_parse_back_to_themselves(value):
    parsed = OverridesParser.create().parse_override(f"key={quote(value)}").value()
    assert parsed == value and type(parsed) is type(value)


def test_recorded_commands_paste_back_into_a_shell():
    import shlex

    cmd = [sys.executable, "-m", "electra_ablate.pretrain", "-m", "hydra.searchpath=['file:///tmp/a b/conf']",
           "+sweep_variant=electra,bert", "logger.tracking_uri='sqlite:////tmp/m.db'", "x=$HOME", 'q="x"']
    assert shlex.split(shell_join(cmd)) == cmd


# --- launchers and GPU placement ------------------------------------------------------------------------------


def test_launcher_overrides_are_handed_on():
    given = ["hydra/launcher=joblib_gpu", "hydra.launcher.n_jobs=4", "hydra.run.dir=/x", "+hydra.callbacks.x._target_=y",
             "hydra.job.chdir=true"]
    assert launcher_overrides(given) == ["hydra/launcher=joblib_gpu", "hydra.launcher.n_jobs=4", "+hydra.callbacks.x._target_=y"]


@pytest.mark.parametrize("preset, check", [
    ("joblib_gpu", lambda h: h.launcher._target_.endswith("JoblibLauncher") and h.callbacks.gpu_slot._target_ == "electra_ablate.sweep.gpus.GpuSlot"),
    ("slurm_gpu", lambda h: h.launcher._target_.endswith("SlurmLauncher") and h.launcher.gpus_per_node == 1),
    ("ray_gpu", lambda h: h.launcher.ray.remote.num_gpus == 1),
])
def test_launcher_presets_compose(preset, check):
    from hydra import compose, initialize_config_dir

    with fresh_hydra(), initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("pretrain", overrides=[f"hydra/launcher={preset}", "paths.root_dir=.", "paths.output_dir=."],
                      return_hydra_config=True)
    assert check(cfg.hydra)


def test_a_launcher_without_its_plugin_fails_before_any_job():
    import importlib.util

    if importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is not None:
        pytest.skip("the Ray launcher is installed here")
    with pytest.raises(SweepError, match=r"RayLauncher cannot be imported.*pip install"):
        check_launcher(["hydra/launcher=ray_gpu"])


def test_visible_gpus():
    assert visible_gpus("0,1, 3", "0\n1\n2\n3\n") == ["0", "1", "3"]  # CUDA_VISIBLE_DEVICES wins
    assert visible_gpus(None, "0\n1\n") == ["0", "1"]
    assert visible_gpus("", None) == [] and visible_gpus("-1", None) == []
    assert visible_gpus(None, None) == []


def test_gpu_candidates_spread_jobs_and_keep_a_bound_process_on_its_gpu():
    gpus = ["0", "1", "2", "3"]
    assert [gpu_candidates(gpus, k, None)[0] for k in range(6)] == ["0", "1", "2", "3", "0", "1"]
    assert gpu_candidates(gpus, 2, None) == ["2", "3", "0", "1"]  # any free GPU, own slot first
    assert gpu_candidates(gpus, 2, "1") == ["1"]  # CUDA already bound in this worker
    assert gpu_candidates([], 5, None) == []
    with pytest.raises(RuntimeError, match="bound to GPU 7"):
        gpu_candidates(gpus, 0, "7")


HOLDER = """
import sys, time, os
from pathlib import Path
from electra_ablate.sweep.gpus import GpuSlot
slot = GpuSlot(lock_dir=sys.argv[1], poll_s=0.05, gpus="a,b")
gpu = slot.acquire(int(sys.argv[2]))
print(gpu, os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
release = Path(sys.argv[1]) / f"release{sys.argv[2]}"
while not release.exists():
    time.sleep(0.05)
slot.release()
"""


def test_gpu_slots_never_share_a_gpu_between_concurrent_jobs(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def holder(job: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path), str(job)], stdout=subprocess.PIPE, text=True, env=env)

    first, second = holder(0), holder(2)  # job 2 prefers GPU a too (2 mod 2): only one of them gets it
    gpu_first, gpu_second = first.stdout.readline().split()[0], second.stdout.readline().split()[0]
    assert {gpu_first, gpu_second} == {"a", "b"}
    third = holder(1)
    time.sleep(0.5)
    assert third.poll() is None  # both GPUs busy: the third job waits
    (tmp_path / "release0").touch()
    first.wait(timeout=30)
    # It takes the GPU the first job freed, and CUDA_VISIBLE_DEVICES names only that one.
    assert third.stdout.readline().split() == [gpu_first, gpu_first]
    for job in (1, 2):
        (tmp_path / f"release{job}").touch()
    for p in (second, third):
        assert p.wait(timeout=30) == 0
    for p in (first, second, third):
        p.stdout.close()


def test_gpu_slot_does_nothing_without_gpus(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv(_ALL_GPUS_ENV, raising=False)
    assert GpuSlot(lock_dir=str(tmp_path)).acquire(0) is None
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


def test_cli_dry_run_prints_the_multiruns_with_the_launcher_handed_on(tmp_path, data_dir):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-m", "electra_ablate.sweep", "sweep=table1_small", "scale=tiny", "dry_run=true",
         f"paths.root_dir={tmp_path}", f"paths.data_dir={data_dir}", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
         "phases=[pretrain]"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if "electra_ablate.pretrain -m" in x)
    args = __import__("shlex").split(line)
    assert "+sweep_variant=electra,bert" in args and "seed=0" in args
    assert args[-3:-1] == ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    uri = next(a for a in args if a.startswith("logger.tracking_uri="))  # quoted only where Hydra needs it
    assert OverridesParser.create().parse_override(uri).value() == f"sqlite:///{tmp_path}/outputs/mlflow.db"
    generated = yaml.safe_load((tmp_path / "outputs/sweeps/table1_small/tiny/conf/sweep_variant/bert.yaml").read_text())
    assert generated["defaults"] == [{"override /model": "tiny"}, {"override /data": "wiki_sample"}, {"override /objective": "bert"}]
    assert generated["trainer"] == {"max_steps": 2624, "export_fractions": [0.0625, 0.125, 0.25, 0.5]}
    assert "pretrain: 2 job(s) launched" in done.stdout
    # What it would cost, from the committed step costs (reports/benchmarks_presets.json) and the jobs' FLOPs.
    assert re.search(r"^  pretrain: 2 job\(s\), about \d+\.\d core-hours$", done.stdout, re.MULTILINE), done.stdout
    assert re.search(r"^    bert: 1 job\(s\), 2,624 steps x \d+\.\d\d s = \d+\.\d core-hours \(", done.stdout,
                     re.MULTILINE), done.stdout


COSTED = """
name: costed
tasks: [sst2]
seeds: [0, 1]
checkpoints: [0.5, 1.0]
pretrain: {experiment: cpu_regime_30k, trainer.max_steps: 3000}
variants:
  bert: {objective: bert}
  atm: {objective: all_tokens_mlm}
  wide: {objective: bert, model.hidden_size: 256}
  none: {random_init_of: bert}
"""


def test_a_dry_run_prices_what_it_would_run_from_the_closest_timed_step(tmp_path, data_dir, monkeypatch):
    """Step costs as the bench writes them: BERT's step at the sweep's own shape timed at 10 s under load, and at
    2 s on a free core by the throughput section, so every timed second counts 0.2x. The BERT job resumes at step
    1,200; three SST-2 fine-tuning runs have finished (20, 30 and 100 s)."""
    import torch

    from electra_ablate.sweep import cost
    from electra_ablate.sweep import run as runner

    (tmp_path / "costed.yaml").write_text(COSTED)
    ctx = context(tmp_path / "costed.yaml", None, tmp_path, data_dir)
    bert, atm = (ctx.compose_pretrain(PretrainJob(v, 0)) for v in ("bert", "atm"))
    vocab = cost.vocab_size(bert)
    flops = {name: config_step_flops(cfg, vocab)["joint"] for name, cfg in (("bert", bert), ("atm", atm))}
    row = {"objective": "bert", "vocab": vocab, "batch": [128, 128], "flops": flops["bert"],
           "model": {k: int(bert.model[k]) for k in MODEL_KEYS}, "heads": {"main": "mlm", "generator": False},
           "precision": "bf16-mixed", "attention": "math", "threads": 1}
    reports = tmp_path / "reports"
    reports.mkdir()
    machine = {"cpu": "AMD EPYC", "cores": 2, "date": "2026-11-27 11:19 UTC", "load_start": [12.0, 12.0, 12.0]}
    (reports / cost.PRESETS_JSON).write_text(json.dumps({**machine, "rows": [
        {"kind": "preset", "preset": "cpu_regime_30k", "overrides": [], "step_s": 10.0, **row}]}))
    (reports / cost.THROUGHPUT_JSON).write_text(json.dumps({**machine, "rows": [
        {"kind": "attention", "experiment": "cpu_regime_30k", "step_s": 2.0, **row}]}))
    monkeypatch.setattr(cost, "REPORTS", reports)

    client = tracking.setup(ctx.tracking_uri, ctx.experiment)
    exp = client.get_experiment_by_name(ctx.experiment).experiment_id
    store = tmp_path / "store"
    (store / "checkpoints").mkdir(parents=True)
    torch.save({"global_step": 1200, "state_dict": {}}, store / "checkpoints" / "last.ckpt")
    client.create_run(exp, tags={"kind": "pretrain", "config_hash": tracking.identity_hashes(bert)[0],
                                 "store": str(store)})
    for seconds in (20, 30, 100):
        ran = client.create_run(exp, start_time=1_000_000, tags={"kind": "finetune", "task": "sst2", "seed": "0"})
        client.set_terminated(ran.info.run_id, "FINISHED", end_time=1_000_000 + 1000 * seconds)

    text = runner.run_sweep(ctx, phases=["pretrain", "finetune"], dry_run=True).cost
    ratio = flops["atm"] / flops["bert"]
    pretrain_h = (1800 * 2.0 + 3000 * 2.0 * ratio) / 3600
    assert f"  pretrain: 3 job(s), about {pretrain_h:.1f} core-hours for 2 of them" in text, text
    # 1,800 steps left of 3,000, at the timed step's free-core seconds.
    bert_line = "    bert: 1 job(s), 1,800 steps left of 3,000 x 2.00 s = 1.0 core-hours (cpu_regime_30k bert, timed)"
    assert bert_line in text, text
    assert (f"    atm: 1 job(s), 3,000 steps x {2 * ratio:.2f} s = {3000 * 2 * ratio / 3600:.1f} core-hours "
            f"(cpu_regime_30k bert's seconds per FLOP x {ratio:.2f}x its FLOPs per step; no all_tokens_mlm step was "
            "timed)") in text, text
    assert "    wide: 1 job(s), 3,000 steps: no measured step cost for model tiny (256 wide, 4 layers)" in text
    # Fine-tuning: the checkpoints at 1/2 and the end of the 3 runs, and random init shaped like bert's, x 2 seeds.
    assert ("    sst2: 14 job(s), 14 of them of checkpoints pre-training has still to save x 30 s = 0.1 core-hours "
            "(the median of 3 finished sst2 run(s) in MLflow experiment costed)") in text, text
    assert "step costs: reports/benchmarks_presets.json (AMD EPYC, one thread, 2026-11-27 11:19 UTC, load 12.0" in text
    assert "its seconds x 0.200: the free-core steps of reports/benchmarks_throughput.json" in text
    total = f"  total: about {pretrain_h + 14 * 30 / 3600:.1f} core-hours for 16 of 17 job(s); the other 1 have no "
    assert total + "measured cost (above)" in text


def test_a_dry_run_without_step_costs_says_how_to_measure_them(tmp_path, data_dir, monkeypatch):
    from electra_ablate.sweep import cost

    monkeypatch.setattr(cost, "REPORTS", tmp_path)
    ctx = context("quick", "tiny", tmp_path, data_dir)
    cfg = ctx.compose_pretrain(PretrainJob("bert", 0))
    assert cost.price_pretrain(cfg, cost.load_step_costs()) == (
        None, f"no measured step cost: no reports/benchmarks_presets.json ({cost.BENCH_COMMAND} writes it)")
    monkeypatch.setattr(cost.precision, "on_gpu", lambda cfg: True)
    assert cost.price_pretrain(cfg, cost.StepCosts([], []))[1] == (
        "no measured step cost for a GPU step (the bench timed CPU presets)")


def test_a_sweep_whose_multirun_failed_exits_non_zero_and_records_why(tmp_path, data_dir, monkeypatch):
    from electra_ablate.sweep import run as runner

    ctx = context("table1_small", "tiny", tmp_path, data_dir)
    monkeypatch.setattr(runner, "launch", lambda cmd, dry_run, watch=None: 1)  # a job failed or could not run
    result = runner.run_sweep(ctx, phases=["pretrain"])
    assert "the pretrain multirun exited with 1" in result.failure
    client = tracking.setup(ctx.tracking_uri, ctx.experiment)
    (record,) = client.search_runs([client.get_experiment_by_name(ctx.experiment).experiment_id],
                                   filter_string="tags.kind = 'sweep'")
    assert record.info.status == "FAILED" and "pretrain multirun exited with 1" in record.data.tags["end_reason"]
    # A job that a scheduler stopped (its multirun exits 143): the sweep fails and says so.
    monkeypatch.setattr(runner, "launch", lambda cmd, dry_run, watch=None: 143)
    assert "the pretrain multirun exited with 143 (a job was stopped by SIGTERM)" in runner.run_sweep(
        ctx, phases=["pretrain"]).failure
    monkeypatch.setattr(runner, "launch", lambda cmd, dry_run, watch=None: 0)
    assert runner.run_sweep(ctx, phases=["pretrain"]).failure is None


RUNNER = """
import sys
from electra_ablate.sweep.launch import launch
child = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
launch([sys.executable, "-c", child, sys.argv[1]], dry_run=False)
"""


def test_stopping_the_runner_stops_its_multirun(tmp_path):
    import signal

    pid_file = tmp_path / "child.pid"
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(pid_file)], env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.time() + 60
    while not (pid_file.is_file() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    child = int(pid_file.read_text())
    runner.send_signal(signal.SIGTERM)
    runner.wait(timeout=60)
    for _ in range(100):  # the child is terminated (and reaped by the runner) before the runner exits
        if not alive(child):
            break
        time.sleep(0.1)
    assert not alive(child)


def alive(pid: int) -> bool:
    """Process `pid` exists, even ended but not yet reaped (its parent has not waited for it)."""
    import psutil

    return psutil.pid_exists(pid)


# A multirun whose worker (a process of its own command line, as joblib's loky workers) ignores SIGTERM: the
# runner must not leave it behind when it is stopped.
ORPHANING_RUNNER = """
import sys
from electra_ablate.sweep import launch
launch.STOP_GRACE_S = 2.0
worker = "import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
child = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {worker!r}, sys.argv[1]]); time.sleep(120)"
launch.launch([sys.executable, "-c", child, sys.argv[1]], dry_run=False)
"""


def test_stopping_the_runner_ends_every_process_of_its_multirun(tmp_path):
    import signal

    pid_file = tmp_path / "worker.pid"
    runner = subprocess.Popen([sys.executable, "-c", ORPHANING_RUNNER, str(pid_file)],
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.time() + 60
    while not (pid_file.is_file() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    worker = int(pid_file.read_text())
    runner.send_signal(signal.SIGINT)
    runner.wait(timeout=180)  # margin for a loaded machine: the stop itself takes about 2 s
    for _ in range(100):
        if not alive(worker):
            break
        time.sleep(0.1)
    left = alive(worker)
    if left:
        os.kill(worker, signal.SIGKILL)
    assert not left, "the multirun's worker outlived the stopped runner"


# --- end to end ---------------------------------------------------------------------------------------------

MINI = REPO / "tests" / "fixtures" / "mini_sweep.yaml"


def write_mini(path: Path, variants: dict | None = None, **settings) -> Path:
    """tests/fixtures/mini_sweep.yaml with top-level `settings` replaced and `variants` added, written to `path`."""
    spec = yaml.safe_load(MINI.read_text())
    spec.update(settings)
    spec["variants"].update(variants or {})
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# A variant whose every job fails inside training, after its MLflow run started: a NaN loss weight makes the
# loss diverge at the first step.
# Passes every check before launch (a NaN loss weight no longer does) and diverges at step 2: a FAILED run.
BROKEN = {"broken": {"objective": "bert", "optim.lr": 1.0e12, "optim.warmup_steps": 0, "optim.max_grad_norm": 1.0e30}}


def run_cli(tmp_path: Path, data_dir: Path, cache: Path, sweep_file: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-m", "electra_ablate.sweep", f"sweep={sweep_file}", f"paths.root_dir={tmp_path}",
           f"paths.data_dir={data_dir}", f"paths.cache_dir={cache}", f"report_dir={tmp_path}/reports", *extra]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def kinds(uri: str, experiment: str) -> dict[str, list]:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    out: dict[str, list] = {}
    for r in client.search_runs([exp.experiment_id], max_results=1000):
        out.setdefault(r.data.tags.get("kind"), []).append(r)
    return out


@pytest.mark.slow
def test_a_variant_with_fewer_pretraining_seeds_runs_only_those_in_the_multirun(tmp_path, data_dir, token_cache):
    path = write_mini(tmp_path / "mini.yaml", {"long": {"objective": "bert", "optim.lr": 1.0e-4, "pretrain_seeds": [1]}})
    out = run_cli(tmp_path, data_dir, token_cache, path, "phases=[pretrain]").stdout
    assert "pretrain: 5 job(s) launched" in out
    # The multirun's command line is in the sweep's log file (the console shows progress, not override lines).
    logs = "".join(f.read_text() for f in (tmp_path / "outputs" / "runs").rglob("*.log"))
    (line,) = [x for x in logs.splitlines() if "launching:" in x and "electra_ablate.pretrain -m" in x]
    assert "electra_ablate.pretrain -m" not in out
    assert " seed=0,1 +sweep_variant=electra,bert,long " in line  # one product, seed-major
    pre = {(r.data.tags["variant"], r.data.tags["seed"]): r.info.status
           for r in kinds(f"sqlite:///{tmp_path}/outputs/mlflow.db", "mini")["pretrain"]}
    assert pre == {(v, s): "FINISHED" for v in ("electra", "bert") for s in ("0", "1")} | {("long", "1"): "FINISHED"}


@pytest.mark.slow
def test_a_running_sweep_shows_its_jobs_step_total_and_time_left(tmp_path, data_dir, token_cache, monkeypatch):
    """A pre-training long enough for a few progress lines at an interval shortened to 1 s (default 60 s)."""
    monkeypatch.setenv("ELECTRA_ABLATE_PROGRESS_EVERY_S", "1")
    path = write_mini(tmp_path / "mini.yaml", name="miniprogress", pretrain_seeds=[0])
    spec = yaml.safe_load(path.read_text())
    spec["pretrain"]["trainer.max_steps"] = 600
    spec["variants"], spec["baseline"] = {"bert": {"objective": "bert"}}, "bert"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = run_cli(tmp_path, data_dir, token_cache, path, "phases=[pretrain]").stdout
    lines = [x for x in out.splitlines() if x.startswith("  pretrain running: ")]
    assert any(re.search(r"running: \S+ \d{1,3}/600 \(\d+%\), (\d+ min )?\d+ s left$", x) for x in lines), out
    (log,) = (tmp_path / "outputs").rglob("multirun/*_pretrain/console.log")
    text = log.read_text()
    assert [x for x in text.splitlines() if x.startswith("  pretrain running: ")] == lines
    # At most one progress line a (shortened) minute: the phase's own elapsed time bounds them.
    seconds = json.loads(kinds(f"sqlite:///{tmp_path}/outputs/mlflow.db", "miniprogress")["sweep"][0]
                         .data.tags["phase.pretrain"])["seconds"]
    assert 1 <= len(lines) <= seconds / 1.0 + 1, (len(lines), seconds)


@pytest.mark.slow
def test_miniature_sweep_end_to_end_with_the_basic_launcher(tmp_path, data_dir, token_cache):
    path = tmp_path / "mini.yaml"
    write_mini(path, BROKEN)
    uri = f"sqlite:///{tmp_path}/outputs/mlflow.db"
    out = run_cli(tmp_path, data_dir, token_cache, path).stdout
    assert "pretrain: 6 job(s) launched" in out and "finetune: 8 job(s) launched" in out

    runs = kinds(uri, "mini")
    pre = {(r.data.tags["variant"], r.data.tags["seed"]): r.info.status for r in runs["pretrain"]}
    assert pre == {("electra", "0"): "FINISHED", ("electra", "1"): "FINISHED", ("bert", "0"): "FINISHED",
                   ("bert", "1"): "FINISHED", ("broken", "0"): "FAILED", ("broken", "1"): "FAILED"}
    ft = runs["finetune"]
    assert len(ft) == 8 and all(r.info.status == "FINISHED" for r in ft)
    parents = {r.info.run_id for r in runs["pretrain"]}
    assert all(r.data.tags["mlflow.parentRunId"] in parents and r.data.tags["variant"] in ("electra", "bert") for r in ft)

    # The report: medians equal the stored runs', the failed jobs are listed.
    text = (tmp_path / "reports" / "mini.md").read_text()
    for variant in ("electra", "bert"):
        scores = sorted(r.data.metrics["final/score"] for r in ft if r.data.tags["variant"] == variant)
        median = (scores[1] + scores[2]) / 2  # 4 runs: 2 pre-training x 2 fine-tuning seeds
        row = next(line for line in text.splitlines() if line.startswith(f"| {variant} ("))
        assert row.split("|")[2].strip() == f"{median:.1f}", row
    assert "pre-training broken seed 0" in text and "FAILED" in text
    assert "## How this was produced" in text and "electra_ablate.pretrain -m" in text

    # Again: nothing is launched, nothing new is written.
    out = run_cli(tmp_path, data_dir, token_cache, path).stdout
    assert "pretrain: 2 job(s) launched" in out  # the broken variant is retried...
    again = kinds(uri, "mini")
    # ...in its own run (one run per identity) and fails again; the rest is skipped.
    assert len(again["pretrain"]) == 6 and len(again["finetune"]) == 8
    assert sorted(r.data.tags["attempts"] for r in again["pretrain"] if r.data.tags["variant"] == "broken") == ["2", "2"]
    assert {r.info.run_id for r in again["finetune"]} == {r.info.run_id for r in ft}


@pytest.mark.slow
def test_miniature_sweep_with_the_joblib_launcher(tmp_path, data_dir, token_cache):
    path = tmp_path / "mini.yaml"
    # With a no-pre-training arm: random encoders shaped like each electra run (one group per pre-training seed).
    write_mini(path, {"none": {"random_init_of": "electra"}}, name="minijob", seeds=[0])
    uri = f"sqlite:///{tmp_path}/outputs/mlflow.db"
    out = run_cli(tmp_path, data_dir, token_cache, path, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2").stdout
    assert "pretrain: 4 job(s) launched" in out and "finetune: 6 job(s) launched" in out
    runs = kinds(uri, "minijob")
    assert sorted(r.info.status for r in runs["pretrain"]) == ["FINISHED"] * 4
    assert sorted(r.info.status for r in runs["finetune"]) == ["FINISHED"] * 6
    electra = {r.info.run_id for r in runs["pretrain"] if r.data.tags["variant"] == "electra"}
    none = [r for r in runs["finetune"] if r.data.tags["variant"] == "none"]
    assert len(none) == 2 and all(r.data.tags["random_init"] == "true" and "mlflow.parentRunId" not in r.data.tags
                                  for r in none)
    assert {r.data.tags["pretrain_run_id"] for r in none} == electra
    assert len({r.data.metrics["final/score"] for r in none} | {r.data.tags["config_hash"] for r in none}) >= 2
    sweeps = runs["sweep"]
    assert sweeps[0].data.tags["launcher"] == "hydra/launcher=joblib hydra.launcher.n_jobs=2"
    phase = json.loads(sweeps[0].data.tags["phase.pretrain"])
    assert "hydra/launcher=joblib" in phase["command"] and phase["returncode"] == 0
    assert (tmp_path / "reports" / "minijob.md").is_file()
    # Nothing left to do: a second run launches nothing at all.
    out = run_cli(tmp_path, data_dir, token_cache, path, "hydra/launcher=joblib").stdout
    assert "pretrain: 0 job(s) launched" in out and "finetune: 0 job(s) launched" in out
    assert len(kinds(uri, "minijob")["pretrain"]) == 4


def test_the_sweep_config_hands_the_runner_the_report():
    """The report finds runs through the sweep's spec and plan, so the runner never imports it
    (tests/test_architecture.py rejects the cycle): conf/sweep.yaml names the writer the report phase calls."""
    from electra_ablate.report.build import write_report
    from electra_ablate.sweep.run import ReportWriter

    writer = instantiate(OmegaConf.load(CONF_DIR / "sweep.yaml").report_writer)
    assert writer.func is write_report
    # Called as run_sweep calls it, with the arguments ReportWriter promises.
    inspect.signature(writer).bind(None, None, Path("reports"), running_sweep_run="id", running_wall_time=1.0)
    assert list(inspect.signature(writer).parameters) == list(inspect.signature(ReportWriter.__call__).parameters)[1:]


def test_a_finished_fine_tuning_run_counts_only_for_the_config_it_ran_with():
    from types import SimpleNamespace

    from electra_ablate.sweep.plan import matches

    def run(config_hash):
        return SimpleNamespace(data=SimpleNamespace(tags={"config_hash": config_hash}))

    key = FinetuneKey("0" * 32, "100", "sst2", 0)
    old, new = run("a" * 16), run("b" * 16)
    done = {key: [old]}  # newest first
    assert matches(done, key) is old  # no config to compare: any finished run of the job
    assert matches(done, key, "b" * 16) is None  # e.g. the fine-tuning optimizer's defaults changed: run it again
    assert matches({key: [new, old]}, key, "a" * 16) is old


def test_a_key_leaves_out_the_step_of_an_import_and_of_a_random_init_arm():
    from electra_ablate.sweep.plan import finetune_key, key_of

    imported = Checkpoint("released", None, None, None, True, None)
    tags = {"seed": "0", "task": "sst2", "pretrain_run_id": "none", "variant": "released", "pretrained_step": "7"}
    assert finetune_key(tags) == key_of(imported, "sst2", 0)  # an import's step is whatever the import reports
    run = "a" * 32
    early = Checkpoint("none", 0, run, 50, False, 0.5, random_init=True)
    tags = {"seed": "0", "task": "sst2", "pretrain_run_id": run, "random_init": "true", "pretrained_step": "100"}
    assert finetune_key(tags) == key_of(early, "sst2", 0)  # random weights: any checkpoint of the run, one job
    trained = {**tags, "random_init": "false"}
    assert finetune_key(trained) != key_of(early._replace(random_init=False), "sst2", 0)  # a checkpoint's own step
    assert finetune_key(trained) == key_of(early._replace(random_init=False, step=100), "sst2", 0)


def test_a_random_init_arm_takes_its_run_s_final_checkpoint_else_its_first_saved_one():
    from electra_ablate.sweep.plan import random_init_checkpoints

    spec = SimpleNamespace(variants=[SimpleNamespace(label="bert", random_init_of=None),
                                     SimpleNamespace(label="none", random_init_of="bert")])
    going = [Checkpoint("bert", 0, "a" * 32, step, False, step / 400) for step in (200, 50, 100)]
    done = [Checkpoint("bert", 1, "b" * 32, 50, False, 0.125), Checkpoint("bert", 1, "b" * 32, 400, True, 1.0)]
    other = [Checkpoint("electra", 0, "c" * 32, 25, False, 0.125)]
    picked = {c.run_id: c for c in random_init_checkpoints(spec, going + done + other)}
    assert set(picked) == {"a" * 32, "b" * 32}
    assert (picked["a" * 32].step, picked["a" * 32].final) == (50, False)  # still going: its first checkpoint
    assert (picked["b" * 32].step, picked["b" * 32].final) == (400, True)  # finished: its final one, as before
    assert all(c.variant == "none" and c.random_init and c.arm_final for c in picked.values())


def test_the_cpu_regime_sweep_uses_the_named_presets_at_equal_compute(tmp_path, data_dir):
    ctx = context("cpu_regime", "tiny", tmp_path, data_dir)
    electra, bert = (ctx.compose_pretrain(PretrainJob(v, 0)) for v in ("electra", "bert"))
    assert budget(bert) == pytest.approx(budget(electra), rel=0.01)  # the paper's FLOPs accounting
    assert encoder(bert) == encoder(electra) and electra.data == bert.data
    for cfg in (electra, bert):
        assert (cfg.preset, cfg.model.layer_norm, cfg.model.hidden_dropout_prob) == ("cpu_regime", "pre", 0.0)
        assert list(cfg.trainer.export_fractions) == [0.125, 0.25, 0.5]  # the curve's checkpoints
    assert bert.trainer.max_steps == 6000
    assert ctx.spec.variant("none").random_init_of == "bert"
    ckpt = Checkpoint("bert", 0, "0" * 32, 1, True, 1.0)
    ctx.write_finetune_config(ckpt)
    ft = ctx.compose_finetune([ctx.searchpath, f"+sweep_checkpoint={ckpt.config_name}", "task=sst2"])
    assert (ft.preset, ft.pooling, ft.dropout.hidden) == ("cpu_regime", "mean", 0.0)
    assert ft.glue_data.max_train_examples == 4000
    spec = load_sweep("cpu_regime")
    assert len(spec.pretrain_seeds) >= 3 and len(spec.seeds) >= 5


def test_the_30k_preset_sweep_compares_at_equal_compute_on_every_local_glue_task(tmp_path, data_dir):
    ctx = context("cpu_regime_30k", "tiny", tmp_path, data_dir)
    cfgs = {v: ctx.compose_pretrain(PretrainJob(v, 0)) for v in ("bert", "electra")}
    bert = cfgs["bert"]
    assert (bert.data.train_vocab_size, bert.data.max_seq_length, bert.trainer.max_steps) == (0, 128, 3000)
    assert bert.data.batch_size * bert.data.max_seq_length * bert.trainer.max_steps == 49_152_000  # cpu_regime's
    for label, cfg in cfgs.items():
        assert (cfg.preset, cfg.model.layer_norm, cfg.model.hidden_dropout_prob) == ("cpu_regime_30k", "pre", 0.0)
        assert encoder(cfg) == encoder(bert) and cfg.data == bert.data, label
        # Still saved where the SST-2 learning curve read them: the runs keep their identity.
        assert list(cfg.trainer.export_fractions) == [0.125, 0.25, 0.5], label
        assert cfg.trainer.max_steps % 8 == 0, label
    assert budget(cfgs["electra"]) == pytest.approx(budget(bert), rel=0.01)  # the paper's FLOPs accounting
    assert cfgs["electra"].optim.lr == 5e-4 and bert.optim.lr == 2e-3
    assert sorted(ctx.pretrain_jobs()) == sorted(PretrainJob(v, s) for v in ("bert", "electra") for s in (0, 1, 2))
    assert ctx.spec.variant("none").random_init_of == "bert" and len(ctx.spec.seeds) >= 5
    assert ctx.spec.tasks == ("cola", "sst2", "mrpc", "stsb", "rte") and ctx.spec.checkpoints == (1.0,)
    ckpt = Checkpoint("bert", 0, "0" * 32, 1, True, 1.0)
    ctx.write_finetune_config(ckpt)
    ft = ctx.compose_finetune([ctx.searchpath, f"+sweep_checkpoint={ckpt.config_name}", "task=sst2"])
    assert (ft.preset, ft.pooling, ft.dropout.hidden, ft.glue_data.max_seq_length) == ("cpu_glue", "mean", 0.0, 128)
    # The recipe's own settings per task (docs/presets.md, "`recipe=cpu_glue`"): SST-2 cut to 8,000 labels.
    from electra_ablate.finetuning import run as finetuning
    (task, task_cfg), = finetuning.selected_tasks(ft)
    assert finetuning.for_task(ft, task.name, task_cfg)[0].glue_data.max_train_examples == 8000
    assert ft.glue_data.max_train_examples is None


def test_the_long_sweep_is_the_30k_encoder_on_the_whole_slice_at_equal_compute(tmp_path, data_dir):
    ctx = context("cpu_long", "tiny", tmp_path, data_dir)
    regime = context("cpu_regime_30k", "tiny", tmp_path / "cr", data_dir).compose_pretrain(PretrainJob("bert", 0))
    bert, electra = (ctx.compose_pretrain(PretrainJob(v, 0)) for v in ("bert", "electra"))
    assert encoder(bert) == encoder(electra) == encoder(regime) and bert.data.max_docs is None
    assert bert.data.batch_size * bert.data.max_seq_length * bert.trainer.max_steps >= 250_000_000
    assert budget(electra) == pytest.approx(budget(bert), rel=0.01)
    assert (bert.optim.lr, electra.optim.lr) == (2e-3, 5e-4) and bert.optim.warmup_steps == electra.optim.warmup_steps
    for cfg in (bert, electra):  # every fraction down to 1/32 is a whole step
        assert all(float(f * cfg.trainer.max_steps).is_integer() for f in ctx.spec.checkpoints)
    assert sorted(ctx.pretrain_jobs()) == [PretrainJob("bert", 0), PretrainJob("electra", 0)]
    assert ctx.spec.tasks == ("cola", "sst2", "mrpc", "stsb", "rte") and ctx.spec.paper == "table1_small"


# The ablation sweeps at the 30k preset: which arms must match which budget, and the runs they reuse.
AT_30K = {"table5_efficiency": ("bert", {"bert": "bert", "electra": "electra"}),
          "weight_sharing": ("bert", {}),
          "generator_size": (None, {"d128-g1_4": "electra"}),  # equal steps, as the paper's Figure 3
          "training_algorithms": ("joint", {"joint": "electra"})}


@pytest.mark.parametrize("name", sorted(AT_30K))
def test_the_ablation_sweeps_run_on_the_30k_preset_and_reuse_its_runs(name, tmp_path, data_dir):
    from electra_ablate.tracking.identity import config_hash

    ctx = context(name, "cpu_30k", tmp_path / "s", data_dir)
    regime = context("cpu_regime_30k", "tiny", tmp_path / "cr", data_dir)
    assert ctx.experiment == "cpu_regime_30k" and ctx.spec.report_name == f"{name}_cpu_30k"
    reference, reused = AT_30K[name]
    bert = regime.compose_pretrain(PretrainJob("bert", 0))
    cfgs = {v.label: ctx.compose_pretrain(PretrainJob(v.label, 0)) for v in ctx.spec.pretrained_variants}
    target = budget(regime.compose_pretrain(PretrainJob("bert", 0)) if reference == "bert" else cfgs[reference]) \
        if reference else None
    for label, cfg in cfgs.items():
        assert cfg.preset == "cpu_regime_30k" and encoder(cfg) == encoder(bert) and cfg.data == bert.data, label
        assert cfg.trainer.max_steps % 8 == 0, label
        if target is not None:
            assert budget(cfg) == pytest.approx(target, rel=0.01), label
    if reference is None:
        assert {cfg.trainer.max_steps for cfg in cfgs.values()} == {1832}
    for label, theirs in reused.items():  # the same runs: found, not re-run
        assert config_hash(cfgs[label]) == config_hash(regime.compose_pretrain(PretrainJob(theirs, 0))), label
    assert any(v.random_init_of for v in ctx.spec.variants)  # the random-init floor
    assert len(ctx.spec.pretrain_seeds) >= 2 and len(ctx.spec.seeds) >= 5


def test_a_variant_may_run_a_subset_of_the_pretraining_seeds(tmp_path, data_dir):
    path = tmp_path / "s.yaml"
    body = ("tasks: [rte]\npretrain_seeds: [0, 1]\npretrain: {model: tiny, trainer.max_steps: 2}\n"
            "variants:\n  a: {objective: bert}\n  b: {objective: bert, trainer.max_steps: 4, pretrain_seeds: %s}\n")
    path.write_text(body % "[1]")
    spec = load_sweep(str(path))
    assert (spec.variant("a").pretrain_seeds, spec.variant("b").pretrain_seeds) == (None, (1,))
    assert "pretrain_seeds" not in spec.variant("b").pretrain  # not a pre-training override
    ctx = context(str(path), None, tmp_path / "c", data_dir)
    assert ctx.pretrain_jobs() == [PretrainJob("a", 0), PretrainJob("a", 1), PretrainJob("b", 1)]
    ctx.write_pretrain_configs()
    cfg = ctx.compose_pretrain(PretrainJob("b", 1))
    assert list(cfg.sweep.seeds) == [1] and ctx.compose_pretrain(PretrainJob("a", 0)).sweep.seeds is None
    path.write_text(body % "[2]")
    with pytest.raises(SweepError, match=r"variant b has pretrain_seeds=\[2\], which must be a non-empty subset"):
        load_sweep(str(path))


def test_table5_at_cpu_scale_reuses_the_cpu_regime_runs_and_matches_their_compute(tmp_path, data_dir):
    from electra_ablate.tracking.identity import config_hash

    table5 = context("table5_efficiency", "cpu", tmp_path / "t5", data_dir)
    regime = context("cpu_regime", "tiny", tmp_path / "cr", data_dir)
    assert table5.experiment == regime.experiment == "cpu_regime"  # one MLflow experiment: runs found by identity
    cfgs = {v.label: table5.compose_pretrain(PretrainJob(v.label, 0)) for v in table5.spec.pretrained_variants}
    for label in ("bert", "electra"):
        assert config_hash(cfgs[label]) == config_hash(regime.compose_pretrain(PretrainJob(label, 0))), label
    assert table5.spec.variant("none").random_init_of == "bert"
    bert = cfgs["bert"]
    for label, cfg in cfgs.items():
        assert budget(cfg) == pytest.approx(budget(bert), rel=0.01), label  # equal pre-training FLOPs
        assert cfg.preset == "cpu_regime" and encoder(cfg) == encoder(bert) and cfg.data == bert.data, label
        assert cfg.trainer.max_steps % 8 == 0, label  # every exported fraction falls on a whole step
    assert {label: cfg.optim.lr for label, cfg in cfgs.items()} == {
        "electra": 5e-4, "electra_15": 5e-4, "bert": 2e-3, "replace_mlm": 2e-3, "all_tokens_mlm": 2e-3}
    assert len(table5.spec.pretrain_seeds) >= 3 and len(table5.spec.seeds) >= 5


def test_a_sweep_names_its_mlflow_experiment(tmp_path):
    plain = tmp_path / "plain.yaml"
    plain.write_text("tasks: [sst2]\nvariants:\n  bert: {objective: bert}\n")
    assert load_sweep(str(plain)).experiment == "plain"
    shared = tmp_path / "shared.yaml"
    shared.write_text("experiment: elsewhere\ntasks: [sst2]\nvariants:\n  bert: {objective: bert}\n")
    assert load_sweep(str(shared)).experiment == "elsewhere" and load_sweep(str(shared)).name == "shared"
    shared.write_text("experiment: 'a b'\ntasks: [sst2]\nvariants:\n  bert: {objective: bert}\n")
    with pytest.raises(SweepError, match="experiment='a b' must be letters"):
        load_sweep(str(shared))


@pytest.mark.parametrize("name, reused", [("training_algorithms", {"joint": "electra"}),
                                          ("weight_sharing", {})])
def test_the_cpu_scales_spend_cpu_regime_bert_flops_on_its_presets(name, reused, tmp_path, data_dir):
    from electra_ablate.tracking.identity import config_hash

    ctx = context(name, "cpu", tmp_path / "s", data_dir)
    regime = context("cpu_regime", "tiny", tmp_path / "cr", data_dir)
    assert ctx.experiment == "cpu_regime"
    bert = regime.compose_pretrain(PretrainJob("bert", 0))
    cfgs = {v.label: ctx.compose_pretrain(PretrainJob(v.label, 0)) for v in ctx.spec.pretrained_variants}
    for label, cfg in cfgs.items():
        assert budget(cfg) == pytest.approx(budget(bert), rel=0.01), label  # BERT's 49.2M-token budget
        assert cfg.preset == "cpu_regime" and encoder(cfg) == encoder(bert) and cfg.data == bert.data, label
        assert cfg.trainer.max_steps % 8 == 0, label
        assert cfg.optim.lr == (2e-3 if cfg.objective.name == "bert" else 5e-4), label
    for label, theirs in reused.items():  # the same runs: found, not re-run
        assert config_hash(cfgs[label]) == config_hash(regime.compose_pretrain(PretrainJob(theirs, 0))), label
    assert any(v.random_init_of for v in ctx.spec.variants)  # the random-init floor
    assert len(ctx.spec.pretrain_seeds) >= 2 and len(ctx.spec.seeds) >= 5


def test_generator_size_at_cpu_scale_drops_options_and_reuses_the_cpu_regime_electra(tmp_path, data_dir):
    from electra_ablate.tracking.identity import config_hash

    ctx = context("generator_size", "cpu", tmp_path / "g", data_dir)
    labels = [v.label for v in ctx.spec.variants]
    assert labels == ["d128-g1_8", "d128-g1_4", "d128-g1", "d128-unigram", "random_init"]  # g1_2, g3_4: null drop them
    assert ctx.spec.variant("random_init").random_init_of == "d128-g1_4" and not ctx.spec.variant("random_init").axes
    tiny = [v.label for v in load_sweep("generator_size", "tiny").variants]
    assert "d128-g1_2" in tiny and "d128-g3_4" in tiny  # elsewhere kept
    regime = context("cpu_regime", "tiny", tmp_path / "cr", data_dir)
    electra = regime.compose_pretrain(PretrainJob("electra", 0))
    assert config_hash(ctx.compose_pretrain(PretrainJob("d128-g1_4", 0))) == config_hash(electra)
    for label in labels[:-1]:
        cfg = ctx.compose_pretrain(PretrainJob(label, 0))
        assert (cfg.preset, cfg.trainer.max_steps, cfg.optim.lr) == ("cpu_regime", 4944, 5e-4), label
        assert encoder(cfg) == encoder(electra) and cfg.data == electra.data, label
    assert ctx.experiment == "cpu_regime" and len(ctx.spec.pretrain_seeds) >= 2 and len(ctx.spec.seeds) >= 5


def test_a_scale_drops_a_variant_with_null(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("tasks: [rte]\nvariants: {a: {}, b: {objective: bert}}\ndefault_scale: t\n"
                    "scales: {t: {variants: {b: null}}, u: {}}\n")
    assert [v.label for v in load_sweep(str(path)).variants] == ["a"]
    assert [v.label for v in load_sweep(str(path), "u").variants] == ["a", "b"]
    algorithms = load_sweep("training_algorithms", "cpu")
    assert [v.label for v in algorithms.variants] == ["joint", "two_stage", "adversarial", "none"]  # the paper's arms
    assert algorithms.variant("none").random_init_of == "joint"
    assert "learned_lambda" in [v.label for v in load_sweep("training_algorithms", "tiny").variants]
    assert set(algorithms.pretrain_seeds) <= set(load_sweep("cpu_regime").pretrain_seeds)  # joint reused
    assert len(algorithms.pretrain_seeds) >= 2
