"""Results bundles (electra_ablate/results/): a sweep's runs exported from its store into plain files, imported into
another store under the ids they were made under, and rendered into the same report; runs already there skipped,
a conflicting run refused with nothing written, and every bad input refused in one line."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import platform
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from electra_ablate.report.build import write_report
from electra_ablate.results import bundle as files
from electra_ablate.results.bundle import BundleError
from electra_ablate.results.export import export, placeholders
from electra_ablate.results.importing import import_bundle
from electra_ablate.sweep import compose
from electra_ablate.sweep.jobs import Checkpoint, PretrainJob
from electra_ablate.sweep.plan import finetune_hashes, finetune_plan, missing_exports, pretrain_states, under_recipes
from electra_ablate.sweep.provenance import process
from electra_ablate.tracking import runs as tracking
from test_recipes import TWO_RECIPES

SWEEP = TWO_RECIPES  # two arms, CoLA and STS-B, 3 seeds, under cpu_glue and paper_glue
SCORES = {"electra": {"cola": [10, 11, 12], "stsb": [60, 61, 62]}, "bert": {"cola": [12, 13, 14], "stsb": [30, 31, 32]}}
DATED = re.compile(r"^Sweep `mini`.*do not edit by hand\.$", re.M)


def context(folder: Path, data_dir: Path) -> compose.SweepContext:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mini.yaml").write_text(SWEEP)
    store = folder / "store"
    paths = {"root_dir": str(folder), "data_dir": str(data_dir), "output_root": str(store),
             "cache_dir": str(store / "cache")}
    return compose.make_context(folder / "mini.yaml", None, paths, f"sqlite:///{store}/mlflow.db")


def _predictions(folder: Path, task: str, seed: int, score: float) -> Path:
    gold = np.random.default_rng(len(task))  # one dev set per task
    labels = gold.integers(0, 2, 40) if task == "cola" else gold.uniform(0, 5, 40).round(3)
    rng = np.random.default_rng(seed + int(score))
    path = folder / "dev_predictions.tsv"
    preds = np.where(rng.random(40) < 0.7, labels, 1 - labels) if task == "cola" else labels + rng.normal(0, 1, 40)
    rows = ["split\tindex\tlabel\tprediction"] + [f"dev\t{i}\t{a}\t{b:.6g}" if task == "stsb" else f"dev\t{i}\t{a}\t{b}"
                                                  for i, (a, b) in enumerate(zip(labels, preds))]
    path.write_text("\n".join(rows) + "\n")
    return path


def fill(ctx: compose.SweepContext, tmp: Path, leave_out: int = 0) -> None:
    """Both arms pre-trained (their exports on disk) and fine-tuned under both recipes, the last `leave_out`
    fine-tuning jobs left out; every run with dev predictions and a metric curve; one earlier KILLED attempt."""
    client = tracking.setup(ctx.tracking_uri, ctx.experiment)
    ids = {}
    for variant in ("electra", "bert"):
        cfg_hash = tracking.config_hash(ctx.compose_pretrain(PretrainJob(variant, 0)))
        final = ctx.output_root / "pretrain" / "mini" / cfg_hash / "pretrained" / "final"
        final.mkdir(parents=True)
        (final / "config.json").write_text("{}")
        (final / "model.pt").write_bytes(b"weights")
        run = tracking.RunLogger.start(client, "mini", f"{variant}-s0", {
            "kind": "pretrain", "config_hash": cfg_hash, "variant": variant, "seed": "0", "sweep": "mini",
            "checkpoint_path": str(final), "checkpoints": json.dumps({"100": str(final)})}, {"trainer.max_steps": "100"})
        for step in (10, 20, 30):
            run.log_metrics({"train/loss": 5.0 / step, "train/flops": 1e9 * step}, step)
        run.finish("FINISHED")
        ids[variant] = run.run_id
    checkpoints = under_recipes(ctx.spec, [Checkpoint(v, 0, ids[v], 100, True, 1.0) for v in ids])
    hashes = finetune_hashes(ctx, checkpoints)
    jobs = [(c, t, s, score) for c in checkpoints for t, scores in SCORES[c.variant].items()
            for s, score in enumerate(scores)]
    logged: set[str] = set()
    for c, task, seed, score in jobs[:len(jobs) - leave_out]:
        h = hashes[(c.config_name, task, seed)][0]
        if h in logged:  # CoLA: one run under both recipes
            continue
        logged.add(h)
        tags = {"kind": "finetune", "task": task, "seed": str(seed), "pretrain_run_id": ids[c.variant],
                "pretrained_step": "100", "variant": c.variant, "config_hash": h, "sweep": "mini"}
        if (c.variant, task, seed) == ("bert", "stsb", 0):  # an attempt stopped before the run that finished
            tracking.RunLogger.start(client, "mini", "attempt", tags, {"task.epochs": "3"}).finish("KILLED", "SIGTERM")
        time.sleep(0.002)
        run = tracking.RunLogger.start(client, "mini", f"{c.variant}-{task}-{seed}", tags, {"task.epochs": "3"})
        run.log_metrics({"dev/score": score - 5.0}, 1)
        run.log_metrics({"final/score": float(score) + (0.5 if c.recipe == "paper_glue" else 0.0)}, 2)
        run.log_artifact(_predictions(tmp, task, seed, score), "predictions")
        run.finish("FINISHED")


@pytest.fixture(scope="module")
def source(tmp_path_factory, data_dir):
    """A finished store of the mini sweep, and its bundle."""
    tmp = tmp_path_factory.mktemp("source")
    ctx = context(tmp, data_dir)
    fill(ctx, tmp)
    client = tracking.setup(ctx.tracking_uri, ctx.experiment)
    bundle_dir = files.write(export(ctx, client, str(data_dir)), tmp / "bundle")
    return ctx, client, bundle_dir


def _import(ctx: compose.SweepContext, bundle_dir: Path, data_dir: Path):
    client = tracking.setup(ctx.tracking_uri, ctx.experiment)
    paths = {name: path for path, name in placeholders(ctx, str(data_dir)).items()}
    return client, import_bundle(files.read(bundle_dir), client, ctx.experiment, ctx.output_root, paths)


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _db_bytes(ctx: compose.SweepContext) -> str:
    return hashlib.sha256((ctx.output_root / "mlflow.db").read_bytes()).hexdigest()


def test_a_round_trip_plans_nothing_renders_the_same_report_and_exports_the_same_bytes(source, tmp_path, data_dir):
    ctx, client, bundle_dir = source
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    assert manifest["runs"] == {"finetune": {"FINISHED": 18, "KILLED": 2}, "pretrain": {"FINISHED": 2}}
    assert manifest["sweep"] == "mini" and manifest["scale"] == "default" and manifest["recipes"] == ["cpu_glue", "paper_glue"]
    # Plain files pandas reads without the package; the store's paths as placeholders, every point of a curve.
    metrics = pd.read_csv(bundle_dir / "metrics.csv.gz")
    assert sorted(metrics[metrics["key"] == "train/loss"]["step"]) == [10, 10, 20, 20, 30, 30]
    tags = pd.read_csv(bundle_dir / "tags.csv.gz", keep_default_na=False)
    assert tags[tags["key"] == "checkpoint_path"]["value"].str.startswith("$ELECTRA_ABLATE_HOME/pretrain/mini/").all()
    assert len(pd.read_csv(bundle_dir / "predictions.csv.gz")) == 18 * 40
    # The same store gives the same bytes.
    again = files.write(export(ctx, client, str(data_dir)), tmp_path / "again")
    assert _hashes(again) == _hashes(bundle_dir)

    there = context(tmp_path / "there", data_dir)
    client2, done = _import(there, bundle_dir, data_dir)
    assert len(done.written) == 22 and done.skipped == []
    # The dry run finds every job finished without the weights: nothing is pre-trained or fine-tuned again.
    assert not any(s.needs_pretraining for s in pretrain_states(there, client2))
    assert finetune_plan(there, client2)[0] == []
    # The same report but for the line that dates it (and says where the runs were read).
    a = write_report(ctx, client, tmp_path / "a", echo=False).read_text()
    b = write_report(there, client2, tmp_path / "b", echo=False).read_text()
    assert DATED.sub("", a) == DATED.sub("", b) and "| electra |" in a
    assert (tmp_path / "a" / "mini" / "verdicts.json").read_text() == (tmp_path / "b" / "mini" / "verdicts.json").read_text()
    # Exported again from the store it was imported into: the same bytes, run ids included.
    assert _hashes(files.write(export(there, client2, str(data_dir)), tmp_path / "back")) == _hashes(bundle_dir)
    # Imported twice: every run is found and skipped.
    assert _import(there, bundle_dir, data_dir)[1].written == []


def test_another_bootstrap_seed_redraws_every_interval_and_says_so():
    """`bootstrap_seed=`: the report's percentile intervals and its multi-bootstrap verdicts drawn from another seed
    for one report (the markdown prints the module's seed), then 0 again."""
    from electra_ablate.report import markdown
    from electra_ablate.report import multibootstrap as mb
    from electra_ablate.report import stats

    rng = np.random.default_rng(0)
    a, b = {"rte": rng.normal(60, 3, 40)}, {"rte": rng.normal(58, 3, 40)}
    runs = {name: {"rte": [mb.RunScore(None, i, float(x)) for i, x in enumerate(arm["rte"])]}
            for name, arm in (("a", a), ("b", b))}
    zero = stats.bootstrap_difference(a, b), mb.compare(runs["a"], runs["b"]).difference
    with stats.bootstrap_seed(1):
        one = stats.bootstrap_difference(a, b), mb.compare(runs["a"], runs["b"]).difference
        assert markdown.report_stats.BOOTSTRAP_SEED == 1 == mb.SEED
    assert zero[0][0] == one[0][0] and zero[0][1:] != one[0][1:]  # the same estimate, another interval
    assert zero[1] != one[1]
    assert stats.BOOTSTRAP_SEED == 0 == mb.SEED and stats.bootstrap_difference(a, b) == zero[0]


def test_an_import_skips_the_runs_a_store_has_and_refuses_one_with_other_results(source, tmp_path, data_dir):
    ctx, _, bundle_dir = source
    # A store with its own pre-training of the same job (another network): refused, naming both, nothing written.
    part = context(tmp_path / "part", data_dir)
    fill(part, tmp_path, leave_out=6)
    before = _db_bytes(part)
    with pytest.raises(BundleError, match=r"two finished pretrain runs of one job .*nothing was imported"):
        _import(part, bundle_dir, data_dir)
    assert _db_bytes(part) == before

    same = context(tmp_path / "same", data_dir)
    _import(same, bundle_dir, data_dir)
    runs = files.read(bundle_dir).table("runs")
    keep = set(runs[runs["kind"] == "pretrain"]["run_id"]) | set(runs["run_id"][:5])
    partial = tmp_path / "partial"
    _subset(bundle_dir, partial, keep)
    fresh = context(tmp_path / "fresh", data_dir)
    _, first = _import(fresh, partial, data_dir)
    _, second = _import(fresh, bundle_dir, data_dir)
    assert sorted(second.skipped) == sorted(first.written) and len(second.written) == 22 - len(keep)

    # A run of the same identity with another score: refused, naming both, the store left as it was.
    altered = tmp_path / "altered"
    _subset(bundle_dir, altered, set(runs["run_id"]), change=lambda m: m.assign(
        value=np.where(m["key"] == "final/score", m["value"].map(lambda v: repr(float(v) + 1)), m["value"])))
    before = _db_bytes(same)
    with pytest.raises(BundleError, match=r"run [0-9a-f]{32} of the bundle .* and run [0-9a-f]{32} of the store are "
                                          r"the same run with other results.*nothing was imported"):
        _import(same, altered, data_dir)
    assert _db_bytes(same) == before


def _subset(src: Path, dst: Path, keep: set[str], change=None) -> None:
    """A bundle of some of `src`'s runs (its metrics changed by `change`), written as export writes one."""
    b = files.read(src)
    tables = {n: t[t["run_id"].isin(keep)] for n, t in b.tables.items()}
    if change is not None:
        tables["metrics"] = change(tables["metrics"])
    files.write(files.Bundle(dict(b.manifest), tables), dst)


def test_bad_bundles_are_refused_in_one_line_naming_the_file(source, tmp_path, data_dir):
    _, _, bundle_dir = source
    target = context(tmp_path / "target", data_dir)
    truncated = tmp_path / "truncated"
    shutil.copytree(bundle_dir, truncated)
    data = (truncated / "metrics.csv.gz").read_bytes()
    (truncated / "metrics.csv.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(BundleError, match=r"metrics.csv.gz does not match its SHA-256 .*export the bundle again"):
        files.read(truncated)
    altered = tmp_path / "altered"
    shutil.copytree(bundle_dir, altered)
    text = gzip.decompress((altered / "runs.csv.gz").read_bytes()).replace(b"FINISHED", b"FAILED", 1)
    (altered / "runs.csv.gz").write_bytes(gzip.compress(text, mtime=0))
    with pytest.raises(BundleError, match=r"runs.csv.gz does not match its SHA-256"):
        files.read(altered)
    future = tmp_path / "future"
    shutil.copytree(bundle_dir, future)
    manifest = json.loads((future / "manifest.json").read_text())
    (future / "manifest.json").write_text(json.dumps({**manifest, "schema": 99}))
    with pytest.raises(BundleError, match=r"schema version 99, this code reads version 1"):
        files.read(future)
    with pytest.raises(BundleError, match=r"has no manifest.json"):
        files.read(tmp_path)
    assert not (target.output_root / "mlflow.db").exists()  # nothing read, nothing made


def test_a_bundle_of_another_experiment_or_scale_is_refused(source, tmp_path, data_dir):
    from electra_ablate.results.cli import _checked

    _, _, bundle_dir = source
    other = tmp_path / "other"
    other.mkdir()
    (other / "other.yaml").write_text(SWEEP.replace("name: mini", "name: other"))
    paths = {"root_dir": str(other), "data_dir": str(data_dir), "output_root": str(other / "store"),
             "cache_dir": str(other / "cache")}
    ctx = compose.make_context(other / "other.yaml", None, paths, f"sqlite:///{other}/store/mlflow.db")
    with pytest.raises(BundleError, match=r"holds runs of MLflow experiment 'mini' at scale 'default' \(sweep 'mini'\), "
                                          r"not of 'other' .*sweep=mini scale=default"):
        _checked(files.read(bundle_dir), bundle_dir, ctx)


def test_an_import_into_a_store_a_live_sweep_is_writing_is_refused(source, tmp_path, data_dir):
    _, _, bundle_dir = source
    busy = context(tmp_path / "busy", data_dir)
    client = tracking.setup(busy.tracking_uri, busy.experiment)
    record = tracking.RunLogger.start(client, "mini", "sweep-tiny", {"kind": "sweep", "sweep": "mini", **process()})
    assert record.run_id and platform.node()
    before = _db_bytes(busy)
    with pytest.raises(BundleError, match=rf"being written by a running job: sweep mini \(pid {os.getpid()}.*nothing "
                                          "was imported"):
        _import(busy, bundle_dir, data_dir)
    assert _db_bytes(busy) == before


def test_a_job_that_needs_an_export_the_store_lacks_is_refused_before_compute(source, tmp_path, data_dir):
    _, _, bundle_dir = source
    b = files.read(bundle_dir)
    runs, tags = b.table("runs"), b.table("tags")
    stsb = set(tags[(tags["key"] == "task") & (tags["value"] == "stsb")]["run_id"])
    drop = sorted(stsb & set(runs[runs["status"] == "FINISHED"]["run_id"]))[0]
    _subset(bundle_dir, tmp_path / "less", set(runs["run_id"]) - {drop})
    there = context(tmp_path / "there", data_dir)
    client, _ = _import(there, tmp_path / "less", data_dir)
    todo = finetune_plan(there, client)[0]
    assert len(todo) == 1  # the one job whose run was left out, and no pre-training
    (line,) = missing_exports(there, client, todo)
    assert re.match(r"\w+ seed 0 step 100: .*/pretrain/mini/[0-9a-f]+/pretrained/final \(pre-training run [0-9a-f]{32}\)",
                    line)


REPO = Path(__file__).resolve().parents[1]
COMMITTED = sorted(p.parent.parent for p in (REPO / "reports").glob("*/runs/manifest.json"))


@pytest.mark.slow
@pytest.mark.parametrize("bundle_dir", COMMITTED, ids=[p.name for p in COMMITTED])
def test_a_committed_report_re_renders_from_its_bundle_alone(bundle_dir, tmp_path):
    """No store and no ../shared: the report and its verdicts.json as committed, but for the line that dates it."""
    import subprocess
    import sys

    manifest = json.loads((bundle_dir / "runs" / "manifest.json").read_text())
    scale = [] if manifest["scale"] == "default" else [f"scale={manifest['scale']}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ELECTRA_ABLATE", "MLFLOW_"))}
    env.update(ELECTRA_ABLATE_DATA=str(tmp_path / "no-data"), ELECTRA_ABLATE_HOME=str(tmp_path / "no-store"))
    done = subprocess.run([sys.executable, "-m", "electra_ablate.results", "render", f"sweep={manifest['sweep']}",
                           *scale, f"report_dir={tmp_path}"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    name = manifest["report"]
    dated = re.compile(rf"^Sweep `{manifest['sweep']}`.*do not edit by hand\.$", re.M)
    committed, rendered = (REPO / "reports" / f"{name}.md").read_text(), (tmp_path / f"{name}.md").read_text()
    assert dated.sub("", rendered) == dated.sub("", committed), f"reports/{name}.md is not what its bundle renders"
    record = f"{name}/verdicts.json"
    assert (tmp_path / record).read_text() == (REPO / "reports" / record).read_text()
    assert not (tmp_path / "no-data").exists()
