"""GLUE tasks: loaders on fixtures in the original layouts and on the real data (`realdata`), the HF label mapping,
metrics against independent computations, tokenization against the reference's truncation, the feature
cache, batching, and the messages for bad input."""

from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import rankdata

from electra_ablate.glue import features as glue_features
from electra_ablate.glue import metrics as glue_metrics
from electra_ablate.glue import readers as glue_readers
from electra_ablate.glue import tasks as glue
from electra_ablate.data.tokenizer import load_tokenizer
from electra_ablate.finetuning.data import LengthBucketBatchSampler, collate, sorted_batches

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "glue"

# --- loaders on fixtures --------------------------------------------------------------------------------

# (task, split): (rows, label ids, first example's (text_a start, text_b start)). Ids are HF ClassLabel ids.
FIXTURE_EXPECTED = {
    ("cola", "train"): (5, [1, 0, 1, 0, 1], ("Our friends won't", None)),
    ("cola", "dev"): (3, [1, 0, 1], ("The sailors rode", None)),
    ("sst2", "train"): (4, [0, 0, 1, 1], ("hide new secretions", None)),
    ("sst2", "dev"): (2, [1, 0], ("it 's a charming", None)),
    ("mrpc", "train"): (3, [1, 0, 1], ("Amrozi accused", "Referring to him")),
    ("mrpc", "dev"): (2, [1, 0], ("He said the foodservice", '" The foodservice')),
    ("stsb", "train"): (3, [5.0, 0.0, 3.8], ("A plane is taking off.", "An air plane")),
    ("stsb", "dev"): (4, [5.0, 4.75, 5.0, 1.4], ("A man with a hard hat", "A man wearing")),
    ("qqp", "train"): (4, [0, 1, 0, 1], ("How is the life of a math student?", "Which level of prepration")),
    ("qqp", "dev"): (3, [0, 0, 1], ("Why are African-Americans", '"Why are hispanics')),
    # MNLI: neutral=1, entailment=0, contradiction=2 (HF order), from gold_label, the last column.
    ("mnli", "train"): (4, [1, 0, 0, 2], ("Conceptually cream skimming", "Product and geography")),
    ("mnli", "dev_matched"): (3, [1, 2, 0], ("The new rights are nice enough", "Everyone really likes")),
    ("mnli", "dev_mismatched"): (4, [2, 2, 0, 2], ("Your contribution helped", "Your contributions were")),
    ("qnli", "train"): (3, [1, 1, 0], ("When did the third Digimon", "Unlike the two seasons")),
    ("qnli", "dev"): (2, [1, 0], ("What is the first major city", '"The most important')),
    ("rte", "train"): (3, [1, 0, 0], ("No Weapons of Mass", "Weapons of Mass")),
    ("rte", "dev"): (2, [1, 0], ("Dana Reeve, the widow", "Christopher Reeve had")),
    ("wnli", "train"): (4, [1, 1, 1, 0], ("I stuck a pin", "The carrot had a hole.")),
    ("wnli", "dev"): (2, [0, 1], ("The drain is clogged", "The hair has to be cleaned.")),
}


def test_every_task_and_split_has_a_fixture():
    assert {(t.name, s) for t in glue.TASKS.values() for s in t.splits} == set(FIXTURE_EXPECTED)
    assert glue.available_tasks(FIXTURES) == list(glue.TASKS)


@pytest.mark.parametrize("task,split", sorted(FIXTURE_EXPECTED))
def test_fixture_loader(task, split):
    rows, labels, (a, b) = FIXTURE_EXPECTED[(task, split)]
    examples = glue_readers.read_tsv(glue.TASKS[task], FIXTURES, split)
    assert len(examples) == rows
    assert [e.label for e in examples] == labels
    assert [e.idx for e in examples] == list(range(rows))
    first = examples[0]
    assert first.text_a.startswith(a)
    assert first.text_b is None if b is None else first.text_b.startswith(b)


def test_mnli_has_two_dev_sets_with_their_own_metrics():
    mnli = glue.TASKS["mnli"]
    assert mnli.splits == ("train", "dev_matched", "dev_mismatched")
    matched = glue_readers.read_tsv(mnli, FIXTURES, "dev_matched")
    mismatched = glue_readers.read_tsv(mnli, FIXTURES, "dev_mismatched")
    assert {e.text_a for e in matched}.isdisjoint(e.text_a for e in mismatched)
    m = glue_metrics.compute_metrics(mnli, {"dev_matched": ([1, 2, 2], [1, 2, 0]), "dev_mismatched": ([2, 2, 2, 2], [2, 2, 0, 2])})
    assert m == pytest.approx({"accuracy": 2 / 3, "mismatched_accuracy": 3 / 4})


