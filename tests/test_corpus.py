"""Corpora of many files or a `datasets` dataset: the sharded, parallel, resumable build gives exactly the examples
of the single-file build, bad files are named, and every pre-training run reports its passes over the corpus."""

from __future__ import annotations

import gzip
import json
import logging
import lzma
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zstandard
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from mlflow.tracking import MlflowClient

from electra_ablate import pretrain
from electra_ablate.common.io import atomic_file
from electra_ablate.data import corpus_build as C
from electra_ablate.data import wordpiece_shards as W
from electra_ablate.data.budget import corpus_budget, count, passes_warning
from electra_ablate.data.cache import _ARRAYS, PretrainCache, build_or_load
from electra_ablate.data.corpus_files import TextFiles
from electra_ablate.data.errors import DataError
from electra_ablate.data.hf_corpus import HFDataset
from electra_ablate.data.module import HFDatasetDataModule, TextFilesDataModule

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ["ELECTRA_ABLATE_DATA"])  # conftest: the tiny hermetic data folder
CORPUS = DATA / "corpus" / "enwiki_sample_5mb.txt"
VOCAB = DATA / "vocab" / "bert-base-uncased-vocab.txt"
SMALL_SHARDS = 12_000  # characters: a few dozen documents per shard, so these corpora have several shards


