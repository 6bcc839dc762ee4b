"""Hugging Face interop: export to transformers and import back, key mapping per sharing mode, bad input."""

import json
import os
from pathlib import Path

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"  # never download; must be set before huggingface_hub is imported
transformers = pytest.importorskip("transformers", reason="transformers is the optional extra 'hf'")

from electra_ablate.hf.convert import HFInteropError, electra_config, infer_model_name  # noqa: E402
from electra_ablate.hf.exporting import EXPORT_INFO_NAME, export_pretrained  # noqa: E402
from electra_ablate.hf.importing import import_pretrained  # noqa: E402
from electra_ablate.models import checkpoint
from electra_ablate.export import main as export_main  # noqa: E402
from electra_ablate.models.encoder import ElectraForPretraining, EncoderConfig  # noqa: E402
from electra_ablate.sharing.all import AllSharing  # noqa: E402
from electra_ablate.sharing.embeddings import EmbeddingSharing  # noqa: E402
from electra_ablate.sharing.none import NoSharing  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ["ELECTRA_ABLATE_DATA"])  # conftest: the tiny hermetic data folder
VOCAB_LINES = 2100  # of its BERT-layout vocabulary: [PAD]..[MASK], characters, word pieces and whole words
TOL = 1e-5

# Objective -> heads of the fine-tuned network and whether it comes with a neural generator.
OBJECTIVE_HEADS = {
    "electra": (dict(disc_head=True), True),
    "bert": (dict(mlm_head=True), False),
    "all_tokens_mlm": (dict(mlm_head=True, disc_head=True), True),
}


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory) -> Path:
    source = DATA_DIR / "vocab" / "bert-base-uncased-vocab.txt"
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    with open(source, encoding="utf-8") as f:
        path.write_text("".join(next(f) for _ in range(VOCAB_LINES)), encoding="utf-8")
    return path


def tiny_config(factorized: bool) -> EncoderConfig:
    return EncoderConfig(
        vocab_size=VOCAB_LINES, embedding_size=32 if factorized else 64, hidden_size=64, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=128, max_position_embeddings=64,
    )


def perturb(*modules: torch.nn.Module) -> None:
    """Move every weight off its init (LayerNorm 1/0, zero biases) so a swapped key changes the logits."""
    params = {id(p): p for m in modules for p in m.parameters()}
    with torch.no_grad():
        for p in params.values():
            p.add_(0.05 * torch.randn_like(p))


def make_pretrained(path: Path, vocab_file: Path, objective="electra", sharing="none", factorized=True):
    """A pre-trained directory as pre-training writes it; returns (directory, model, generator)."""
    torch.manual_seed(0)
    heads, has_generator = OBJECTIVE_HEADS[objective]
    config = tiny_config(factorized)
    model = ElectraForPretraining(config, **heads)
    generator = None
    if has_generator:
        generator = ElectraForPretraining(config if sharing == "all" else config.scaled(0.5), mlm_head=True)
        {"none": NoSharing, "embeddings": EmbeddingSharing, "all": AllSharing}[sharing](sharing).tie(generator, model)
    perturb(model, *([generator] if generator else []))
    meta = {"objective": objective, "sharing": sharing, "algorithm": "joint", "step": 10, "run_id": "r"}
    checkpoint.save_pretrained(path, model, vocab_file, meta, generator=generator)
    return path, model.eval(), generator.eval() if generator else None


def inputs(vocab_size=VOCAB_LINES):
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, vocab_size, (2, 12), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 8:] = 0  # padding must be masked the same way
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 6:] = 1
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)


