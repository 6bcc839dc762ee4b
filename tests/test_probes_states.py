"""The hidden-state geometry command (probes/states.py): its measures against cases whose answer is known (a collapsed
encoder has rank 1 and cosines 1, an orthonormal set rank n and cosine 0), random init drawn as fine-tuning draws
it, and bad input refused in one line before any encoder is loaded."""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path

import pytest
import torch

from electra_ablate.probes import states
from electra_ablate.bench.settings import BenchError
from electra_ablate.models.checkpoint import save_pretrained
from electra_ablate.models.encoder import ElectraForPretraining, ElectraModel, EncoderConfig
from electra_ablate.finetuning import source as finetune_source

DATA = Path(os.environ["ELECTRA_ABLATE_DATA"])  # conftest: the tiny hermetic data folder
VOCAB = DATA / "vocab" / "bert-base-uncased-vocab.txt"
VOCAB_SIZE = len(VOCAB.read_text(encoding="utf-8").splitlines())
TINY = EncoderConfig(vocab_size=VOCAB_SIZE, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)


def test_effective_rank_is_one_for_a_rank_one_matrix_and_n_for_equal_singular_values():
    u, v = torch.randn(20, 1), torch.randn(1, 8)
    assert states.effective_rank(u @ v) == pytest.approx(1.0, abs=1e-6)
    assert states.effective_rank(3.0 * torch.eye(6)) == pytest.approx(6.0)
    # Roy & Vetterli's p_k = s_k / sum(s): singular values (2, 1, 1) give exp(H(1/2, 1/4, 1/4)) = 2 * sqrt(2)
    assert states.effective_rank(torch.diag(torch.tensor([2.0, 1.0, 1.0]))) == pytest.approx(2 * math.sqrt(2))
    assert states.effective_rank(torch.zeros(4, 3)) == 0.0


def test_mean_pair_cosine_matches_the_pairs_by_hand():
    x = torch.randn(7, 5)
    by_hand = [torch.nn.functional.cosine_similarity(x[i], x[j], dim=0).item()
               for i, j in itertools.permutations(range(7), 2)]
    assert states.mean_pair_cosine(x) == pytest.approx(sum(by_hand) / len(by_hand), abs=1e-6)
    assert states.mean_pair_cosine(torch.eye(4)) == pytest.approx(0.0, abs=1e-12)
    assert states.mean_pair_cosine(torch.ones(3, 4) * torch.tensor([1.0, 2.0, 3.0]).unsqueeze(1)) == pytest.approx(1.0)


def test_padding_is_left_out_of_every_token_statistic():
    torch.manual_seed(0)
    hidden = torch.randn(4, 6, 8)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 3 + [0] * 3, [1] * 6])
    garbage = hidden.clone()
    garbage[mask == 0] = 1e3  # what padding holds must not matter
    assert states.state_stats(hidden, mask) == states.state_stats(garbage, mask)


def collapsed(seed: int = 0) -> ElectraModel:
    """A post-LN encoder whose last LayerNorm maps every token to one vector (weight 0, a fixed bias)."""
    torch.manual_seed(seed)
    encoder = ElectraForPretraining(TINY, disc_head=True).electra
    with torch.no_grad():
        last = encoder.encoder.layer[-1].output.LayerNorm
        last.weight.zero_()
        last.bias.copy_(torch.linspace(-1.0, 1.0, TINY.hidden_size))
    return encoder


