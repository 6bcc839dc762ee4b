"""Bad input, table-driven: every case ends in one message naming the key or file and the fix, before any
compute, with no MLflow run recorded. The real configs are composed with tiny overrides."""

from __future__ import annotations

import lzma
import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from electra_ablate import export, pretrain
from electra_ablate.finetuning import run as finetuning
from electra_ablate.finetuning import source as finetune_source
from electra_ablate.common import cli
from electra_ablate.glue import tasks as glue
from electra_ablate.sweep.compose import make_context, validate
from electra_ablate.sweep.spec import SweepError
from electra_ablate.tracking import runs as tracking
from electra_ablate.models.checkpoint import save_pretrained
from electra_ablate.data.errors import DataError
from electra_ablate.hf.convert import HFInteropError
from electra_ablate.models.encoder import ElectraForPretraining, EncoderConfig
from electra_ablate.training import checks

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "glue"
TEXT = "The quick brown fox jumps over the lazy dog near the river bank today.\n"


def runs_recorded(uri: str) -> int:
    path = Path(uri[len("sqlite:///"):])
    if not path.is_file():
        return 0
    client = tracking.setup(uri, "electra-ablate")
    return sum(len(client.search_runs([e.experiment_id])) for e in client.search_experiments())


# --- pre-training ---------------------------------------------------------------------------------------------

PRETRAIN_VALUES = {
    "lr negative": (["optim.lr=-1"], r"optim.lr=-1 must be a positive number"),
    "lr zero": (["optim.lr=0"], r"optim.lr=0 must be a positive number"),
    "lr nan": (["optim.lr=nan"], r"optim.lr=nan must be a positive number"),
    "batch size zero": (["data.batch_size=0"], r"data.batch_size=0 must be a positive integer"),
    "batch size negative": (["data.batch_size=-4"], r"data.batch_size=-4 must be a positive integer"),
    "steps zero": (["trainer.max_steps=0"], r"trainer.max_steps=0 must be a positive number of steps"),
    "steps negative": (["trainer.max_steps=-5"], r"trainer.max_steps=-5 must be a positive"),
    "warmup above training": (["optim.warmup_steps=500", "trainer.max_steps=100"],
                              r"optim.warmup_steps=500 is above trainer.max_steps=100.*lower optim.warmup_steps"),
    "warmup negative": (["optim.warmup_steps=-1"], r"optim.warmup_steps=-1 must be a number of steps >= 0"),
    "disc weight nan": (["objective.disc_weight=nan"], r"objective.disc_weight=nan must be a finite number >= 0"),
    "disc weight negative": (["objective.disc_weight=-1"], r"objective.disc_weight=-1 must be a finite number"),
    "gen weight inf": (["objective.gen_weight=inf"], r"objective.gen_weight=inf must be a finite number"),
    "mask rate zero": (["objective.mask_prob=0"], r"objective.mask_prob=0 must be in \(0, 1\)"),
    "mask rate one": (["objective.mask_prob=1.0"], r"objective.mask_prob=1.0 must be in \(0, 1\)"),
    "mask rate above one": (["objective=bert", "objective.mask_prob=1.5"], r"objective.mask_prob=1.5 must be in"),
    "mask + random above one": (["objective=bert", "objective.mask_token_prob=0.95"],
                                r"mask_token_prob \+ objective.random_token_prob = 1.05 must be <= 1"),
    "generator fraction zero": (["model.generator_fraction=0"], r"model.generator_fraction=0 must be in \(0, 1\]"),
    "generator fraction above one": (["model.generator_fraction=2.0"], r"model.generator_fraction=2.0 must be in"),
    "generator layers zero": (["generator.layers=0"], r"generator.layers=0 must be in \(0, 1\]"),
    "sequence above positions": (["data.max_seq_length=256"], r"data.max_seq_length=256 is above model.max_position_embeddings"),
    "heads do not divide hidden": (["model.hidden_size=63"], r"model.hidden_size=63 is not a multiple of model.num_attention_heads"),
    "grad norm zero": (["optim.max_grad_norm=0"], r"optim.max_grad_norm=0 must be a positive number"),
    "betas out of range": (["optim.betas=[0.9,1.5]"], r"optim.betas=\[0.9, 1.5\] must be two numbers in \[0, 1\)"),
    "bias correction maybe": (["optim.bias_correction=maybe"],
                              r"optim.bias_correction='maybe' must be true \(torch's AdamW\) or false \(the reference"),
    "temperature zero": (["objective.temperature=0"], r"objective.temperature=0 must be a positive number"),
    "dropout one": (["model.hidden_dropout_prob=1.0"], r"model.hidden_dropout_prob=1.0 must be in \[0, 1\)"),
    "prediction cap zero": (["objective.max_predictions_per_seq=0"],
                            r"objective.max_predictions_per_seq=0 must be a positive integer, or null"),
    "prediction cap fractional": (["objective=bert", "objective.max_predictions_per_seq=2.5"],
                                  r"objective.max_predictions_per_seq=2.5 must be a positive integer"),
    "position sampling unknown": (["objective.position_sampling=uniform"],
                                  r"objective.position_sampling='uniform' must be one of without_replacement, reference"),
    "disallow correct not a flag": (["objective.disallow_correct=maybe"],
                                    r"objective.disallow_correct='maybe' must be true or false"),
    "cpu attention unknown": (["runtime.cpu_attention=flash"],
                              r"runtime.cpu_attention='flash' must be math \(attention written out on CPU"),
    "required key unset": (["data=text_files"],
                           r"data.paths has no value \(\?\?\? in conf/data/\): give it, e.g. data.paths=\.\.\. on the"),
}


