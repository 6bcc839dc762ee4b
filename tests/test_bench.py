"""The speed benchmark and the fast path: the benchmark runs end to end on a tiny config and its equal-work check
passes (same weights and corrupted batch -> same losses and gradients as transformers); fast dropout keeps
torch's semantics (rate, independence, 1/(1-p) scaling, the same mask forward and backward, identity in eval);
swapping it in changes no state-dict key and no eval-mode output. No test asserts a time."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F

pytest.importorskip("transformers", reason="the benchmark's reference is built from transformers")

from electra_ablate.bench import builds, cli, sections_speed, settings, step_costs  # noqa: E402
from electra_ablate.models import fast  # noqa: E402
from electra_ablate.models.encoder import ElectraForPretraining, EncoderConfig  # noqa: E402
from electra_ablate.optim.reference_adam import ReferenceAdam  # noqa: E402
from electra_ablate.training.build import config_step_flops  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

# 2 layers, hidden 64, sequences of 64, 8 sequences per batch, 300 documents of the tiny hermetic corpus and
# its BERT-layout vocabulary (conftest).
TINY = [
    "model.hidden_size=64", "model.embedding_size=32", "model.num_hidden_layers=2", "model.num_attention_heads=2",
    "model.intermediate_size=128", "model.max_position_embeddings=64", "data.max_docs=300",
]


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory, data_dir):
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "benchmarks.md"
    # Both precisions whatever this CPU has (on one without native bf16, bf16-mixed is only slower).
    argv = ["--quick", "--models", "tiny", "--batch-size", "8", "--seq-len", "64", "--threads", "1",
            "--data-dir", str(data_dir), "--cache-dir", str(tmp / "cache"), "--out", str(out),
            "--sections", "equal,pretrain,shapes,pieces,bert,finetune,data,memory,sync", "--accumulate", "1",
            "--precisions", "32-true,bf16-mixed", *[x for o in TINY for x in ("--override", o)]]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sections_speed, "SHAPES", ((4, 32), (8, 64)))  # the section's logic at test sizes
        return cli.main(argv), out


def test_benchmark_writes_its_table_with_the_command(quick_report):
    rep, out = quick_report
    text = out.read_text()
    assert text.startswith("# Benchmarks")
    assert "python -m electra_ablate.bench --quick --models tiny" in text  # the command that made it
    assert settings.NO_GPU_NOTE in text  # CPU run: GPU rows present but empty
    for impl in ("this harness", "transformers"):
        for p in ("32-true", "bf16-mixed"):
            assert f"| tiny | {impl} | {p} | 8 x 64 |" in text
    assert "**bf16-mixed against fp32**" in text
    assert not out.with_name(out.name + ".tmp").exists()
    assert {(r["key"], r["precision"]) for r in rep.pretrain} == {
        (k, p) for k in ("ours", "transformers") for p in ("32-true", "bf16-mixed")}
    for r in rep.pretrain:
        assert r["step_s"] > 0 and r["tokens_per_s"] > 0 and len(r["steps"]) == 2
        assert r["flops_paper"] > 0 and r["flops_executed"] > 0 and 0 < rep.peaks["tiny"][r["precision"]]["peak"]
    by = {(r["key"], r["precision"]): r for r in rep.pretrain}
    ours, ref = by[("ours", "32-true")], by[("transformers", "32-true")]
    # The same analytic work, but the reference executes more: its MLM head runs at every position.
    assert ours["flops_paper"] == ref["flops_paper"]
    assert ours["flops_executed"] < ref["flops_executed"]


def test_equal_work_check_passes_on_real_batches(quick_report):
    rep, out = quick_report
    (eq,) = rep.equal
    assert eq["passed"] and eq["grads_compared"] > 20
    for name, (ours, ref) in eq["values"].items():
        assert math.isfinite(ours) and abs(ours - ref) <= 1e-4 * abs(ref), name
    assert eq["masked"] > 0
    assert "| pass |" in out.read_text()


def test_the_report_names_the_cpu_and_what_auto_resolves_to(quick_report):
    from electra_ablate.common import precision

    text = quick_report[1].read_text()
    assert precision.describe_cpu() in text
    assert f"`runtime.precision=auto` resolves to {precision.resolve('auto', 'cpu')} here" in text


def test_every_section_reports(quick_report, data_dir):
    rep, out = quick_report
    text = out.read_text()
    assert {(r["precision"], r["variant"]) for r in rep.finetune} == {
        (p, v) for p in ("32-true", "bf16-mixed") for v in ("fast dropout", "torch dropout")}
    assert all(r["examples_per_s"] > 0 and r["task"] == "SST2" for r in rep.finetune)
    default, buckets = rep.finetune_padding  # one epoch of the first 2,000 SST-2 rows (all the tiny data has), counted
    sst2_rows = len((data_dir / "glue" / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()) - 1  # header
    assert default["real_tokens"] == buckets["real_tokens"] and default["examples"] == min(2000, sst2_rows)
    assert default["real_tokens"] < default["padded_tokens"] and buckets["padded_tokens"] < default["padded_tokens"]
    assert [(r["batch_size"], r["seq_len"], r["precision"]) for r in rep.shapes] == [
        (4, 32, "32-true"), (4, 32, "bf16-mixed"), (8, 64, "32-true"), (8, 64, "bf16-mixed")]
    assert "| tiny | 8 | 64 | bf16-mixed |" in text
    assert {r["piece"] for r in rep.pieces} == set(sections_speed.PIECES)
    assert [r["variant"] for r in rep.bert] == ["bert", "electra, generator 1/4", "electra, generator 1/1"]
    assert {r["workers"] for r in rep.data} == {0, 2}
    mem = {(r["impl"], r["batch_size"], r["accumulate"]) for r in rep.memory}
    assert mem == {("ours", 8, 1), ("transformers", 8, 1)}
    assert all(r["peak_mib"] > 0 for r in rep.memory)
    # The step gathers fixed numbers of prediction slots: no boolean-mask indexing is left to sync on CUDA.
    assert not any(r["op"] == "aten::index" for r in rep.syncs)
    for heading in ("## The fast path", "## BERT vs ELECTRA", "## Data loader", "## Peak memory", "## Host-device",
                    "## Fine-tuning throughput", "## Our step by batch size"):
        assert heading in text


def test_fused_adamw_clips_gradients_under_bf16_mixed_precision(tmp_path, data_dir):
    """runtime.fused_adam with bf16-mixed (the GPU defaults): Lightning's plugin refuses to clip for a fused
    optimizer; PretrainSystem clips by global norm itself (the gradients the fused step used are checked after it)."""
    bench_settings, _ = cli.parse_args(["--models", "tiny", "--batch-size", "4", "--seq-len", "64", "--data-dir",
                                        str(data_dir), "--cache-dir", str(tmp_path / "cache"),
                                        *[x for o in TINY for x in ("--override", o)]])
    cfg = builds.compose_config(bench_settings, "tiny", "runtime.precision=bf16-mixed")
    data = builds.load_data(cfg, torch.device("cpu"), 1)
    system = builds.OursRunner(cfg, data, torch.device("cpu"), builds.FastPath(fused_adam=True)).system
    norms = []

    class RecordNorm(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            def record(optimizer, args, kwargs):
                grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
                norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))
            trainer.optimizers[0].register_step_post_hook(record)  # Lightning steps with a closure: grads exist after it

    trainer = pl.Trainer(max_steps=2, precision="bf16-mixed", gradient_clip_val=1e-3, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[RecordNorm()], default_root_dir=str(tmp_path))
    trainer.fit(system, datamodule=data.dm)
    assert trainer.optimizers[0].defaults["fused"] is True
    assert len(norms) == 2 and all(n <= 1e-3 * 1.01 for n in norms)  # the raw gradient norm is far above 1e-3


@pytest.mark.parametrize("bias_correction", [True, False], ids=["adamw", "reference"])
def test_both_steps_take_the_configured_adam_update(tmp_path, data_dir, bias_correction):
    """optim.bias_correction picks the update of our step and of the transformers reference alike."""
    bench_settings, _ = cli.parse_args(["--models", "tiny", "--batch-size", "4", "--seq-len", "64", "--data-dir",
                                        str(data_dir), "--cache-dir", str(tmp_path / "cache"),
                                        *[x for o in TINY for x in ("--override", o)]])
    cfg = builds.compose_config(bench_settings, "tiny", f"optim.bias_correction={str(bias_correction).lower()}")
    data = builds.load_data(cfg, torch.device("cpu"), 1)
    ours = builds.OursRunner(cfg, data, torch.device("cpu"), builds.FastPath())
    theirs = builds.TransformersRunner(cfg, data, torch.device("cpu"), fused_adam=False)
    expected = torch.optim.AdamW if bias_correction else ReferenceAdam
    assert type(ours.optimizer) is expected and type(theirs.optimizer) is expected


@pytest.mark.slow
def test_compiled_pretraining_logs_its_compile_time(tmp_path, data_dir):
    """runtime.compile=true compiles both networks in place (checkpoint keys unchanged) and logs runtime/compile_s."""
    from hydra import compose, initialize_config_dir
    from mlflow.tracking import MlflowClient

    from electra_ablate import pretrain
    from electra_ablate.models.checkpoint import load_pretrained

    with initialize_config_dir(config_dir=str(settings.CONF_DIR), version_base="1.3"):
        cfg = compose("pretrain", overrides=[
            "model=tiny", *TINY, "data.max_seq_length=64", "data.batch_size=8", "runtime.compile=true",
            "runtime.num_workers=0", "trainer.max_steps=5", "optim.warmup_steps=1", "trainer.enable_progress_bar=false",
            f"paths.root_dir={tmp_path}", f"paths.data_dir={data_dir}", f"paths.output_dir={tmp_path}/run",
            f"logger.tracking_uri=sqlite:///{tmp_path}/mlflow.db"])
    run_id = pretrain.train(cfg)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (compile_s,) = client.get_metric_history(run_id, "runtime/compile_s")
    assert compile_s.value > 0
    load_pretrained(client.get_run(run_id).data.tags["checkpoint_path"])  # strict: raises if compiling renamed keys


def test_bad_section_name_fails_before_compute(data_dir):
    with pytest.raises(settings.BenchError, match="unknown --sections"):
        cli.main(["--sections", "pretrain,speed", "--data-dir", str(data_dir)])


def test_bad_precision_fails_before_compute(data_dir):
    with pytest.raises(settings.BenchError, match=r"--precisions '32-true,fp8'.*subset of 32-true,bf16-mixed"):
        cli.main(["--precisions", "32-true,fp8", "--data-dir", str(data_dir)])


@pytest.mark.parametrize("flags, expected", [({"avx2", "avx512_bf16"}, ("32-true", "bf16-mixed")),
                                             ({"avx2", "amx_bf16"}, ("32-true", "bf16-mixed")),
                                             ({"avx2"}, ("32-true",))])
def test_default_precisions_follow_the_cpu(monkeypatch, data_dir, flags, expected):
    from electra_ablate.common import precision

    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags))
    bench_settings, _ = cli.parse_args(["--device", "cpu", "--data-dir", str(data_dir)])
    assert bench_settings.precisions == expected
    assert settings.default_precisions("cuda") == ("bf16-mixed",)


# --- fast dropout ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.1, 0.5, 0.013])
def test_fast_dropout_rate_and_scaling(p):
    torch.manual_seed(0)
    n = 1 << 20
    y = fast.fast_dropout(torch.ones(n), p, training=True)
    q = fast.effective_rate(p)
    assert abs(q - p) <= 1 / 131072
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - q) < 5 * math.sqrt(q * (1 - q) / n)  # 5 sigma
    survivors = y[y != 0]
    assert torch.all(survivors == survivors[0]) and survivors[0].item() == pytest.approx(1 / (1 - q), rel=1e-6)


def test_fast_dropout_elements_are_independent():
    """Drop patterns of 4 neighbours (the 4 lanes of one 64-bit word, and across words) follow independent coins."""
    torch.manual_seed(1)
    p, n = 0.3, 1 << 21
    q = fast.effective_rate(p)
    keep = fast.keep_mask((n,), p)
    for offset in (0, 2):  # groups aligned with the 64-bit words, and straddling two words
        groups = keep[offset : offset + (n - 4) // 4 * 4].view(-1, 4).long()
        pattern = (groups * torch.tensor([1, 2, 4, 8])).sum(1)
        counts = torch.bincount(pattern, minlength=16).double()
        k = torch.tensor([bin(i).count("1") for i in range(16)], dtype=torch.float64)  # kept lanes per pattern
        expected = counts.sum() * (1 - q) ** k * q ** (4 - k)
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < 60, f"offset {offset}: chi2 {chi2:.1f} with 15 degrees of freedom"
    # Two draws are independent of each other.
    other = fast.keep_mask((n,), p)
    both = (keep & other).float().mean().item()
    assert abs(both - (1 - q) ** 2) < 5 * math.sqrt((1 - q) ** 2 / n)


def test_fast_dropout_masks_the_gradient_like_the_output_and_is_identity_in_eval():
    torch.manual_seed(2)
    x = torch.randn(64, 33, requires_grad=True)
    y = fast.fast_dropout(x, 0.25, training=True)
    g = torch.randn_like(y)
    (y * g).sum().backward()
    scale = 1 / (1 - fast.effective_rate(0.25))
    kept = y != 0
    assert torch.allclose(y[kept], x[kept] * scale) and torch.equal(x.grad == 0, ~kept)
    assert torch.allclose(x.grad[kept], g[kept] * scale)
    assert fast.fast_dropout(x, 0.25, training=False) is x
    assert fast.fast_dropout(x, 0.0, training=True) is x
    assert torch.count_nonzero(fast.fast_dropout(x, 1.0, training=True)) == 0
    module = fast.FastDropout(0.25).eval()
    assert module(x) is x
    with pytest.raises(ValueError, match="between 0 and 1"):
        fast.fast_dropout(x, 1.5)


def test_fast_attention_is_sdpa_with_the_fast_mask():
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 3, 10, 8) for _ in range(3))
    bias = torch.zeros(2, 1, 1, 10)
    bias[0, ..., 7:] = torch.finfo(torch.float32).min  # padding in the first sequence
    no_drop = fast.scaled_dot_product_attention(q, k, v, bias, 0.0)
    assert torch.allclose(no_drop, F.scaled_dot_product_attention(q, k, v, attn_mask=bias), atol=1e-6)
    torch.manual_seed(4)
    dropped = fast.scaled_dot_product_attention(q, k, v, bias, 0.2)
    torch.manual_seed(4)
    keep = fast.keep_mask((2, 3, 10, 10), 0.2)
    probs = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8) + bias, dim=-1)
    expected = (probs * keep / (1 - fast.effective_rate(0.2))) @ v
    assert torch.allclose(dropped, expected, atol=1e-5)


def test_written_out_attention_without_dropout_matches_torch_sdpa_in_value_and_gradient():
    torch.manual_seed(6)
    q, k, v = (torch.randn(2, 2, 16, 8, requires_grad=True) for _ in range(3))
    bias = torch.zeros(2, 1, 1, 16)
    bias[1, ..., 11:] = torch.finfo(torch.float32).min
    ours = fast.written_out_without_dropout(q, k, v, bias, 0.0)
    (g_ours,) = torch.autograd.grad(ours.square().sum(), q)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    (g_ref,) = torch.autograd.grad(ref.square().sum(), q)
    assert torch.allclose(ours, ref, atol=1e-6) and torch.allclose(g_ours, g_ref, atol=1e-5)
    # with dropout and torch's masks (fine-tuning's choice) it is torch's SDPA itself
    torch.manual_seed(7)
    a = fast.written_out_without_dropout(q, k, v, bias, 0.3)
    torch.manual_seed(7)
    assert torch.equal(a, F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=0.3))
    assert fast.attention_function(False, "sdpa") is F.scaled_dot_product_attention
    with pytest.raises(ValueError, match=r"runtime.cpu_attention='flash' must be one of math, sdpa"):
        fast.attention_function(True, "flash")


def test_switching_to_fast_dropout_changes_no_key_and_no_eval_output():
    torch.manual_seed(5)
    net = ElectraForPretraining(EncoderConfig(vocab_size=50, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                              num_attention_heads=2, intermediate_size=64), disc_head=True).eval()
    ids = torch.randint(5, 50, (3, 12))
    mask = torch.ones_like(ids)
    mask[0, 9:] = 0
    before_keys, before = list(net.state_dict()), net(ids, mask)
    fast.set_fast_dropout(net, True)
    assert list(net.state_dict()) == before_keys
    dropouts = [m for m in net.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and all(type(m) is fast.FastDropout and m.p == 0.1 for m in dropouts)
    assert all(a.sdpa is fast.scaled_dot_product_attention for a in net.modules() if hasattr(a, "dropout_p"))
    # Evaluation has no dropout: the attention is the same math written out (cpu_attention=math), equal to
    # torch's fused kernel up to rounding; with cpu_attention=sdpa it is that kernel, bit for bit.
    assert torch.allclose(net(ids, mask), before, atol=1e-5)
    fast.set_fast_dropout(net, True, cpu_attention="sdpa")
    assert torch.equal(net(ids, mask), before)
    net.train()
    assert not torch.equal(net(ids, mask), before)  # dropout is live in training mode
    fast.set_fast_dropout(net, False)
    assert all(type(m) is torch.nn.Dropout for m in net.modules() if isinstance(m, torch.nn.Dropout))


def test_throughput_section_times_both_attention_paths_and_every_layout(tmp_path, data_dir):
    out = tmp_path / "throughput.md"
    argv = ["--quick", "--models", "tiny", "--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "cache"),
            "--out", str(out), "--sections", "throughput", "--override", "data.batch_size=8",
            *[x for o in TINY for x in ("--override", o)]]
    rep = cli.main(argv)
    attention = [r for r in rep.throughput if r["kind"] == "attention"]
    assert {(r["objective"], r["attention"]) for r in attention} == {(o, a) for o in ("bert", "electra")
                                                                      for a in ("sdpa", "math")}
    assert all(r["batch"] == (8, 64) and r["tokens_per_s"] > 0 for r in attention)  # the experiment's length, 8 rows
    layouts = [r for r in rep.throughput if r["kind"] == "layout"]
    cores = os.cpu_count() or 1
    expected = [(1, 1), (cores, 1), (1, cores)] if cores > 1 else [(1, 1)]
    assert [(r["jobs"], r["threads"]) for r in layouts] == [*expected, (cores + 1, 1)]
    assert layouts[-1]["cores_used"] == cores  # time-sliced jobs occupy the cores there are
    assert all(len(r["per_job"]) == r["jobs"] and r["tokens_per_cpu_hour"] > 0 for r in layouts)
    assert "## Tokens per CPU-hour at the sweep's shape" in out.read_text()


def test_presets_section_times_every_preset_against_the_first_ones_bert_step(tmp_path, data_dir):
    out = tmp_path / "presets.md"
    argv = ["--quick", "--models", "tiny", "--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "cache"),
            "--out", str(out), "--sections", "presets", "--override", "data.batch_size=4",
            *[x for o in TINY for x in ("--override", o)], "--override", "model.max_position_embeddings=128"]
    rep = cli.main(argv)
    rows = [r for r in rep.throughput if r["kind"] == "preset"]
    assert [(r["preset"], r["batch"][1], r["objective"]) for r in rows] == [
        (p, t, o) for p, t in (("cpu_regime", 64), ("cpu_regime_30k", 64), ("cpu_regime_30k", 128))
        for o in ("bert", "electra")]
    bert_vocab = len((data_dir / "vocab" / "bert-base-uncased-vocab.txt").read_text().splitlines())
    assert [r["vocab"] for r in rows] == [2000] * 2 + [bert_vocab] * 4  # a trained 2k vocabulary; BERT's uncased one
    assert all(r["step_s"] > 0 and r["core_h_per_1k_steps"] > 0 for r in rows)
    flops = {(r["preset"], r["batch"][1], r["objective"]): r["flops"] for r in rows}
    assert flops[("cpu_regime_30k", 128, "bert")] > flops[("cpu_regime_30k", 64, "bert")] > flops[("cpu_regime", 64, "bert")]
    text = out.read_text()
    assert "## A step at each CPU preset" in text and f"| `cpu_regime_30k` data.max_seq_length=64 | electra | {bert_vocab} |" in text
    # Beside the markdown, the steps a sweep's dry run prices its jobs with (sweep/cost.py), whose FLOPs it counts
    # from a job's config alone: the same count as the built networks'.
    costs = json.loads(out.with_suffix(".json").read_text())
    parsed, _ = cli.parse_args(argv)
    assert costs["cpu"] == rep.machine["cpu"] and len(costs["rows"]) == len(rows)
    for saved, row in zip(costs["rows"], rows):
        assert saved["step_s"] == row["step_s"] and saved["batch"] == list(row["batch"]) and saved["threads"] == 1
        assert saved["model"]["hidden_size"] == 64 and saved["heads"]["main"] == {"bert": "mlm", "electra": "disc"}[
            saved["objective"]]
        cfg = builds.compose_config(parsed, "tiny", f"experiment={row['preset']}", f"objective={row['objective']}",
                             *row["overrides"], keep_shape=True)
        assert config_step_flops(cfg, row["vocab"])["joint"] == pytest.approx(row["flops"], rel=1e-9)


@pytest.mark.slow
def test_allocator_section_times_each_preset_step_in_two_processes_default_then_kept(tmp_path, data_dir):
    out = tmp_path / "allocator.md"
    argv = ["--quick", "--models", "tiny", "--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "cache"),
            "--out", str(out), "--sections", "allocator", "--threads", "1", "--precisions", "32-true",
            "--override", "data.batch_size=4",
            *[x for o in TINY for x in ("--override", o)], "--override", "model.max_position_embeddings=128"]
    rep = cli.main(argv)
    assert [(r["preset"], r["objective"], r["impl"]) for r in rep.allocator] == [
        (p, o, a) for p in ("cpu_regime", "cpu_regime_30k") for o in ("bert", "electra") for a in ("default", "kept")]
    # Each process says what its own entry point set: nothing under the switch, freed memory kept without it.
    assert [r["allocator"] for r in rep.allocator] == ["off", "kept"] * 4
    assert all(r["step_s"] > 0 and r["faults_per_step"] >= 0 and r["sys_s_per_step"] >= 0 and r["user_s_per_step"] > 0
               and r["peak_rss_mib"] > 0 for r in rep.allocator)
    text = out.read_text()
    assert "## Freed memory kept in the process (glibc)" in text
    assert text.count("| kept |") == 4 and text.count("| default |") == 4


def test_head_section_times_the_head_three_ways_and_its_row_blocks_match_eager_to_the_bit(tmp_path, data_dir,
                                                                                          monkeypatch):
    from electra_ablate.bench import sections_head

    out = tmp_path / "head.md"
    argv = ["--quick", "--models", "tiny", "--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "cache"),
            "--out", str(out), "--sections", "head", "--threads", "1", "--warmup", "1", "--piece-reps", "2",
            "--override", "data.batch_size=2", *[x for o in TINY for x in ("--override", o)],
            "--override", "model.max_position_embeddings=128"]
    rep = cli.main(argv)
    assert [r["variant"] for r in rep.head] == ["eager", "row blocks", "compiled"]
    eager, blocks, compiled = rep.head
    # 2 sequences x 19 slots (int((0.15 + 0.005) x 128)) by the vocabulary of the test data's vocab.txt.
    assert (eager["rows"], eager["vocab"]) == (38, 2200) and eager["speedup"] == 1.0
    assert eager["differs"] == "none" and blocks["differs"] == "none"  # the same kernels row by row: the same bits
    assert "samples" in compiled["differs"] and compiled["compile_s"] >= 0  # inductor draws its own numbers
    assert all(r["s"] > 0 and len(r["times"]) == 2 for r in rep.head)
    assert [r["pass"] for r in rep.head_passes] == [name for name, _, _ in sections_head.PASSES]
    assert all(r["s"] > 0 and r["gb_s"] > 0 for r in rep.head_passes)
    text = out.read_text()
    assert "## The vocabulary head's passes over the logits" in text and "| row blocks |" in text
    # The row blocks differ from eager where eager does: a block that ends mid-batch, and unused slots.
    case = sections_head.HeadCase(sections_head.BLOCK_ROWS * 2 + 3, 8, 50)
    assert sections_head._differences(case.run(sections_head.blocked_head), case.run(sections_head.eager_head)) == "none"
    assert sections_head._differences((torch.ones(1),) * 6, (torch.zeros(1),) * 6).startswith("loss (1 of 1)")
    # Without a working torch.compile (inductor needs a C++ compiler) the other rows are still timed, and it says so.
    def no_compiler(fn):
        def failing(*args, **kwargs):
            raise RuntimeError("no C++ compiler")
        return failing

    monkeypatch.setattr(sections_head.torch, "compile", no_compiler)
    rep = cli.main(argv)
    assert [r["variant"] for r in rep.head] == ["eager", "row blocks"]
    assert "torch.compile failed (RuntimeError)" in out.read_text()


def test_profile_section_puts_every_operation_of_the_30k_step_in_a_family(tmp_path, data_dir):
    from electra_ablate.bench import sections_profile as prof

    out = tmp_path / "profile.md"
    argv = ["--quick", "--models", "tiny", "--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "cache"),
            "--out", str(out), "--sections", "profile", "--threads", "1", "--override", "data.batch_size=4",
            *[x for o in TINY for x in ("--override", o)], "--override", "model.max_position_embeddings=128"]
    rep = cli.main(argv)
    assert [r["objective"] for r in rep.profile] == ["bert", "electra", "fine-tuning (SST2, batch 32)"]
    for r in rep.profile[:2]:
        assert r["families"][prof.HEAD] > 0 and r["families"]["matmuls (projections, feed-forward)"] > 0
        assert r["families"]["optimizer and clipping"] > 0 and "dropout" not in r["families"]  # the preset has none
    tuning = rep.profile[2]  # the preset's discriminator: no vocabulary head, a classifier's dropout
    assert prof.HEAD not in tuning["families"] and tuning["families"]["matmuls (projections, feed-forward)"] > 0
    for r in rep.profile:  # as it runs and kernel by kernel, each with its faults; the kernels within the step
        assert r["step_s"] > 0 and r["faults_per_step"] >= 0 and r["timed_faults_per_step"] >= 0
        assert sum(r["families"].values()) == pytest.approx(r["timed_step_s"], rel=1e-6)
    text = out.read_text()
    assert "## Where a step's time goes, by operation family" in text
    assert f"`cpu_regime_30k` fine-tuning (SST2, batch 32) ({tuning['precision']})" in text
    assert "timed kernel by kernel" in text
    # A kernel is charged its own time: what it dispatches inside is its callee's.
    timer = prof.OpTimer()
    x = torch.randn(64, 300, requires_grad=True)
    with timer:
        torch.nn.functional.cross_entropy(x, torch.zeros(64, dtype=torch.long)).backward()
    names = {name for name, _ in timer.seconds}
    assert {"aten::_log_softmax", "aten::_log_softmax_backward_data"} <= names
    assert all(sec >= 0 for sec in timer.seconds.values())
    # A vocabulary-sized operand makes an operation the head's, whatever its name.
    assert prof.family("aten::mm", [[512, 128], [128, 30522]], 30522) == prof.HEAD
    assert prof.family("aten::_to_copy", [[30522, 128]], 30522) == prof.HEAD  # the head's weight cast to bf16
    assert prof.family("aten::embedding_dense_backward", [[4, 64, 128], [4, 64]], 30522).startswith("embeddings")
    assert prof.family("aten::native_layer_norm_backward", [[4, 64, 128]], 30522) == "layer norm"
    assert prof.family("aten::_to_copy", [[4, 64, 128]], 30522) == "autocast casts"
    assert prof.family("aten::topk", [[4, 64]], 30522) == prof.ELEMENTWISE
    assert prof.family("aten::mm", [[512, 128], [128, 512]], 30522).startswith("matmuls")
    assert prof.family("aten::bmm", [[8, 64, 32], [8, 32, 64]], 30522).startswith("attention")
    assert prof.family("Optimizer.step#AdamW.step", [], 30522) == "optimizer and clipping"
    assert prof.family("autograd::engine::evaluate_function: MmBackward0", [], 30522) == prof.OUTSIDE


@pytest.mark.slow
def test_the_committed_step_costs_are_the_committed_bench_reports_converted(data_dir):
    """reports/benchmarks_presets.json and _throughput.json say what their markdown says: a file converted from its
    markdown (bench/step_costs.py, written before the bench wrote the JSON itself) is that conversion; one the bench
    wrote beside its markdown has the markdown's rows, its seconds at full precision where the table rounds them.
    Its FLOPs are those of the markdown's ratio column."""
    for name in ("benchmarks_presets", "benchmarks_throughput"):
        converted = step_costs.from_markdown(REPO / "reports" / f"{name}.md", data_dir)
        committed = json.loads((REPO / "reports" / f"{name}.json").read_text())
        if "converted_from" in committed:
            assert converted == committed, name
            continue
        converted.pop("converted_from")
        assert [r.pop("step_s") for r in committed["rows"]] == pytest.approx(
            [r.pop("step_s") for r in converted["rows"]], abs=5e-4), name
        for load in ("load_start", "load_end"):  # the table rounds the load averages to two places
            assert committed.pop(load) == pytest.approx(converted.pop(load), abs=5e-3), name
        assert converted == committed, name
    rows = json.loads((REPO / "reports" / "benchmarks_presets.json").read_text())["rows"]
    table = (REPO / "reports" / "benchmarks_presets.md").read_text().splitlines()
    ratios = [line.split("|")[8].strip() for line in table if line.startswith("| `cpu_regime")]
    assert [f"{r['flops'] / rows[0]['flops']:.2f}x" for r in rows] == ratios