def load_hf(cls_name: str, directory: Path):
    model, loading = getattr(transformers, cls_name).from_pretrained(directory, output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    return model.eval()


def ours_logits(net, head, x):
    hidden = net(x["input_ids"], x["attention_mask"], x["token_type_ids"])
    return net.disc_logits(hidden) if head == "disc" else net.mlm_logits(hidden)


def max_diff(a, b, attention_mask):
    """Max |a - b| over the (B, T) real tokens: outputs at padded positions are not defined."""
    return (a - b)[attention_mask.bool()].abs().max().item()


@pytest.mark.parametrize("factorized", [True, False], ids=["factorized", "equal"])
@pytest.mark.parametrize("sharing", ["none", "embeddings", "all"])
@torch.no_grad()
def test_export_loads_in_transformers_with_same_logits(tmp_path, vocab_file, sharing, factorized):
    directory, model, generator = make_pretrained(tmp_path / "pt", vocab_file, sharing=sharing, factorized=factorized)
    written = export_pretrained(directory, tmp_path / "hf")
    assert set(written) == {"discriminator", "generator"}
    x = inputs()

    disc = load_hf("ElectraForPreTraining", written["discriminator"])
    gen = load_hf("ElectraForMaskedLM", written["generator"])
    assert hasattr(disc.electra, "embeddings_project") == factorized
    assert disc.config.hidden_act == "gelu" and disc.config.embedding_size == model.config.embedding_size
    assert gen.config.hidden_size == generator.config.hidden_size
    assert max_diff(disc(**x).logits, ours_logits(model, "disc", x), x["attention_mask"]) <= TOL
    assert max_diff(gen(**x).logits, ours_logits(generator, "mlm", x), x["attention_mask"]) <= TOL
    assert gen.generator_lm_head.weight is gen.electra.embeddings.word_embeddings.weight  # tied, as ours

    # Each export is self-contained; shared weights are equal copies in both directories.
    d, g = disc.electra.state_dict(), gen.electra.state_dict()
    word, query = "embeddings.word_embeddings.weight", "encoder.layer.0.attention.self.query.weight"
    assert torch.equal(d[word], g[word]) == (sharing != "none")
    assert torch.equal(d[query], g[query]) == (sharing == "all")
    assert json.loads((tmp_path / "hf" / EXPORT_INFO_NAME).read_text())["sharing"] == sharing


@torch.no_grad()
def test_round_trip_export_then_import_is_exact(tmp_path, vocab_file):
    directory, model, generator = make_pretrained(tmp_path / "pt", vocab_file, sharing="embeddings")
    written = export_pretrained(directory, tmp_path / "hf")
    x = inputs()
    for name, original, head in [("discriminator", model, "disc"), ("generator", generator, "mlm")]:
        net, info, vocab = import_pretrained(str(written[name]))
        net.eval()
        assert info["model_type"] == "electra" and info["heads"] == [head]
        assert info["do_lower_case"] is True and vocab.read_text() == vocab_file.read_text()
        assert net.config == original.config
        assert max_diff(ours_logits(net, head, x), ours_logits(original, head, x), x["attention_mask"]) <= TOL
        if head == "mlm":
            assert net.generator_lm_head.weight is net.electra.embeddings.word_embeddings.weight


def test_import_writes_vocab_from_tokenizer_json(tmp_path, vocab_file):
    """A checkpoint with only tokenizer.json: its vocabulary is written, in id order, to the cache."""
    directory, _, _ = make_pretrained(tmp_path / "pt", vocab_file)
    written = export_pretrained(directory, tmp_path / "hf")
    disc = written["discriminator"]
    transformers.AutoTokenizer.from_pretrained(disc).save_pretrained(tmp_path / "tok")
    (disc / "vocab.txt").unlink()
    (disc / "tokenizer.json").write_bytes((tmp_path / "tok" / "tokenizer.json").read_bytes())
    _, _, vocab = import_pretrained(str(disc), cache_dir=tmp_path / "cache")
    assert vocab.parent == tmp_path / "cache" and vocab.read_text() == vocab_file.read_text()


@torch.no_grad()
def test_mlm_objectives_export_their_mlm_model(tmp_path, vocab_file):
    directory, model, _ = make_pretrained(tmp_path / "bert", vocab_file, objective="bert")
    assert set(export_pretrained(directory, tmp_path / "hf_bert")) == {"mlm"}

    directory, model, generator = make_pretrained(tmp_path / "atm", vocab_file, objective="all_tokens_mlm")
    written = export_pretrained(directory, tmp_path / "hf_atm")
    assert set(written) == {"mlm", "copy_gate", "generator"}
    x = inputs()
    mlm = load_hf("ElectraForMaskedLM", written["mlm"])
    gate = load_hf("ElectraForPreTraining", written["copy_gate"])
    assert max_diff(mlm(**x).logits, ours_logits(model, "mlm", x), x["attention_mask"]) <= TOL
    assert max_diff(gate(**x).logits, ours_logits(model, "disc", x), x["attention_mask"]) <= TOL


def test_autotokenizer_loads_the_export(tmp_path, vocab_file):
    directory, _, _ = make_pretrained(tmp_path / "pt", vocab_file)
    written = export_pretrained(directory, tmp_path / "hf")
    vocab = {t: i for i, t in enumerate(vocab_file.read_text(encoding="utf-8").splitlines())}
    for name in written:
        tokenizer = transformers.AutoTokenizer.from_pretrained(written[name])
        assert len(tokenizer) == VOCAB_LINES
        ids = tokenizer("The world", "was")["input_ids"]
        assert ids == [vocab["[CLS]"], vocab["the"], vocab["world"], vocab["[SEP]"], vocab["was"], vocab["[SEP]"]]


@torch.no_grad()
def test_import_bert_checkpoint(tmp_path, vocab_file):
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB_LINES, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        max_position_embeddings=64,
    )
    bert = transformers.BertForPreTraining(config)
    perturb(bert)
    bert.save_pretrained(tmp_path / "bert")
    (tmp_path / "bert" / "vocab.txt").write_text(vocab_file.read_text())

    net, info, _ = import_pretrained(str(tmp_path / "bert"))
    net.eval()
    assert info["model_type"] == "bert" and info["architecture"] == "BertForPreTraining" and info["heads"] == ["mlm"]
    assert net.config.embedding_size == 64 and not hasattr(net.electra, "embeddings_project")
    assert any("bert.pooler" in n and "cls.seq_relationship" in n for n in info["notes"])
    x = inputs()
    bert.eval()
    reference = bert(**x)
    hidden = net(x["input_ids"], x["attention_mask"], x["token_type_ids"])
    mask = x["attention_mask"]
    assert max_diff(hidden, bert.bert(**x).last_hidden_state, mask) <= TOL
    assert max_diff(net.mlm_logits(hidden), reference.prediction_logits, mask) <= TOL