def test_mrpc_byte_order_mark_is_stripped():
    path = glue.split_path(glue.TASKS["mrpc"], FIXTURES, "dev")
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")  # the fixture carries the real file's BOM
    examples = glue_readers.read_tsv(glue.TASKS["mrpc"], FIXTURES, "dev")
    assert [e.label for e in examples] == [1, 0]  # "Quality" found although it follows the BOM


@pytest.mark.parametrize("task,split", [("mrpc", "dev"), ("qqp", "dev"), ("mnli", "train"), ("stsb", "train")])
def test_unbalanced_quotes_do_not_swallow_lines(task, split):
    spec = glue.TASKS[task]
    path = glue.split_path(spec, FIXTURES, split)
    with path.open(encoding=spec.encoding, newline="") as f:
        quoting_on = list(csv.reader(f, delimiter="\t"))  # csv's default: a leading " opens a quoted field
    examples = glue_readers.read_tsv(spec, FIXTURES, split)
    assert len(quoting_on) - 1 < len(examples) == FIXTURE_EXPECTED[(task, split)][0]
    assert any(e.text_a.startswith('"') or (e.text_b or "").startswith('"') for e in examples)


def test_double_unordered_appends_swapped_pairs():
    train = glue_readers.read_tsv(glue.TASKS["mrpc"], FIXTURES, "train")
    doubled = glue_readers.double_unordered(train)
    assert doubled[: len(train)] == train
    assert [(e.text_a, e.text_b, e.label) for e in doubled[len(train):]] == [(e.text_b, e.text_a, e.label) for e in train]
    assert glue.TASKS["mrpc"].unordered and glue.TASKS["stsb"].unordered
    assert not any(t.unordered for n, t in glue.TASKS.items() if n not in ("mrpc", "stsb"))


# --- the real data --------------------------------------------------------------------------------------

REAL_COUNTS = {"cola": (8551, 1043), "sst2": (67349, 872), "mrpc": (3668, 408), "stsb": (5749, 1500), "rte": (2490, 277)}


@pytest.mark.realdata
@pytest.mark.parametrize("task", sorted(REAL_COUNTS))
def test_real_row_counts(task, real_data_dir):
    spec = glue.TASKS[task]
    train, dev = (glue_readers.read_tsv(spec, real_data_dir / "glue", s) for s in ("train", "dev"))
    assert (len(train), len(dev)) == REAL_COUNTS[task]
    if spec.is_regression:
        assert min(e.label for e in train) == 0.0 and max(e.label for e in train) == 5.0
    else:
        assert {e.label for e in train} == set(range(spec.num_labels))


@pytest.mark.realdata
def test_available_tasks_on_the_real_data(real_data_dir):
    assert glue.available_tasks(real_data_dir / "glue") == ["cola", "sst2", "mrpc", "stsb", "rte"]


# --- the Hugging Face source ----------------------------------------------------------------------------

# Written out independently of glue/tasks.py: the HF GLUE ClassLabel names and the TSV string -> HF id mapping.
HF_NAMES = {
    "cola": ["unacceptable", "acceptable"],
    "sst2": ["negative", "positive"],
    "mrpc": ["not_equivalent", "equivalent"],
    "qqp": ["not_duplicate", "duplicate"],
    "mnli": ["entailment", "neutral", "contradiction"],
    "qnli": ["entailment", "not_entailment"],
    "rte": ["entailment", "not_entailment"],
    "wnli": ["not_entailment", "entailment"],
}
HF_COLUMNS = {
    "cola": ("sentence", None), "sst2": ("sentence", None), "mrpc": ("sentence1", "sentence2"),
    "stsb": ("sentence1", "sentence2"), "qqp": ("question1", "question2"), "mnli": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"), "rte": ("sentence1", "sentence2"), "wnli": ("sentence1", "sentence2"),
}
TSV_TO_HF = {"mnli": {"entailment": 0, "neutral": 1, "contradiction": 2}, "qnli": {"entailment": 0, "not_entailment": 1},
             "rte": {"entailment": 0, "not_entailment": 1}}
