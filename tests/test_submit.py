"""GLUE test predictions and submissions: unlabelled test files in the GLUE download layouts (written here:
there are no test files in the shared data) and from `datasets` (rows labelled -1), a fine-tuning run that
keeps its test predictions, and the zip of the eleven files the GLUE server expects."""

from __future__ import annotations

import csv
import shutil
import zipfile
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from electra_ablate.finetuning import run as finetuning
from electra_ablate.glue import tasks as glue
from electra_ablate.glue import submit
from electra_ablate.tracking import runs as tracking

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "glue"

# Header and two rows of every test file, in the layout of the GLUE download script's files.
LAYOUTS = {
    "CoLA/test.tsv": (["index", "sentence"], [["0", "Bill whistled past the house."], ["1", "The car honked down."]]),
    "SST-2/test.tsv": (["index", "sentence"], [["0", "uneasy mishmash of styles"], ["1", 'a "quiet gem']]),
    "MRPC/test.tsv": (["index", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                      [["0", "1089874", "1089925", "PCCW 's chief", "Current Chief"], ["1", "3019446", "3019327", "A", "B"]]),
    "STS-B/test.tsv": (["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2"],
                       [["0", "main-news", "headlines", "2016", "0001", "none", "none", "A girl.", "A boy."],
                        ["1", "main-news", "headlines", "2016", "0002", "none", "none", "Cats.", "Dogs."]]),
    "QQP/test.tsv": (["id", "question1", "question2"], [["0", "Why?", "How?"], ["1", "Who?", "Where?"]]),
    "MNLI/test_matched.tsv": (
        ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse", "sentence1_parse",
         "sentence2_parse", "sentence1", "sentence2"],
        [["0", "31493", "31493", "travel", "( a )", "( b )", "(ROOT a)", "(ROOT b)", "Hierbas is a liqueur.", "It is sweet."],
         ["1", "92164", "92164", "government", "( c )", "( d )", "(ROOT c)", "(ROOT d)", "The rules apply.", "They do not."]]),
    "MNLI/test_mismatched.tsv": (
        ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse", "sentence1_parse",
         "sentence2_parse", "sentence1", "sentence2"],
        [["0", "1", "1e", "letters", "( a )", "( b )", "(ROOT a)", "(ROOT b)", "Dear friend.", "Hello."],
         ["1", "2", "2e", "oup", "( c )", "( d )", "(ROOT c)", "(ROOT d)", "Guides.", "Books."]]),
    "diagnostic/diagnostic.tsv": (["index", "sentence1", "sentence2"], [["0", "The cat sat.", "A cat sat."],
                                                                        ["1", "No dog ran.", "A dog ran."]]),
    "QNLI/test.tsv": (["index", "question", "sentence"], [["0", "What?", "This."], ["1", "When?", "Then."]]),
    "RTE/test.tsv": (["index", "sentence1", "sentence2"], [["0", "Mangla was built.", "Mangla exists."],
                                                          ["1", "Sales rose.", "Sales fell."]]),
    "WNLI/test.tsv": (["index", "sentence1", "sentence2"], [["0", "He left.", "John left."], ["1", "It broke.", "The cup broke."]]),
}


def write_layouts(root: Path, files=LAYOUTS) -> Path:
    for name, (header, rows) in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar=None, quotechar="\x00",
                       lineterminator="\n").writerows([header, *rows])
    return root


def test_every_test_file_of_the_glue_download_is_read(tmp_path):
    root = write_layouts(tmp_path)
    assert {s.file for splits in submit.TEST_SPLITS.values() for s in splits} == set(LAYOUTS)
    for task_name, splits in submit.TEST_SPLITS.items():
        task = glue.get_task(task_name)
        for split in splits:
            header, rows = LAYOUTS[split.file]
            examples = submit.read_test_tsv(task, split, root)
            assert [e.idx for e in examples] == [0, 1]
            assert [e.text_a for e in examples] == [r[header.index(split.text_a)] for r in rows]
            if split.text_b is None:
                assert all(e.text_b is None for e in examples)
            else:
                assert [e.text_b for e in examples] == [r[header.index(split.text_b)] for r in rows]
    loaded = submit.load_test_splits(glue.get_task("mnli"), "tsv", root)
    assert list(loaded) == ["test_matched", "test_mismatched", "ax"]
    assert loaded["ax"][1].text_a == "No dog ran."


def test_bad_test_files_name_the_file_and_the_fix(tmp_path):
    task = glue.get_task("rte")
    split = submit.TEST_SPLITS["rte"][0]
    with pytest.raises(glue.GlueDataError, match=r"RTE/test.tsv not found: glue_data.predict_test=true needs"):
        submit.read_test_tsv(task, split, tmp_path)
    write_layouts(tmp_path, {"RTE/test.tsv": (["index", "sentence1", "label"], [["0", "a", "entailment"]])})
    with pytest.raises(glue.GlueDataError, match=r"lacks column\(s\) \['sentence2'\]"):
        submit.read_test_tsv(task, split, tmp_path)
    write_layouts(tmp_path, {"RTE/test.tsv": (["index", "sentence1", "sentence2"], [["0", "a"]])})
    with pytest.raises(glue.GlueDataError, match=r"line 2: 2 tab-separated fields, expected 3"):
        submit.read_test_tsv(task, split, tmp_path)


def test_hf_test_splits_with_labels_minus_one_are_read():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"premise": ["a", "b"], "hypothesis": ["c", "d"], "label": [-1, -1], "idx": [7, 9]})
    examples = submit.examples_from_hf_test(glue.get_task("mnli"), ds)
    assert [(e.idx, e.text_a, e.text_b) for e in examples] == [(7, "a", "c"), (9, "b", "d")]
    labelled = datasets.Dataset.from_dict({"sentence": ["a"], "label": [1], "idx": [0]})
    with pytest.raises(glue.GlueDataError, match="is it a dev split"):
        submit.examples_from_hf_test(glue.get_task("sst2"), labelled)