def batch(n: int = 24, t: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB_SIZE, (n, t), generator=g)
    mask = torch.ones(n, t, dtype=torch.long)
    mask[::2, t // 2:] = 0
    return ids, mask, torch.zeros(n, t, dtype=torch.long)


def test_a_collapsed_encoder_has_rank_one_and_cosine_one_where_a_random_one_does_not():
    ids, mask, types = batch()
    out = states.layer_states(collapsed(), ids, mask, types, batch_size=10)
    assert list(out) == ["embeddings", "block 1", "output"]
    assert out["output"].shape == (24, 12, TINY.hidden_size)
    top = states.state_stats(out["output"], mask)
    assert top.cls_rank == pytest.approx(1.0, abs=1e-3) and top.mean_rank == pytest.approx(1.0, abs=1e-3)
    assert top.token_cosine == pytest.approx(1.0) and top.cls_cosine == pytest.approx(1.0)
    assert top.mean_cosine == pytest.approx(1.0) and top.common_share == pytest.approx(1.0)
    assert top.dim_variance == pytest.approx(0.0, abs=1e-10)
    below = states.state_stats(out["block 1"], mask)  # the blocks under it are untouched
    assert below.cls_rank > 5 and below.token_cosine < 0.5 and below.common_share < 0.5
    fresh = states.state_stats(states.layer_states(ElectraForPretraining(TINY, disc_head=True).electra, ids, mask, types)["output"],
                               mask)
    assert fresh.cls_rank > 5 and fresh.cls_rank_centred > 5 and fresh.token_cosine < 0.5
    assert fresh.mean_rank_centred > 5 and top.mean_rank_centred == 0.0  # one vector: nothing left once centred


def test_layer_states_leave_the_encoder_in_eval_mode_without_hooks():
    encoder = collapsed()
    encoder.train()
    states.layer_states(encoder, *batch())
    assert not encoder.training
    assert all(not m._forward_hooks for m in encoder.modules())


def test_a_pre_ln_encoder_reports_its_final_layernorm_as_the_output():
    torch.manual_seed(0)
    pre = ElectraForPretraining(EncoderConfig(**{**TINY.to_dict(), "layer_norm": "pre"}), disc_head=True).electra
    ids, mask, types = batch()
    out = states.layer_states(pre, ids, mask, types)
    assert torch.allclose(out["output"], pre(ids, mask, types), atol=1e-6)
    assert list(out) == ["embeddings", "block 1", "output"]


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    torch.manual_seed(0)
    return save_pretrained(tmp_path / "ckpt", ElectraForPretraining(TINY, disc_head=True), VOCAB,
                           {"model_name": "tiny", "seed": 3})


def _overrides(tmp_path: Path) -> list[str]:
    return [f"--override=paths.data_dir={DATA}", f"--override=paths.output_root={tmp_path}/outputs",
            f"--override=logger.tracking_uri=sqlite:///{tmp_path}/mlflow.db", "--override=glue_data.max_seq_length=32"]


def test_the_command_measures_a_checkpoint_and_the_random_init_fine_tuning_draws(tmp_path, checkpoint, monkeypatch):
    made = []
    real = finetune_source.from_network

    def spy(*args, **kwargs):
        pretrained = real(*args, **kwargs)
        made.append(pretrained)
        return pretrained

    monkeypatch.setattr(finetune_source, "from_network", spy)
    out = tmp_path / "states.md"
    rows = states.main([f"mine={checkpoint}", "--random-init-of", "mine", "--examples", "10", "--out", str(out),
                        *_overrides(tmp_path)])
    assert [(r["encoder"], r["layer"]) for r in rows] == [
        (name, layer) for name in ("mine", states.RANDOM) for layer in ("embeddings", "block 1", "output")]
    # The random arm is fine-tuning's draw for seed 0 (the config's), not the checkpoint's weights.
    loaded, drawn = made[0].make_encoder(), made[1].make_encoder()
    weights = "encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(loaded.state_dict()[weights], drawn.state_dict()[weights])
    assert torch.equal(drawn.state_dict()[weights], made[1].make_encoder().state_dict()[weights])
    text = out.read_text()
    assert text.startswith("| encoder | layer | dim. variance |") and text.count("\n") == 2 + len(rows)
    assert all(r["cls_rank"] >= 1.0 and -1.0 <= r["token_cosine"] <= 1.0 for r in rows)
    assert not (tmp_path / "mlflow.db").exists()  # a directory needs no tracking store


@pytest.mark.parametrize("argv, message", [
    (["mine"], r"give NAME=<pretrained dir"),
    (["a=x", "a=y"], r"repeat one"),
    (["a=x", "--random-init-of", "b"], r"--random-init-of b: no encoder of that name"),
    (["a=x", "--examples", "1"], r"at least 2"),
    (["a=x", "--override=glue_data.max_seq_lenght=32"], r"max_seq_lenght"),
])
def test_bad_input_is_refused_before_any_encoder_is_loaded(argv, message, monkeypatch):
    monkeypatch.setattr(states, "resolve_pretrained", lambda *a: pytest.fail("an encoder was loaded"))
    with pytest.raises(BenchError, match=message):
        states.main(argv)


def test_reinit_top_layers_measures_the_encoder_fine_tuning_starts_from(tmp_path):
    """A checkpoint whose top collapsed measures as collapsed, and as a fresh top with reinit_top_layers=1."""
    network = ElectraForPretraining(TINY, disc_head=True)
    network.electra.load_state_dict(collapsed().state_dict())
    ckpt = save_pretrained(tmp_path / "collapsed", network, VOCAB, {"model_name": "tiny"})
    as_saved = states.main([f"c={ckpt}", "--examples", "12", *_overrides(tmp_path)])
    redrawn = states.main([f"c={ckpt}", "--examples", "12", "--override=reinit_top_layers=1", *_overrides(tmp_path)])
    assert as_saved[-1]["layer"] == "output" and as_saved[-1]["cls_rank"] == pytest.approx(1.0, abs=1e-3)
    assert redrawn[-1]["cls_rank_centred"] > 3 and redrawn[-1]["token_cosine"] < 0.9
    assert redrawn[-1]["common_share"] < 0.9
    assert redrawn[1] == as_saved[1]  # block 1, under the re-drawn top, is the checkpoint's