# Raw (text_a column, text_b column, label column) of each fixture, read with the plain csv module.
RAW_COLUMNS = {"cola": (3, None, 1), "sst2": (0, None, 1), "mrpc": (3, 4, 0), "stsb": (7, 8, 9), "qqp": (3, 4, 5),
               "mnli": (8, 9, -1), "qnli": (1, 2, 3), "rte": (1, 2, 3), "wnli": (1, 2, 3)}


def hf_dataset_from_fixture(task: str, split: str):
    """What datasets.load_dataset("nyu-mll/glue", task) gives, built in memory from a fixture file."""
    datasets = pytest.importorskip("datasets")
    spec = glue.TASKS[task]
    path = glue.split_path(spec, FIXTURES, split)
    with path.open(encoding="utf-8-sig", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[0 if task == "cola" else 1:]
    a, b, y = RAW_COLUMNS[task]
    ca, cb = HF_COLUMNS[task]
    data = {ca: [r[a] for r in rows], "idx": list(range(len(rows)))}
    features = {ca: datasets.Value("string"), "idx": datasets.Value("int32")}
    if cb is not None:
        data[cb], features[cb] = [r[b] for r in rows], datasets.Value("string")
    if task == "stsb":
        data["label"], features["label"] = [float(r[y]) for r in rows], datasets.Value("float32")
    else:
        data["label"] = [TSV_TO_HF[task][r[y]] if task in TSV_TO_HF else int(r[y]) for r in rows]
        features["label"] = datasets.ClassLabel(names=HF_NAMES[task])
    return datasets.Dataset.from_dict(data, features=datasets.Features(features))


@pytest.mark.parametrize("task,split", sorted(FIXTURE_EXPECTED))
def test_hf_and_tsv_sources_agree(task, split):
    spec = glue.TASKS[task]
    from_hf = glue_readers.examples_from_hf(spec, hf_dataset_from_fixture(task, split))
    from_tsv = glue_readers.read_tsv(spec, FIXTURES, split)
    assert [(e.idx, e.text_a, e.text_b) for e in from_hf] == [(e.idx, e.text_a, e.text_b) for e in from_tsv]
    assert [e.label for e in from_hf] == pytest.approx([e.label for e in from_tsv])  # STS-B: float32 on the HF side
    assert spec.hf_split(split) == {"train": "train", "dev": "validation", "dev_matched": "validation_matched",
                                    "dev_mismatched": "validation_mismatched"}[split]


def test_hf_labels_in_another_order_are_refused():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict(
        {"sentence1": ["a"], "sentence2": ["b"], "label": [0], "idx": [0]},
        features=datasets.Features({"sentence1": datasets.Value("string"), "sentence2": datasets.Value("string"),
                                    "label": datasets.ClassLabel(names=["not_entailment", "entailment"]),
                                    "idx": datasets.Value("int32")}),
    )
    with pytest.raises(glue.GlueDataError, match=r"labels are \['not_entailment', 'entailment'\], expected \['entailment', 'not_entailment'\]"):
        glue_readers.examples_from_hf(glue.TASKS["rte"], ds)


def test_hf_test_split_labels_are_refused():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"sentence": ["a", "b"], "label": [1, -1], "idx": [0, 1]})
    with pytest.raises(glue.GlueDataError, match=r"Hugging Face sst2 row idx=1: label -1 outside 0..1"):
        glue_readers.examples_from_hf(glue.TASKS["sst2"], ds)


def test_unknown_source_is_refused():
    with pytest.raises(glue.GlueDataError, match="unknown glue_data.source='zip'; valid: tsv, hf"):
        glue_readers.load_split(glue.TASKS["rte"], "dev", "zip", FIXTURES)


# --- metrics --------------------------------------------------------------------------------------------

LABELS = np.array([1, 1, 1, 0, 0, 0, 1, 0, 1, 1])
PREDS = np.array([1, 1, 0, 0, 0, 1, 1, 1, 1, 0])