@pytest.mark.parametrize("overrides, message", PRETRAIN_VALUES.values(), ids=PRETRAIN_VALUES.keys())
def test_pretraining_values(tmp_path, pretrain_cfg, overrides, message):
    cfg = pretrain_cfg(tmp_path, *overrides, f"paths.cache_dir={tmp_path}/cache")
    with pytest.raises(checks.ConfigError, match=message):
        pretrain.train(cfg)
    assert not (tmp_path / "cache").exists() and not (tmp_path / "mlflow.db").exists()  # before data and store


def corpus_missing(tmp: Path) -> tuple[Path, str]:
    return tmp / "nowhere.txt", r"Corpus .*nowhere.txt does not exist. Point data.corpus at"


def corpus_empty(tmp: Path) -> tuple[Path, str]:
    (tmp / "empty.txt").write_text("")
    return tmp / "empty.txt", r"Corpus .*empty.txt is empty"


def corpus_binary_part_way(tmp: Path) -> tuple[Path, str]:
    path = tmp / "mixed.txt"
    good = (TEXT * 3 + "\n") * 40  # 40 documents of 3 lines: valid text for 160 lines, then binary
    path.write_bytes(good.encode() + b"\x00\xff\xfe binary \x89PNG\n")
    return path, rf"Corpus .*mixed.txt: line 161 \(byte {len(good.encode()) + 1}\) is not UTF-8 text"


