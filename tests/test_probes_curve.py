"""The side-by-side curve (electra_ablate/probes/curve.py): ours and the transformers reference trained a few steps on
the tiny hermetic corpus log every metric at the expected steps, finite, into one CSV; row 0, with our weights
copied into the reference and the same batch and mask, gives the same generator MLM loss in both, and would not if
the reference kept its own weights; a layout transformers cannot express is refused by its key before any data is
built."""

from __future__ import annotations

import csv
import math

import pytest
import torch

pytest.importorskip("transformers", reason="the curve's reference is built from transformers")

from electra_ablate.bench import builds  # noqa: E402
from electra_ablate.probes import curve  # noqa: E402
from electra_ablate.bench.settings import BenchError  # noqa: E402
from electra_ablate.training import build  # noqa: E402

# 2 layers, hidden 64, 8 sequences of 64 tokens from 300 documents of the hermetic corpus, in fp32.
TINY = ["model=tiny", "model.hidden_size=64", "model.embedding_size=32", "model.num_hidden_layers=2",
        "model.num_attention_heads=2", "model.intermediate_size=128", "model.max_position_embeddings=64",
        "data.max_docs=300", "data.batch_size=8", "data.max_seq_length=64", "runtime.num_workers=0",
        "runtime.precision=32-true", "optim.lr=2e-3", "optim.warmup_steps=1", "trainer.max_steps=5"]


def overrides(tmp_path, data_dir, token_cache) -> list[str]:
    return [*TINY, f"paths.data_dir={data_dir}", f"paths.cache_dir={token_cache}", f"paths.root_dir={tmp_path}"]


def argv(tmp_path, data_dir, token_cache, *extra: str) -> list[str]:
    return [*overrides(tmp_path, data_dir, token_cache), "--device", "cpu", "--out", str(tmp_path / "curve.csv"),
            *extra]


@pytest.fixture(scope="module")
def five_steps(tmp_path_factory, data_dir, token_cache):
    tmp = tmp_path_factory.mktemp("curve")
    return curve.main(argv(tmp, data_dir, token_cache, "--steps", "5", "--log-every", "2"))


def test_both_implementations_log_every_metric_at_the_expected_steps(five_steps):
    rows = five_steps.rows
    assert [(r["step"], r["implementation"]) for r in rows] == [
        (s, impl) for s in (0, 2, 4, 5) for impl in curve.IMPLEMENTATIONS]
    for r in rows:
        values = [r[k] for k in curve.COLUMNS if k not in ("step", "tokens", "implementation", "tokens_per_s")]
        assert all(math.isfinite(v) for v in values), r
        assert 0 <= r["masked_lm_accuracy"] <= 1 and 0 < r["replaced_fraction"] < 1 and 0 <= r["disc_auc"] <= 1, r
        assert r["step"] == 0 or r["tokens_per_s"] > 0, r
    by = {(r["step"], r["implementation"]): r for r in rows}
    assert by[(4, "ours")]["tokens"] == by[(4, "transformers")]["tokens"] == 4 * 8 * 64  # the same batches
    assert by[(5, "ours")]["lr"] == by[(5, "transformers")]["lr"]  # the same schedule


def test_the_csv_holds_both_implementations(five_steps):
    with open(five_steps.out, newline="") as f:
        read = list(csv.DictReader(f))
    assert tuple(read[0]) == curve.COLUMNS
    assert {r["implementation"] for r in read} == set(curve.IMPLEMENTATIONS) and len(read) == len(five_steps.rows)
    assert not list(five_steps.out.parent.glob(f".{five_steps.out.name}.*"))  # written atomically, nothing left


def test_row_0_generators_agree_with_copied_weights(five_steps):
    """Same weights, batch and mask, dropout off, fp32: the logits, MLM losses and accuracies agree to rounding."""
    first = {r["implementation"]: r for r in five_steps.rows if r["step"] == 0}
    ours, ref = first["ours"], first["transformers"]
    assert five_steps.wiring_gap < curve.WIRING_TOLERANCE  # the generators' logits at the masked positions
    assert abs(ours["mlm_loss"] - ref["mlm_loss"]) < 1e-5 * ref["mlm_loss"]
    assert ours["masked_lm_accuracy"] == ref["masked_lm_accuracy"]
    # Each discriminator scores its own generator's samples: close, as the samples of one distribution.
    assert abs(ours["replaced_fraction"] - ref["replaced_fraction"]) < 0.05


def test_the_two_implementations_share_no_tensor(tmp_path, data_dir, token_cache):
    """Copied, not tied: a tensor both trained would make the curves agree whatever the implementations do."""
    cfg = curve.compose(overrides(tmp_path, data_dir, token_cache))
    pair = curve.SideBySide(cfg, torch.device("cpu"))
    ours = {p.data_ptr() for p in pair.ours.params}
    theirs = {p.data_ptr() for p in pair.ref.params}
    assert ours and theirs and not ours & theirs
    assert pair.ours.optimizer is not pair.ref.optimizer


def test_row_0_tells_a_reference_with_its_own_weights(tmp_path, data_dir, token_cache, monkeypatch):
    """The check that row 0 is: with transformers' own initialisation instead of our weights it fails."""
    monkeypatch.setattr(builds.TransformersRunner, "load_from", lambda self, ours: None)
    result = curve.main(argv(tmp_path, data_dir, token_cache, "--steps", "1"))
    assert result.wiring_gap > 100 * curve.WIRING_TOLERANCE


@pytest.mark.parametrize("override, key", [("model.layer_norm=pre", "model.layer_norm=pre"),
                                           ("model.linear_bias=false", "model.linear_bias=false"),
                                           ("sharing=none", "sharing=none")])
def test_a_layout_transformers_lacks_is_refused_by_its_key(tmp_path, data_dir, token_cache, monkeypatch, capsys,
                                                           override, key):
    monkeypatch.setattr(build, "data_module", lambda cfg: pytest.fail("data built before the refusal"))
    with pytest.raises(BenchError, match=rf"^{key}: "):
        curve.main(argv(tmp_path, data_dir, token_cache, override))
    # From the command line: one `error:` line, exit status 1 (common/cli.py).
    monkeypatch.setattr("sys.argv", ["curve", *argv(tmp_path, data_dir, token_cache, override)])
    with pytest.raises(SystemExit) as stop:
        curve.cli_main()
    assert str(stop.value).startswith(f"error: {key}: ") and "\n" not in str(stop.value)