def test_classification_metrics_against_confusion_counts():
    tp = np.sum((PREDS == 1) & (LABELS == 1))
    tn = np.sum((PREDS == 0) & (LABELS == 0))
    fp = np.sum((PREDS == 1) & (LABELS == 0))
    fn = np.sum((PREDS == 0) & (LABELS == 1))
    assert (tp, tn, fp, fn) == (4, 2, 2, 2)
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    f1 = 2 * tp / (2 * tp + fp + fn)
    assert glue_metrics.compute_metrics(glue.TASKS["cola"], {"dev": (PREDS, LABELS)}) == pytest.approx(
        {"mcc": mcc, "accuracy": 0.6})
    assert glue_metrics.compute_metrics(glue.TASKS["mrpc"], {"dev": (PREDS, LABELS)}) == pytest.approx({"accuracy": 0.6, "f1": f1})
    assert glue_metrics.compute_metrics(glue.TASKS["qqp"], {"dev": (PREDS, LABELS)}) == pytest.approx({"accuracy": 0.6, "f1": 2 / 3})
    for task in ("sst2", "qnli", "rte", "wnli"):
        assert glue_metrics.compute_metrics(glue.TASKS[task], {"dev": (PREDS, LABELS)}) == pytest.approx({"accuracy": 0.6})
    assert mcc == pytest.approx(1 / 6)


def test_regression_metrics_against_ranks_and_moments():
    scores = np.array([0.2, 1.5, 1.1, 3.9, 4.8, 2.0, 2.0])
    gold = np.array([0.0, 1.0, 2.0, 4.0, 5.0, 2.5, 3.0])
    pearson = np.sum((scores - scores.mean()) * (gold - gold.mean())) / (
        np.sqrt(np.sum((scores - scores.mean()) ** 2)) * np.sqrt(np.sum((gold - gold.mean()) ** 2)))
    r1, r2 = rankdata(scores), rankdata(gold)  # average ranks for the tie, as Spearman defines them
    spearman = np.corrcoef(r1, r2)[0, 1]
    m = glue_metrics.compute_metrics(glue.TASKS["stsb"], {"dev": (scores, gold)})
    assert m == pytest.approx({"spearman": spearman, "pearson": pearson})
    # Without ties Spearman is 1 - 6 sum d^2 / (n (n^2 - 1)): one swapped pair of 4 gives 0.8.
    assert glue_metrics.compute_metrics(glue.TASKS["stsb"], {"dev": ([0.1, 0.4, 0.35, 0.8], [1, 2, 3, 4])})["spearman"] == pytest.approx(0.8)


def test_task_score_is_the_papers_metric_times_100():
    assert glue_metrics.task_score(glue.TASKS["cola"], {"mcc": 0.5, "accuracy": 0.8}) == pytest.approx(50.0)
    assert glue_metrics.task_score(glue.TASKS["stsb"], {"spearman": 0.87, "pearson": 0.9}) == pytest.approx(87.0)
    assert glue_metrics.task_score(glue.TASKS["mnli"], {"accuracy": 0.81, "mismatched_accuracy": 0.7}) == pytest.approx(81.0)
    assert glue_metrics.task_score(glue.TASKS["mrpc"], {"accuracy": 0.88, "f1": 0.91}) == pytest.approx(88.0)


def test_glue_score_averages_the_tasks_present_without_wnli():
    assert glue_metrics.glue_score({"rte": 60.0, "cola": 40.0, "wnli": 10.0}) == (50.0, ("cola", "rte"))
    score, tasks = glue_metrics.glue_score({"rte": 60.0, "cola": 40.0, "wnli": 10.0}, include_wnli=True)
    assert (score, tasks) == (pytest.approx(110 / 3), ("cola", "rte", "wnli"))
    eight = dict(cola=1.0, sst2=2.0, mrpc=3.0, stsb=4.0, qqp=5.0, mnli=6.0, qnli=7.0, rte=8.0)
    assert glue_metrics.glue_score(eight) == (4.5, tuple(eight))
    with pytest.raises(glue.GlueDataError, match=r"unknown task\(s\) \['sst'\]"):
        glue_metrics.glue_score({"sst": 90.0})
    with pytest.raises(glue.GlueDataError, match="no task to average"):
        glue_metrics.glue_score({"wnli": 56.3})


# --- tokenization and the cache -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(data_dir):
    return load_tokenizer(data_dir / "vocab" / "bert-base-uncased-vocab.txt", lowercase=True)


def test_pair_features_follow_bert_layout(tokenizer):
    ex = [glue.Example(0, "The cat sat.", "A dog ran!", 1), glue.Example(1, "Hello", None, 0)]
    f = glue_features.featurize(ex, tokenizer, 128, regression=False)
    ids = f.input_ids[f.offsets[0]:f.offsets[1]].tolist()
    assert [tokenizer.id_to_token(i) for i in ids] == ["[CLS]", "the", "cat", "sat", ".", "[SEP]", "a", "dog", "ran", "!", "[SEP]"]
    assert f.token_type_ids[f.offsets[0]:f.offsets[1]].tolist() == [0] * 6 + [1] * 5
    assert [tokenizer.id_to_token(i) for i in f.input_ids[f.offsets[1]:f.offsets[2]]] == ["[CLS]", "hello", "[SEP]"]
    assert f.labels.tolist() == [1, 0] and f.labels.dtype == np.int64 and f.idx.tolist() == [0, 1]