def test_submission_files_follow_the_server_layout(tmp_path):
    preds = {
        "cola": {"test": [(1, "1"), (0, "0")]},
        "stsb": {"test": [(0, "5.7"), (1, "-0.2"), (2, "3.25")]},
        "mnli": {"test_matched": [(0, "neutral")], "test_mismatched": [(0, "contradiction")], "ax": [(0, "entailment")]},
        "rte": {"test": [(0, "not_entailment")]},
    }
    with pytest.raises(submit.SubmitError, match=r"no predictions for SST-2.tsv, MRPC.tsv.*pass --partial"):
        submit.write_submission(preds, tmp_path / "s.zip")
    path, written = submit.write_submission(preds, tmp_path / "s.zip", partial=True)
    assert written == ["CoLA.tsv", "STS-B.tsv", "MNLI-m.tsv", "MNLI-mm.tsv", "RTE.tsv", "AX.tsv"]
    with zipfile.ZipFile(path) as z:
        assert z.namelist() == written
        assert z.read("CoLA.tsv").decode() == "index\tprediction\n0\t0\n1\t1\n"  # index order
        assert z.read("STS-B.tsv").decode() == "index\tprediction\n0\t5.000\n1\t0.000\n2\t3.250\n"  # clipped
        assert z.read("AX.tsv").decode() == "index\tprediction\n0\tentailment\n"
        assert z.read("MNLI-mm.tsv").decode() == "index\tprediction\n0\tcontradiction\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zip"]  # no temp file left


def test_pick_median_or_best_run():
    class Run:
        def __init__(self, score, seed):
            self.data = type("D", (), {"metrics": {"final/score": score}, "tags": {"seed": str(seed)}})()

    runs = [Run(60, 0), Run(70, 1), Run(65, 2), Run(50, 3)]
    assert submit.pick_run(runs, "best").data.tags["seed"] == "1"
    assert submit.pick_run(runs, "median").data.tags["seed"] == "0"  # 50 60 | 65 70: the lower middle
    assert submit.pick_run(runs[:3], "median").data.tags["seed"] == "2"


def test_a_finetuning_run_keeps_test_predictions_and_the_command_zips_them(tmp_path, monkeypatch, data_dir):
    monkeypatch.chdir(tmp_path)
    glue_dir = tmp_path / "glue"
    for name in ("RTE", "MNLI"):
        shutil.copytree(FIXTURES / name, glue_dir / name)
    write_layouts(glue_dir, {k: v for k, v in LAYOUTS.items() if k.split("/")[0] in ("RTE", "MNLI", "diagnostic")})
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    for task, seed in (("rte", 0), ("rte", 1), ("mnli", 0)):
        with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
            cfg = compose("finetune", overrides=[
                f"paths.root_dir={REPO}", f"paths.data_dir={data_dir}", f"paths.output_root={tmp_path}/outputs",
                f"paths.output_dir={tmp_path}/run", f"logger.tracking_uri={uri}", "logger.experiment=subm",
                "runtime.num_workers=0", "trainer.enable_progress_bar=false", "glue_data.max_seq_length=32",
                f"glue_data.dir={glue_dir}", "glue_data.predict_test=true", f"task={task}", f"seed={seed}",
                "task.epochs=1", "model.embedding_size=32", "model.hidden_size=32", "model.num_hidden_layers=1",
                "model.num_attention_heads=1", "model.intermediate_size=64", "sweep.variant=scratch"])
        finetuning.run(cfg)
    client = tracking.setup(uri, "subm")
    assert client.get_experiment_by_name("subm").tags[tracking.TAG_EXPERIMENT_KIND] == "custom_model_development"
    predictions, picked = submit.collect_predictions(client, "subm", "scratch", "best")
    assert set(picked) == {"rte", "mnli"}
    assert sorted(predictions["mnli"]) == ["ax", "test_matched", "test_mismatched"]
    assert [i for i, _ in predictions["rte"]["test"]] == [0, 1]
    assert picked["rte"].data.metrics["final/score"] == max(
        r.data.metrics["final/score"] for r in client.search_runs([client.get_experiment_by_name("subm").experiment_id],
                                                                    "tags.task = 'rte'"))
    assert {p for rows in predictions["mnli"].values() for _, p in rows} <= {"entailment", "neutral", "contradiction"}
    out = submit.main(["--store", uri, "--experiment", "subm", "--variant", "scratch", "--out",
                       str(tmp_path / "sub.zip"), "--partial"])
    with zipfile.ZipFile(out) as z:
        assert z.namelist() == ["MNLI-m.tsv", "MNLI-mm.tsv", "RTE.tsv", "AX.tsv"]
        rows = z.read("RTE.tsv").decode().splitlines()
        assert rows[0] == "index\tprediction" and [r.split("\t")[0] for r in rows[1:]] == ["0", "1"]
    with pytest.raises(SystemExit, match=r"no FINISHED fine-tuning run of variant 'nothing'.*variants there: scratch"):
        submit.main(["--store", uri, "--experiment", "subm", "--variant", "nothing", "--out", str(tmp_path / "x.zip")])
    # Finished runs that kept no test predictions are refused, with the fix.
    for run in picked.values():
        (Path(run.info.artifact_uri.removeprefix("file://")) / submit.TEST_ARTIFACT).unlink()
    with pytest.raises(submit.SubmitError, match=r"mnli: none of the 1 finished runs of variant scratch .* glue_data.predict_test=true"):
        submit.collect_predictions(client, "subm", "scratch", "median")