def documents(n: int, skip: int = 0) -> list[list[str]]:
    """Documents `skip` .. `skip + n` of the sample corpus, each a list of its lines."""
    docs, doc = [], []
    with open(CORPUS, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                doc.append(line.rstrip("\n"))
            elif doc:
                docs.append(doc)
                doc = []
                if len(docs) == skip + n:
                    break
    return docs[skip:]


def as_text(docs: list[list[str]]) -> str:
    return "".join("\n".join(doc) + "\n\n" for doc in docs)


def assert_same_examples(a: PretrainCache, b: PretrainCache) -> None:
    for name in _ARRAYS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    for key in ("num_examples", "num_tokens", "num_docs", "dtype", "vocab_size"):
        assert a.meta[key] == b.meta[key], key


def build(paths, cache_dir, **kw) -> PretrainCache:
    args = dict(vocab_file=VOCAB, cache_dir=cache_dir, max_seq_length=64, workers=1, shard_chars=SMALL_SHARDS)
    return C.build_or_load_corpus(TextFiles([str(p) for p in paths], kw.pop("text_field", "text")),
                                  **{**args, **kw})


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Today's single-file build of the first 120 documents (max_seq_length 64)."""
    tmp = tmp_path_factory.mktemp("reference")
    path = tmp / "head.txt"
    path.write_text(as_text(documents(120)), encoding="utf-8")
    return path, build_or_load(corpus=path, vocab_file=VOCAB, cache_dir=tmp / "cache", max_seq_length=64)


def write_formats(folder: Path, docs: list[list[str]]) -> list[Path]:
    """The documents split over five files: plain, .gz, .xz, .zst and JSON lines, named in corpus order."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = np.array_split(np.arange(len(docs)), 5)
    texts = [as_text([docs[i] for i in part]) for part in parts]
    files = [folder / "0.txt", folder / "1.txt.gz", folder / "2.txt.xz", folder / "3.txt.zst", folder / "4.jsonl"]
    files[0].write_text(texts[0], encoding="utf-8")
    with gzip.open(files[1], "wt", encoding="utf-8") as f:
        f.write(texts[1])
    with lzma.open(files[2], "wt", encoding="utf-8") as f:
        f.write(texts[2])
    files[3].write_bytes(zstandard.ZstdCompressor().compress(texts[3].encode()))
    with open(files[4], "w", encoding="utf-8") as f:
        for i in parts[4]:
            f.write(json.dumps({"id": int(i), "text": "\n".join(docs[i])}) + "\n")
    return files


# --- the same examples as the single-file build -------------------------------------------------------------


def test_single_file_in_parallel_shards_equals_todays_build(reference, tmp_path, monkeypatch, caplog):
    path, ref = reference
    monkeypatch.setattr(C, "PROGRESS_SECONDS", 0.0)
    with caplog.at_level(logging.INFO, logger="electra_ablate.data.corpus_build"):
        ours = build([path], tmp_path, workers=2)
    assert ours.meta["num_shards"] >= 4 and ours.meta["build_workers"] == 2
    assert_same_examples(ref, ours)
    assert ours.meta["num_docs"] == 120
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("corpus build:")]
    assert len(progress) >= 4 and "word pieces/s" in progress[-1] and "MB of files read" in progress[-1]
    # Loaded again without tokenizing; the shard size only changes where shards are cut.
    monkeypatch.setattr(W, "encode_lines", lambda *a: pytest.fail("tokenized again"))
    assert build([path], tmp_path, workers=2).directory == ours.directory
    monkeypatch.undo()
    assert_same_examples(ref, build([path], tmp_path / "big", shard_chars=1 << 30))


def test_sample_at_length_128_equals_todays_build(tmp_path):
    ref = build_or_load(corpus=CORPUS, vocab_file=VOCAB, cache_dir=tmp_path / "a", max_docs=300)
    ours = C.build_or_load_corpus(TextFiles([CORPUS]), vocab_file=VOCAB, cache_dir=tmp_path / "b",
                                  max_docs=300, workers=2, shard_chars=1 << 17)
    assert ours.meta["num_shards"] >= 2
    assert_same_examples(ref, ours)


def test_files_of_every_format_give_the_examples_of_their_concatenation(reference, tmp_path):
    path, ref = reference
    files = write_formats(tmp_path / "corpus", documents(120))
    # A folder, then a glob that names a file again (read once), in the folder's sorted order.
    ours = build([tmp_path / "corpus", tmp_path / "corpus" / "*.jsonl"], tmp_path / "cache", workers=2)
    assert_same_examples(ref, ours)
    assert ours.meta["corpus"].startswith(f"text files [{files[0]}")
    # Globs and a list of files give the same corpus, hence the same (content-keyed) cache entry.
    again = build([tmp_path / "corpus" / "[0-3].txt*", files[4]], tmp_path / "cache")
    assert again.directory == ours.directory


def test_cache_key_follows_the_content(tmp_path):
    text = as_text(documents(30))
    a = tmp_path / "a.txt"
    a.write_text(text)
    first = build([a], tmp_path / "c").directory.name
    os.utime(a, (1, 1))  # a new modification time, same bytes
    copy = tmp_path / "copy.txt"
    copy.write_text(text)
    assert build([a], tmp_path / "c").directory.name == first
    assert build([copy], tmp_path / "c").directory.name == first
    a.write_text(text.replace("the", "a", 1))
    assert build([a], tmp_path / "c").directory.name != first
    for change in [dict(max_seq_length=65), dict(short_seq_prob=0.5), dict(build_seed=1), dict(max_docs=10),
                   dict(lowercase=False)]:
        assert build([copy], tmp_path / "c", **change).directory.name != first, change


# --- bad input ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gzip", "utf8", "json", "field", "zstd"])
def test_a_bad_shard_is_named_with_its_line(tmp_path, kind):
    good = tmp_path / "corpus" / "0_good.txt"
    good.parent.mkdir()
    good.write_text(as_text(documents(20)))
    lines = [json.dumps({"text": "A fine document."})] * 2
    if kind == "gzip":
        bad = good.with_name("1_bad.txt.gz")
        blob = gzip.compress("".join(f"Line {i} of a truncated file.\n" for i in range(5000)).encode())
        bad.write_bytes(blob[: len(blob) // 2])  # cut short, as by an interrupted download
        where = "cannot be read after line"
    elif kind == "utf8":
        bad = good.with_name("1_bad.txt")
        bad.write_bytes(b"First line.\nSecond \xff\xfe line.\n")
        where = "line 2 is not UTF-8 text (byte 8 of the line"
    elif kind == "json":
        bad = good.with_name("1_bad.jsonl")
        bad.write_text("\n".join(lines + ['{"text": "unterminated']) + "\n")
        where = "line 3 is not JSON"
    elif kind == "field":
        bad = good.with_name("1_bad.jsonl.gz")
        bad.write_bytes(gzip.compress(("\n".join(lines + ['{"body": "x"}']) + "\n").encode()))
        where = "line 3 has no text field 'text'"
    else:
        bad = good.with_name("1_bad.txt.zst")
        bad.write_bytes(b"\x28\xb5\x2f\xfd" + b"not a zstd frame" * 10)
        where = "cannot be read from its start (ZstdError"
    with pytest.raises(DataError) as err:
        build([good.parent], tmp_path / "cache", workers=2)
    message = str(err.value)
    assert str(bad) in message and where in message, message
    assert "data.paths" in message or "data.text_field" in message  # the fix is named
    assert list((tmp_path / "cache" / "pretrain").iterdir()) == []  # nothing half-written


def test_paths_that_name_nothing_fail_before_compute(tmp_path):
    with pytest.raises(DataError, match=r"entry '.*missing\*\.txt' matches no file"):
        TextFiles([str(tmp_path / "missing*.txt")])
    with pytest.raises(DataError, match="must be a non-empty list"):
        TextFiles([])
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError, match="empty.txt are empty"):
        TextFiles([str(tmp_path)])


# --- resuming ----------------------------------------------------------------------------------------------


class Killed(Exception):
    pass


@pytest.mark.parametrize("workers", [1, 2])
def test_a_killed_build_resumes_without_tokenizing_finished_shards(reference, tmp_path, monkeypatch, workers):
    path, ref = reference

    def kill_after(k):
        def hook(index):
            if index == k:
                raise Killed(f"killed after shard {k}")
        return hook

    monkeypatch.setattr(C, "_on_shard_done", kill_after(2))
    with pytest.raises(Killed):
        build([path], tmp_path, workers=workers)
    assert list((tmp_path / "pretrain").iterdir()) == []
    (token_dir,) = (tmp_path / "tokens").iterdir()
    done = sorted(p.name for p in token_dir.glob("shard_*.npz"))
    assert done[:3] == ["shard_0000000.npz", "shard_0000001.npz", "shard_0000002.npz"]
    # A worker terminated mid-write may leave its temporary (`.<name>.<random>.tmp-<pid>`): only a dead one's.
    for tmp in token_dir.glob(".*tmp*"):
        assert not _alive(int(tmp.name.rsplit("-", 1)[1])), tmp

    tokenized = []
    real = W.encode_lines
    monkeypatch.setattr(W, "encode_lines", lambda tok, lines: tokenized.append(1) or real(tok, lines))
    monkeypatch.setattr(C, "_on_shard_done", lambda index: None)
    resumed = build([path], tmp_path, workers=1)
    assert len(tokenized) == resumed.meta["num_shards"] - len(done)
    if workers == 1:  # in order, so shards after the kill are left to do; parallel workers may finish them all
        assert len(tokenized) > 0
    assert_same_examples(ref, resumed)
    assert not list(token_dir.glob(".*tmp*"))  # the resumed build removed the dead writers' temporaries


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's new parent may be slow to reap it, or never do so in a container)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_tokenizer_workers_die_with_a_build_killed_outright(reference, tmp_path):
    # SIGKILL skips the pool's own terminate. A worker waiting on the task queue sees its end only when every
    # process holding the queue open is gone, and one may not be (here a forked sleeper stands for a stuck
    # sibling): the workers must go with their parent all the same.
    path, _ = reference
    code = ("import multiprocessing, os, signal, sys, time\n"
            "from electra_ablate.data import corpus_build as C\n"
            "from electra_ablate.data.corpus_files import TextFiles\n"
            "def hook(index):\n"
            "    if index == 1:\n"
            "        workers = ' '.join(str(p.pid) for p in multiprocessing.active_children())\n"
            "        holder = os.fork()\n"
            "        if holder == 0:\n"
            "            null = os.open(os.devnull, os.O_WRONLY)\n"
            "            os.dup2(null, 1), os.dup2(null, 2)\n"
            "            time.sleep(120)\n"
            "            os._exit(0)\n"
            "        print(holder, workers, flush=True)\n"
            "        os.kill(os.getpid(), signal.SIGKILL)\n"
            "C._on_shard_done = hook\n"
            "C.build_or_load_corpus(TextFiles([sys.argv[1]], 'text'), vocab_file=sys.argv[2], cache_dir=sys.argv[3],"
            " max_seq_length=64, workers=2, shard_chars=12_000)\n")
    out = tmp_path / "out.txt"
    with open(out, "w") as f:  # a file, not a pipe: the workers and the holder inherit it, and a pipe would wait
        done = subprocess.run([sys.executable, "-c", code, str(path), str(VOCAB), str(tmp_path)], stdout=f,
                              stderr=subprocess.STDOUT, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == -9, out.read_text()[-2000:]
    holder, *workers = [int(pid) for pid in out.read_text().split()]
    try:
        assert len(workers) == 2, out.read_text()
        deadline = time.monotonic() + 30
        while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in workers if _running(pid)]
    finally:
        os.kill(holder, signal.SIGKILL)


_TOKENIZE_SHARD = W.tokenize_shard


def _dies_at_shard_1(index, *args):
    """A tokenizer process killed outright (out of memory, say) while it tokenizes shard 1."""
    if index == 1:
        os._exit(1)
    return _TOKENIZE_SHARD(index, *args)


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="workers see the patch by fork")
def test_a_tokenizer_process_that_dies_fails_the_build_instead_of_hanging(reference, tmp_path, monkeypatch):
    path, ref = reference
    monkeypatch.setattr(W, "tokenize_shard", _dies_at_shard_1)
    outcome = []
    build_thread = threading.Thread(target=lambda: outcome.append(_raised(build, [path], tmp_path, workers=2)),
                                    daemon=True)
    build_thread.start()
    build_thread.join(timeout=120)
    assert not build_thread.is_alive(), "the build still waits on the dead process's shard"
    (error,) = outcome
    assert isinstance(error, DataError) and "died while tokenizing shard 1" in str(error), error
    assert list((tmp_path / "pretrain").iterdir()) == []
    monkeypatch.setattr(W, "tokenize_shard", _TOKENIZE_SHARD)
    assert_same_examples(ref, build([path], tmp_path, workers=2))  # and a second run resumes it


def _raised(fn, *args, **kwargs) -> BaseException | None:
    try:
        fn(*args, **kwargs)
    except BaseException as e:  # noqa: BLE001 - handed to the test thread to judge
        return e
    return None


def test_only_the_shard_temporaries_of_killed_writers_are_removed(tmp_path):
    # A tokenizer process killed while writing leaves its temporary behind, named with its pid.
    code = ("import os, sys; from electra_ablate.common.io import atomic_file; "
            "atomic_file(sys.argv[1]).__enter__().write_bytes(b'half'); os._exit(0)")
    subprocess.run([sys.executable, "-c", code, str(W.shard_path(tmp_path, 0))], check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    (dead,) = tmp_path.glob(".shard_*")
    with atomic_file(W.shard_path(tmp_path, 1)) as live:  # a writer still at work: this process
        C._remove_stale_temporaries(tmp_path)
        assert not dead.exists() and live.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard_0000001.npz"]


# --- Hugging Face datasets -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_dataset(tmp_path_factory):
    datasets = pytest.importorskip("datasets")
    docs = documents(120)
    folder = tmp_path_factory.mktemp("hf") / "wiki"
    ds = datasets.Dataset.from_dict({"id": list(range(len(docs))), "text": ["\n".join(d) for d in docs]})
    datasets.DatasetDict({"train": ds, "validation": ds.select(range(10))}).save_to_disk(str(folder))
    return folder


@pytest.mark.parametrize("streaming", [False, True], ids=["map-style", "streaming"])
def test_local_datasets_dataset_gives_the_same_examples(reference, saved_dataset, tmp_path, streaming):
    _, ref = reference
    dm = HFDatasetDataModule(name=str(saved_dataset), split="train", streaming=streaming, vocab_file=str(VOCAB),
                               cache_dir=str(tmp_path), max_seq_length=64, batch_size=4, build_workers=2)
    assert_same_examples(ref, dm.prepare())
    assert "Hugging Face dataset" in dm.cache.meta["corpus"]
    other = C.build_or_load_corpus(HFDataset(str(saved_dataset), split="validation"), vocab_file=VOCAB,
                                   cache_dir=tmp_path, max_seq_length=64, workers=1)
    assert other.directory != dm.cache.directory and other.meta["num_docs"] == 10


def test_dataset_errors_name_the_fix(saved_dataset, tmp_path):
    with pytest.raises(DataError, match=r"no split 'test' \(it has \['train', 'validation'\]\)"):
        HFDataset(str(saved_dataset), split="test").dataset
    with pytest.raises(DataError, match=r"no column 'body'.*data.text_column"):
        HFDataset(str(saved_dataset), text_column="body").dataset
    with pytest.raises(DataError, match=r"cannot be loaded.*data.name"):
        HFDataset(str(tmp_path / "no_such_dataset_here")).dataset


# --- configs and runs --------------------------------------------------------------------------------------


def compose_pretrain(tmp_path, *overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("pretrain", overrides=[f"paths.data_dir={DATA}", f"paths.cache_dir={tmp_path / 'cache'}",
                                              *overrides])


def test_configs_instantiate_the_corpus_modules(saved_dataset, tmp_path):
    write_formats(tmp_path / "corpus", documents(40))
    cfg = compose_pretrain(tmp_path, "data=text_files", f"data.paths=[{tmp_path}/corpus]", "data.batch_size=4")
    dm = instantiate(cfg.data, cache_dir=cfg.paths.cache_dir, seed=0, num_workers=0, pin_memory=False,
                     build_workers=1)
    assert isinstance(dm, TextFilesDataModule) and dm.prepare().meta["num_docs"] == 40
    assert dm.special.mask == 103 and dm.num_examples >= 4
    cfg = compose_pretrain(tmp_path, "data=hf_dataset", f"data.name={saved_dataset}", "data.max_docs=30", "data.batch_size=4")
    dm = instantiate(cfg.data, cache_dir=cfg.paths.cache_dir, seed=0, num_workers=0, pin_memory=False)
    assert isinstance(dm, HFDatasetDataModule) and dm.prepare().meta["num_docs"] == 30


def test_passes_over_the_corpus_and_the_warning():
    # ELECTRA-Small's 1M steps x 128 x 128 (paper Table 6) over the ~60M-token Wikipedia slice.
    small_on_slice = corpus_budget(60_000_000, 470_000, 1_000_000, 128, 128)
    assert small_on_slice["corpus/tokens_to_see"] == 16_384_000_000
    assert round(small_on_slice["corpus/passes"]) == 273
    assert small_on_slice["corpus/example_epochs"] == pytest.approx(1_000_000 * 128 / 470_000)
    warning = passes_warning(small_on_slice)
    assert "273 passes" in warning and "~5 for ELECTRA-Small" in warning and "data=text_files" in warning
    assert warning.startswith("this run sees 16.4B tokens of a 60.0M-token corpus")
    tiny = passes_warning(corpus_budget(12_000, 47, 2000, 32, 128))  # a test corpus: no "0.00B tokens"
    assert tiny.startswith("this run sees 8.2M tokens of a 12.0k-token corpus: 683 passes")
    paper = corpus_budget(3_300_000_000, 26_000_000, 1_000_000, 128, 128)
    assert round(paper["corpus/passes"]) == 5 and passes_warning(paper) is None


def test_token_counts_are_written_in_the_unit_their_size_calls_for():
    assert [count(n) for n in (0, 950, 999_960, 49_152, 60e6, 16_384_000_000)] == \
        ["0", "950", "1.0M", "49.2k", "60.0M", "16.4B"]


def test_a_run_on_text_files_logs_its_passes(tmp_path, pretrain_cfg):
    write_formats(tmp_path / "corpus", documents(60))
    # The tiny test config trains a vocabulary, which these corpora do not: one clear error before compute.
    with pytest.raises(DataError, match="data.train_vocab_size=2000.*set data.train_vocab_size=0"):
        pretrain.train(pretrain_cfg(tmp_path, "data=text_files", f"data.paths=[{tmp_path}/corpus]"))
    cfg = pretrain_cfg(tmp_path, "data=text_files", f"data.paths=[{tmp_path}/corpus]", "data.train_vocab_size=0",
                       "data.max_seq_length=64", "data.batch_size=8", "trainer.max_steps=2", "optim.warmup_steps=1",
                       "logger.log_every_n_steps=1", "trainer.export_fractions=[]")
    run_id = pretrain.train(cfg)
    run = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(run_id)
    tokens = int(run.data.params["corpus/tokens"])
    assert tokens > 5_000 and run.data.params["corpus/tokens_to_see"] == str(2 * 8 * 64)
    assert float(run.data.params["corpus/passes"]) == pytest.approx(2 * 8 * 64 / tokens, abs=1e-4)
    assert run.data.metrics["corpus/passes"] == pytest.approx(2 * 8 * 64 / tokens)
    assert run.info.status == "FINISHED"


def test_benchmark_reports_the_corpus_build(reference, tmp_path, data_dir):
    from electra_ablate.bench import cli

    path, ref = reference
    out = tmp_path / "bench.md"
    rep = cli.main(["--quick", "--models", "tiny", "--sections", "build", "--seq-len", "64", "--build-workers", "2",
                      "--build-paths", str(path), "--data-dir", str(data_dir), "--out", str(out)])
    (row,) = rep.build
    assert row["tokens"] == ref.meta["num_tokens"] and row["examples"] == ref.meta["num_examples"]
    assert row["workers"] == 2 and row["cpu_s"] > 0 and row["tokens_per_s"] > 0
    text = out.read_text()
    assert "## Corpus build" in text and f"| head.txt | {path.stat().st_size / 2**20:.1f} | 2 |" in text