def test_truncation_matches_the_reference_truncate_seq_pair(tokenizer, data_dir):
    """Reference _truncate_seq_pair: drop the last token of the longer sentence (b on ties) until it fits."""
    examples = glue_readers.read_tsv(glue.TASKS["rte"], data_dir / "glue", "train")[:600]
    max_len = 32  # the tiny data's pairs are short: most, not all, need truncating at 32
    f = glue_features.featurize(examples, tokenizer, max_len, regression=False)
    tokenizer.no_truncation()
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    truncated = 0
    for i, e in enumerate(examples):
        a = tokenizer.encode(e.text_a, add_special_tokens=False).ids
        b = tokenizer.encode(e.text_b, add_special_tokens=False).ids
        truncated += len(a) + len(b) > max_len - 3
        while len(a) + len(b) > max_len - 3:
            (a if len(a) > len(b) else b).pop()
        assert f.input_ids[f.offsets[i]:f.offsets[i + 1]].tolist() == [cls, *a, sep, *b, sep]
    assert 100 < truncated < len(examples)  # the check covered many truncated pairs and some whole ones


def test_feature_cache_is_reused_and_keyed_by_its_inputs(tmp_path, tokenizer, monkeypatch, data_dir):
    examples = glue_readers.read_tsv(glue.TASKS["stsb"], FIXTURES, "dev")
    digest = glue_features.file_digest(data_dir / "vocab" / "bert-base-uncased-vocab.txt")
    first = glue_features.cached_features(examples, tokenizer, digest, True, 32, True, tmp_path)
    files = list((tmp_path / "glue").iterdir())
    assert len(files) == 1 and files[0].suffix == ".npz"  # no temporary file left behind
    # The cached features are the features of these examples: STS-B scores as float32 labels, ids as featurized.
    assert first.labels.dtype == np.float32
    np.testing.assert_array_equal(first.labels, np.array([e.label for e in examples], np.float32))
    direct = glue_features.featurize(examples, tokenizer, 32, regression=True)
    for name in glue_features.Features._fields:
        np.testing.assert_array_equal(getattr(first, name), getattr(direct, name))

    monkeypatch.setattr(glue_features, "featurize", lambda *a, **k: pytest.fail("cache miss"))
    again = glue_features.cached_features(examples, tokenizer, digest, True, 32, True, tmp_path)
    for name in glue_features.Features._fields:
        np.testing.assert_array_equal(getattr(first, name), getattr(again, name))

    key = glue_features.features_key(examples, digest, True, 32, True)
    assert key != glue_features.features_key(examples, digest, True, 16, True)
    assert key != glue_features.features_key(examples[:-1], digest, True, 32, True)
    assert key != glue_features.features_key([examples[0]._replace(label=4.0), *examples[1:]], digest, True, 32, True)
    assert key != glue_features.features_key(examples, "other-vocab", True, 32, True)


def test_prediction_rows_use_the_tsv_labels(tokenizer):
    examples = glue_readers.read_tsv(glue.TASKS["rte"], FIXTURES, "dev")
    f = glue_features.featurize(examples, tokenizer, 32, regression=False)
    assert glue_features.prediction_rows(glue.TASKS["rte"], "dev", f, np.array([0, 0])) == [
        ["dev", "0", "not_entailment", "entailment"], ["dev", "1", "entailment", "entailment"]]


# --- batching -------------------------------------------------------------------------------------------


def test_collate_pads_to_the_longest_in_the_batch():
    items = [(np.array([101, 7, 102], np.int32), np.array([0, 0, 0], np.int8), 1, 4),
             (np.array([101, 7, 8, 102, 9, 102], np.int32), np.array([0, 0, 0, 0, 1, 1], np.int8), 0, 2)]
    b = collate(items, pad_id=0)
    assert b["input_ids"].tolist() == [[101, 7, 102, 0, 0, 0], [101, 7, 8, 102, 9, 102]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0], [1] * 6]
    assert b["token_type_ids"][1].tolist() == [0, 0, 0, 0, 1, 1]
    assert b["labels"].tolist() == [1, 0] and b["position"].tolist() == [4, 2]