def corpus_truncated_xz(tmp: Path) -> tuple[Path, str]:
    data = lzma.compress(((TEXT * 3 + "\n") * 400).encode())
    path = tmp / "cut.txt.xz"
    path.write_bytes(data[: len(data) // 2])
    return path, r"Corpus .*cut.txt.xz cannot be read after line \d+ \(byte \d+\).*truncated or corrupt"


def corpus_xz_not_xz(tmp: Path) -> tuple[Path, str]:
    path = tmp / "plain.txt.xz"
    path.write_text(TEXT)
    return path, r"Corpus .*plain.txt.xz cannot be read"


CORPORA = [corpus_missing, corpus_empty, corpus_binary_part_way, corpus_truncated_xz, corpus_xz_not_xz]


@pytest.mark.parametrize("make", CORPORA, ids=[f.__name__ for f in CORPORA])
def test_pretraining_corpus(tmp_path, pretrain_cfg, make):
    path, message = make(tmp_path)
    cfg = pretrain_cfg(tmp_path, f"data.corpus={path}", f"paths.cache_dir={tmp_path}/cache")
    with pytest.raises(DataError, match=message):
        pretrain.train(cfg)
    assert runs_recorded(f"sqlite:///{tmp_path}/mlflow.db") == 0


def test_pretraining_missing_vocabulary(tmp_path, pretrain_cfg):
    cfg = pretrain_cfg(tmp_path, "data.train_vocab_size=0", f"data.vocab_file={tmp_path}/vocab.txt",
                       f"paths.cache_dir={tmp_path}/cache")
    with pytest.raises(DataError, match=r"Vocabulary file .*vocab.txt does not exist"):
        pretrain.train(cfg)
    assert runs_recorded(f"sqlite:///{tmp_path}/mlflow.db") == 0


# --- unknown keys on the command line ------------------------------------------------------------------------

UNKNOWN_KEYS = {
    "pretrain misspelt": ("pretrain", ["trainer.max_step=10"], r"trainer.max_step is not a key .*did you mean trainer.max_steps\?"),
    "pretrain other name": ("pretrain", ["optim.learning_rate=1e-3"], r"optim.learning_rate is not a key .*optim has: .*\blr\b"),
    "pretrain wrong parent": ("pretrain", ["lr=3e-4"], r"lr is not a key .*did you mean optim.lr\?"),
    "pretrain key of another option": ("pretrain", ["objective=bert", "objective.disc_weight=50"],
                                       r"objective.disc_weight is not a key of the pretrain config with objective=bert; "
                                       r"objective=electra and objective=electra_15 have it"),
    "pretrain key of the option not chosen": ("pretrain", ["data.paths=[/corpora]"],
                                              r"data.paths is not a key .* with data=wiki_sample; data=text_files has it"),
    "pretrain list item out of range": ("pretrain", ["optim.betas.2=0.5"], r"optim.betas.2 is not a key .*optim.betas"),
    "report misspelt": ("report", ["scales=tiny"], r"scales is not a key of the report config; did you mean scale\?"),
    "finetune misspelt": ("finetune", ["task.epoch=3"], r"task.epoch is not a key .*did you mean task.epochs\?"),
    "sweep misspelt": ("sweep", ["scales=tiny"], r"scales is not a key of the sweep config; did you mean scale\?"),
}


@pytest.mark.parametrize("config, args, message", UNKNOWN_KEYS.values(), ids=UNKNOWN_KEYS.keys())
def test_unknown_keys_get_the_right_hint(config, args, message):
    text = cli.unknown_key_message(config, args)
    assert text is not None
    import re

    assert re.search(message, text), text
    assert "would only add a key that nothing reads" in text  # never a bare "use +key" suggestion


def test_known_keys_pass():
    assert cli.unknown_key_message("pretrain", ["optim.lr=1e-3", "objective=bert", "seed=0,1"]) is None
    # Required keys (`???` in their option's file) are keys too, and so are list items by index.
    assert cli.unknown_key_message("pretrain", ["data=text_files", "data.paths=[/corpora/wiki]"]) is None
    assert cli.unknown_key_message("pretrain", ["data=hf_dataset", "data.name=/saved/by/save_to_disk"]) is None
    assert cli.unknown_key_message("pretrain", ["optim.betas.0=0.8"]) is None
    # Hydra's own flags and their values are not overrides.
    assert cli.unknown_key_message("pretrain", ["--cfg", "job", "--package", "data", "model=small"]) is None
    assert cli.unknown_key_message("pretrain", ["-m", "seed=0,1", "objective=bert,electra"]) is None
    assert cli.unknown_key_message("pretrain", ["experiment=null", "optim.lr=1e-3"]) is None  # null: no option


BAD_COMMAND_LINES = {
    "unknown group option": ("pretrain", ["objective=electra_1"],
                             r"objective=electra_1 is not an option of objective; did you mean objective=electra_15\? "
                             r"its options \(conf/objective/\): all_tokens_mlm, bert, electra, electra_15, replace_mlm"),
    "unknown option in a sweep": ("pretrain", ["-m", "objective=bert,bertt"], r"objective=bertt is not an option of objective"),
    "override that does not parse": ("pretrain", ["optim.lr=["], r"'optim.lr=\[' is not a valid override .*override_grammar"),
    "list of overrides unquoted": ("sweep", ["pretrain_overrides=[trainer=ddp,runtime.precision=bf16-mixed]"],
                                   r"an item holding `=` goes in quotes: "
                                   r"'pretrain_overrides=\[\"trainer=ddp\",\"runtime.precision=bf16-mixed\"\]'"),
}


@pytest.mark.parametrize("config, args, message", BAD_COMMAND_LINES.values(), ids=BAD_COMMAND_LINES.keys())
def test_bad_command_lines_get_one_message(config, args, message):
    import re

    text = cli.unknown_key_message(config, args)
    assert text is not None and re.search(message, text), text


def test_options_a_search_path_may_add_are_left_to_hydra():
    assert cli.unknown_key_message("pretrain", ["objective=toy", "hydra.searchpath=[file:///elsewhere]"]) is None


# --- fine-tuning ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def template_store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ft_store") / "mlflow.db"
    tracking.setup(f"sqlite:///{path}", "electra-ablate")
    return path


def finetune_cfg(tmp: Path, data_dir: Path, *overrides: str):
    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        return compose("finetune", overrides=[
            f"paths.root_dir={tmp}", f"paths.data_dir={data_dir}", f"paths.output_dir={tmp}/run",
            f"logger.tracking_uri=sqlite:///{tmp}/mlflow.db", "runtime.num_workers=0",
            "trainer.enable_progress_bar=false", "glue_data.max_seq_length=32", "model.hidden_size=32",
            "model.embedding_size=32", "model.num_hidden_layers=2", "model.num_attention_heads=2",
            "model.intermediate_size=64", f"glue_data.dir={FIXTURES}", *overrides])


FINETUNE_VALUES = {
    "epochs zero": (["task.epochs=0"], r"task.epochs=0 must be a positive integer; the paper fine-tunes rte for"),
    "epochs negative": (["task.epochs=-1"], r"task.epochs=-1 must be a positive integer"),
    "glue member epochs zero": (["task=glue", "task.members.cola.epochs=0"], r"task.members.cola.epochs=0 must be a positive integer"),
    "batch size zero": (["glue_data.batch_size=0"], r"glue_data.batch_size=0 must be a positive integer; the paper uses 32"),
    "lr negative": (["finetune_optim.lr=-1"], r"finetune_optim.lr=-1 must be a positive number"),
    "lr by size zero": (["finetune_optim.lr_by_size.small=0"], r"finetune_optim.lr_by_size.small=0 must be a positive"),
    "layer decay above one": (["finetune_optim.layerwise_lr_decay=1.5"], r"finetune_optim.layerwise_lr_decay=1.5 must be in \(0, 1\]"),
    "warmup fraction one": (["finetune_optim.warmup_fraction=1.0"], r"finetune_optim.warmup_fraction=1.0 must be in \[0, 1\)"),
    "loss reduction median": (["finetune_optim.loss_reduction=median"],
                              r"finetune_optim.loss_reduction='median' must be sum \(the reference .*\) or mean"),
    "bias correction maybe": (["finetune_optim.bias_correction=maybe"],
                              r"finetune_optim.bias_correction='maybe' must be true or false"),
    "max steps zero": (["trainer.max_steps=0"], r"trainer.max_steps=0 must be -1 \(train for task.epochs\) or a positive"),
    "classifier dropout one": (["dropout.classifier=1.0"], r"dropout.classifier=1.0 must be in \[0, 1\)"),
    "sequence length zero": (["glue_data.max_seq_length=0"], r"glue_data.max_seq_length=0 must be a positive integer"),
    "cpu attention unknown": (["runtime.cpu_attention=flash"],
                              r"runtime.cpu_attention='flash' must be math \(attention written out on CPU"),
}


@pytest.mark.parametrize("overrides, message", FINETUNE_VALUES.values(), ids=FINETUNE_VALUES.keys())
def test_finetuning_values(tmp_path, data_dir, overrides, message):
    cfg = finetune_cfg(tmp_path, data_dir, *overrides)
    with pytest.raises(finetune_source.FinetuneError, match=message):
        finetuning.run(cfg)
    assert not (tmp_path / "mlflow.db").exists()  # stopped before the store was opened


def glue_copy(tmp: Path) -> Path:
    root = tmp / "glue"
    shutil.copytree(FIXTURES / "RTE", root / "RTE")
    return root


def glue_missing(tmp: Path) -> tuple[Path, str]:
    return tmp / "no_glue", r"GLUE task directory .*no_glue/RTE not found.*point glue_data.dir"


def glue_empty(tmp: Path) -> tuple[Path, str]:
    root = glue_copy(tmp)
    (root / "RTE" / "train.tsv").write_text("")
    return root, r"RTE/train.tsv is empty; expected a header with columns"


def glue_binary(tmp: Path) -> tuple[Path, str]:
    root = glue_copy(tmp)
    path = root / "RTE" / "dev.tsv"
    lines = path.read_bytes().splitlines(keepends=True)
    head = b"".join(lines[:3])
    path.write_bytes(head + b"\x00\xff\xfe\x89PNG\n" + b"".join(lines[3:]))
    return root, rf"RTE/dev.tsv line 4 \(byte {len(head) + 1}\) is not utf-8 text.*binary or corrupt"


def glue_truncated(tmp: Path) -> tuple[Path, str]:
    root = glue_copy(tmp)
    path = root / "RTE" / "train.tsv"
    data = path.read_text()
    cut = data[: data.index("\t", data.index("\n", data.index("\n") + 1) + 1)]  # line 3 cut after its 1st field
    path.write_text(cut)
    return root, r"RTE/train.tsv line 3: 1 tab-separated fields, expected 4"


GLUE_FILES = [glue_missing, glue_empty, glue_binary, glue_truncated]


@pytest.mark.parametrize("make", GLUE_FILES, ids=[f.__name__ for f in GLUE_FILES])
def test_finetuning_glue_files(tmp_path, data_dir, template_store, make):
    root, message = make(tmp_path)
    shutil.copyfile(template_store, tmp_path / "mlflow.db")
    cfg = finetune_cfg(tmp_path, data_dir, f"glue_data.dir={root}")
    with pytest.raises(glue.GlueDataError, match=message):
        finetuning.run(cfg)
    assert runs_recorded(f"sqlite:///{tmp_path}/mlflow.db") == 0


def test_finetuning_checkpoint_whose_vocabulary_does_not_match(tmp_path, data_dir, template_store):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"w{i}" for i in range(45)]]) + "\n")
    config = EncoderConfig(vocab_size=60, embedding_size=32, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    torch.manual_seed(0)
    ckpt = save_pretrained(tmp_path / "ckpt", ElectraForPretraining(config, disc_head=True), vocab, {})
    shutil.copyfile(template_store, tmp_path / "mlflow.db")
    cfg = finetune_cfg(tmp_path, data_dir, f"pretrained={ckpt}")
    with pytest.raises(finetune_source.FinetuneError, match=r"vocab_size=60 but its vocabulary .*has 50 entries; fine-tune with the vocab.txt"):
        finetuning.run(cfg)
    assert runs_recorded(f"sqlite:///{tmp_path}/mlflow.db") == 0


def test_finetuning_missing_checkpoint_directory(tmp_path, data_dir, template_store):
    shutil.copyfile(template_store, tmp_path / "mlflow.db")
    cfg = finetune_cfg(tmp_path, data_dir, f"pretrained={tmp_path}/gone")
    with pytest.raises(finetune_source.FinetuneError, match=r"is neither a directory, an MLflow run id"):
        finetuning.run(cfg)
    assert runs_recorded(f"sqlite:///{tmp_path}/mlflow.db") == 0


# --- sweeps and the report -----------------------------------------------------------------------------------

SWEEP_BASE = """
tasks: [rte]
pretrain: {model: tiny}
"""

SWEEP_FILES = {
    "unknown top key": ("variantz: {a: {objective: bert}}", r"unknown key\(s\) \['variantz'\]; valid keys"),
    "axis with an unknown key": ("axes: {size: {small: {model.hiden_size: 32}}, obj: {bert: {objective: bert}}}",
                                 r"variant small-bert: \['model.hiden_size'\] are not keys of the pretrain config"),
    "axis with an unknown option": ("axes: {obj: {x: {objective: electra_10}}}", r"electra_10"),
    "axis with no options": ("axes: {obj: {}}", r"axes \['obj'\] have no options"),
    "variants and axes": ("variants: {a: {objective: bert}}\naxes: {obj: {b: {objective: bert}}}", r"give `variants` or `axes`"),
    "bad checkpoint fraction": ("variants: {a: {objective: bert}}\ncheckpoints: [0.5]", r"checkpoints=\[0.5\] must be fractions in \(0, 1\] and include 1.0"),
    "invalid variant value": ("variants: {a: {objective: bert, optim.lr: -1}}", r"variant a: optim.lr=-1 must be a positive number"),
    "seeds not integers": ("variants: {a: {objective: bert}}\nseeds: [a]", r"seeds must be a non-empty list of integers"),
}


@pytest.mark.parametrize("body, message", SWEEP_FILES.values(), ids=SWEEP_FILES.keys())
def test_sweep_files(tmp_path, data_dir, body, message):
    path = tmp_path / "mine.yaml"
    path.write_text(SWEEP_BASE + body + "\n")
    paths = {"root_dir": str(tmp_path), "data_dir": str(data_dir), "output_root": str(tmp_path / "outputs"),
             "cache_dir": str(tmp_path / "cache")}
    with pytest.raises(Exception, match=message) as error:
        validate(make_context(path, None, paths, f"sqlite:///{tmp_path}/mlflow.db"))
    assert type(error.value).__name__ in ("SweepError", "ConfigError", "ConfigCompositionException", "MissingConfigException")
    assert not (tmp_path / "mlflow.db").exists()


REPORT_INPUTS = {
    "unknown sweep": ("no_such_sweep", None, r"no sweep named 'no_such_sweep'.*known sweeps: "),
    "unknown scale": ("quick", "huge", r"scale='huge' is not one of its scales"),
    "missing sweep file": ("/nowhere/mine.yaml", None, r"sweep file /nowhere/mine.yaml not found"),
}


@pytest.mark.parametrize("name, scale, message", REPORT_INPUTS.values(), ids=REPORT_INPUTS.keys())
def test_report_inputs(tmp_path, name, scale, message):
    paths = {"root_dir": str(tmp_path), "data_dir": str(tmp_path), "output_root": str(tmp_path), "cache_dir": str(tmp_path)}
    with pytest.raises(SweepError, match=message):
        make_context(name, scale, paths, f"sqlite:///{tmp_path}/mlflow.db")  # what the report's main does first


# --- export --------------------------------------------------------------------------------------------------

EXPORTS = {
    "neither directory nor run id": (["not-a-run", "{out}"], r"'not-a-run' is neither an existing pre-trained directory nor an MLflow run id"),
    "no store": (["0123456789abcdef0123456789abcdef", "{out}", "--tracking-uri", "sqlite:///{tmp}/none.db"],
                 r"no MLflow store at sqlite:///.*none.db; pass --tracking-uri"),
    "step with a directory": (["{tmp}", "{out}", "--step", "5"], r"--step picks a checkpoint of an MLflow run"),
    "run not in store": (["0123456789abcdef0123456789abcdef", "{out}", "--tracking-uri", "sqlite:///{store}"],
                         r"MLflow run 0123456789abcdef0123456789abcdef not found in"),
}


@pytest.mark.parametrize("args, message", EXPORTS.values(), ids=EXPORTS.keys())
def test_export_inputs(tmp_path, template_store, args, message):
    shutil.copyfile(template_store, tmp_path / "store.db")
    argv = [a.format(tmp=tmp_path, out=tmp_path / "out", store=tmp_path / "store.db") for a in args]
    with pytest.raises(HFInteropError, match=message):
        export.main(argv)
    assert not (tmp_path / "out").exists()