@torch.no_grad()
def test_import_encoder_only_checkpoint_drops_task_head(tmp_path, vocab_file):
    torch.manual_seed(0)
    config = electra_config(tiny_config(factorized=True))
    classifier = transformers.ElectraForSequenceClassification(config)
    perturb(classifier)
    classifier.save_pretrained(tmp_path / "cls")
    (tmp_path / "cls" / "vocab.txt").write_text(vocab_file.read_text())

    net, info, _ = import_pretrained(str(tmp_path / "cls"))
    assert info["heads"] == [] and any("classifier" in n for n in info["notes"])
    x = inputs()
    classifier.eval()
    net.eval()
    hidden = net(x["input_ids"], x["attention_mask"], x["token_type_ids"])
    assert max_diff(hidden, classifier.electra(**x).last_hidden_state, x["attention_mask"]) <= TOL


def test_model_name_follows_conf_model_sizes():
    small = EncoderConfig(
        embedding_size=128, hidden_size=256, num_hidden_layers=12, num_attention_heads=4, intermediate_size=1024
    )
    assert infer_model_name(small) == "small"
    assert infer_model_name(tiny_config(True)) == "custom-64h2l"


def test_export_cli_resolves_mlflow_run(tmp_path, vocab_file, capsys):
    from mlflow.tracking import MlflowClient

    directory, _, _ = make_pretrained(tmp_path / "pt", vocab_file)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("e"), tags={"kind": "pretrain", "checkpoint_path": str(directory)})
    written = export_main([run.info.run_id, str(tmp_path / "out"), "--tracking-uri", uri])
    assert set(written) == {"discriminator", "generator"} and "discriminator:" in capsys.readouterr().out
    with pytest.raises(HFInteropError, match="not empty.*--overwrite"):
        export_main([str(directory), str(tmp_path / "out")])
    export_main([str(directory), str(tmp_path / "out"), "--overwrite"])
    with pytest.raises(HFInteropError, match="no checkpoint at step 5"):
        export_main([run.info.run_id, str(tmp_path / "o2"), "--tracking-uri", uri, "--step", "5"])
    with pytest.raises(HFInteropError, match="neither an existing pre-trained directory nor an MLflow run id"):
        export_main([str(tmp_path / "nope"), str(tmp_path / "o3")])


# ------------------------------------------------------------------------------------------- bad input


def test_import_rejects_other_architectures(tmp_path):
    (tmp_path / "gpt2").mkdir()
    transformers.GPT2Config(n_layer=1).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(HFInteropError, match=r"'electra' or 'bert'.*found model_type='gpt2'"):
        import_pretrained(str(tmp_path / "gpt2"))


def test_import_rejects_vocab_size_mismatch(tmp_path, vocab_file):
    model = transformers.ElectraForPreTraining(electra_config(tiny_config(True)))
    model.save_pretrained(tmp_path / "m")
    lines = vocab_file.read_text().splitlines(keepends=True)
    (tmp_path / "m" / "vocab.txt").write_text("".join(lines[:-1]))
    with pytest.raises(HFInteropError, match=f"vocab_size={VOCAB_LINES} but .* has {VOCAB_LINES - 1} entries"):
        import_pretrained(str(tmp_path / "m"))


def test_directory_without_config(tmp_path, vocab_file):
    (tmp_path / "empty").mkdir()
    with pytest.raises(HFInteropError, match=r"empty has no config.json: expected a transformers"):
        import_pretrained(str(tmp_path / "empty"))
    with pytest.raises(checkpoint.CheckpointError, match=r"empty is not a pre-trained directory: config.json is"):
        export_pretrained(tmp_path / "empty", tmp_path / "out")
    directory, _, _ = make_pretrained(tmp_path / "pt", vocab_file)
    with pytest.raises(HFInteropError, match="electra-ablate pre-trained directory.*without the hf: prefix"):
        import_pretrained(str(directory))


def test_hub_id_offline_gives_clear_message(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(HFInteropError, match="HF_HUB_OFFLINE.*local directory"):
        import_pretrained("google/electra-small-discriminator")