def test_length_buckets_cover_every_example_once_with_little_padding():
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 128, size=1000)
    sampler = LengthBucketBatchSampler(lengths, batch_size=16, seed=3, pool_batches=10)
    epoch1, epoch2 = list(sampler), list(sampler)
    for batches in (epoch1, epoch2):
        flat = [i for b in batches for i in b]
        assert sorted(flat) == list(range(1000)) and len(batches) == len(sampler) == 63
    assert epoch1 != epoch2  # a new order each epoch
    bucket_pad = np.mean([lengths[b].max() - lengths[b].mean() for b in epoch1])
    random_pad = np.mean([lengths[b].max() - lengths[b].mean() for b in np.array_split(rng.permutation(1000), 63)])
    assert bucket_pad < random_pad / 4
    assert [i for b in sorted_batches(lengths, 100) for i in b] == np.argsort(lengths, kind="stable").tolist()


# --- bad input ------------------------------------------------------------------------------------------


def copy_task(tmp_path: Path, dir_name: str) -> Path:
    shutil.copytree(FIXTURES / dir_name, tmp_path / dir_name)
    return tmp_path / dir_name


def test_missing_task_directory(tmp_path):
    with pytest.raises(glue.GlueDataError, match=r"GLUE task directory .*/QNLI not found.*QNLI/\{train,dev\}\.tsv.*glue_data.source=hf"):
        glue_readers.read_tsv(glue.TASKS["qnli"], tmp_path, "train")


def test_missing_split(tmp_path):
    (copy_task(tmp_path, "MNLI") / "dev_mismatched.tsv").unlink()
    assert glue.available_tasks(tmp_path) == []
    with pytest.raises(glue.GlueDataError, match=r"MNLI/dev_mismatched.tsv not found: task mnli needs train.tsv, dev_matched.tsv, dev_mismatched.tsv"):
        glue_readers.read_tsv(glue.TASKS["mnli"], tmp_path, "dev_mismatched")


def test_wrong_columns_name_the_file_and_the_expected_columns(tmp_path):
    path = copy_task(tmp_path, "QQP") / "train.tsv"
    path.write_text(path.read_text().replace("question2", "q2", 1))
    with pytest.raises(glue.GlueDataError, match=r"QQP/train.tsv: header .* lacks column\(s\) \['question2'\]; a qqp file needs columns \['question1', 'question2', 'is_duplicate'\]"):
        glue_readers.read_tsv(glue.TASKS["qqp"], tmp_path, "train")


def test_wrong_field_count_names_the_line(tmp_path):
    path = copy_task(tmp_path, "CoLA") / "dev.tsv"
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = lines[1].replace("\t", " ", 1)  # 3 fields instead of 4
    path.write_text("".join(lines))
    with pytest.raises(glue.GlueDataError, match=r"CoLA/dev.tsv line 2: 3 tab-separated fields, expected 4"):
        glue_readers.read_tsv(glue.TASKS["cola"], tmp_path, "dev")


def test_label_outside_the_label_set_names_file_line_and_field(tmp_path):
    path = copy_task(tmp_path, "RTE") / "dev.tsv"
    path.write_text(path.read_text().replace("\tentailment\n", "\tmaybe\n"))
    with pytest.raises(glue.GlueDataError, match=r"RTE/dev.tsv line 3: label 'maybe' in field 'label' is not one of the rte labels \['entailment', 'not_entailment'\]"):
        glue_readers.read_tsv(glue.TASKS["rte"], tmp_path, "dev")


def test_sts_score_outside_range(tmp_path):
    path = copy_task(tmp_path, "STS-B") / "dev.tsv"
    path.write_text(path.read_text().replace("\t4.750\n", "\t7.5\n"))
    with pytest.raises(glue.GlueDataError, match=r"STS-B/dev.tsv line 3: score '7.5' in field 'score' is not a number in \[0.0, 5.0\]"):
        glue_readers.read_tsv(glue.TASKS["stsb"], tmp_path, "dev")


def test_unknown_task_and_split():
    with pytest.raises(glue.GlueDataError, match="unknown GLUE task 'sst'; valid: cola, sst2"):
        glue.get_task("sst")
    with pytest.raises(glue.GlueDataError, match="task rte has no split 'test'"):
        glue_readers.read_tsv(glue.TASKS["rte"], FIXTURES, "test")
