"""Tests of the pre-training data pipeline on the tiny hermetic corpus and BERT-layout vocabulary (conftest),
and of its example statistics on the real Wikipedia sample (`realdata`)."""

from __future__ import annotations

import lzma
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from pytorch_lightning.callbacks import ModelCheckpoint

from electra_ablate.common.tokens import SPECIAL_TOKENS, SpecialIds
from electra_ablate.data import tokenizer as T
from electra_ablate.data.cache import _ARRAYS, build_or_load
from electra_ablate.data.errors import DataError
from electra_ablate.data.examples import ExampleBuilder
from electra_ablate.data.module import PretrainBatches, PretrainDataModule, collate
from electra_ablate.data.text import iter_corpus_lines

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ["ELECTRA_ABLATE_DATA"])  # conftest: the tiny hermetic data folder
CORPUS = DATA / "corpus" / "enwiki_sample_5mb.txt"
VOCAB = DATA / "vocab" / "bert-base-uncased-vocab.txt"
CLS, SEP, PAD = 101, 102, 0
VOCAB_SIZE = len(VOCAB.read_text(encoding="utf-8").splitlines())


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """The whole tiny corpus at the default settings (under 1 s to build)."""
    return build_or_load(corpus=CORPUS, vocab_file=VOCAB, cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def real_sample(tmp_path_factory, real_data_dir):
    """The whole real 5 MB sample at the default settings (about 1 s to build)."""
    return build_or_load(corpus=real_data_dir / "corpus" / "enwiki_sample_5mb.txt",
                         vocab_file=real_data_dir / "vocab" / "bert-base-uncased-vocab.txt",
                         cache_dir=tmp_path_factory.mktemp("cache"))


def small_dm(cache_dir, **kw) -> PretrainDataModule:
    args = dict(corpus=str(CORPUS), vocab_file=str(VOCAB), cache_dir=str(cache_dir), max_seq_length=64,
                max_docs=150, batch_size=4, seed=0, num_workers=0)
    return PretrainDataModule(**{**args, **kw})


def head_corpus(path: Path, docs: int) -> str:
    """The first `docs` documents of the sample as text."""
    out, n = [], 0
    with open(CORPUS, encoding="utf-8") as f:
        for line in f:
            out.append(line)
            n += not line.strip()
            if n == docs:
                break
    return "".join(out)


# --- tokenizer and vocabulary -------------------------------------------------------------------------------


def test_tokenizer_matches_reference_wordpiece():
    # transformers' legacy BasicTokenizer + WordpieceTokenizer are line-by-line ports of the reference's
    # tokenization.py (FullTokenizer); max_input_chars_per_word=200 as in the reference.
    legacy = pytest.importorskip("transformers.models.bert.tokenization_bert_legacy")
    vocab = legacy.load_vocab(str(VOCAB))
    basic = legacy.BasicTokenizer(do_lower_case=True)
    wordpiece = legacy.WordpieceTokenizer(vocab, unk_token="[UNK]", max_input_chars_per_word=200)
    lines = [line for line in iter_corpus_lines(CORPUS, max_docs=80) if line]
    lines += ["Literal [SEP] and [MASK] stay text", "Crème brûlée, naïve café", "x" * 150, "中文字"]
    ours = T._encode_lines(T.load_tokenizer(VOCAB), lines)
    ref = [[vocab[p] for w in basic.tokenize(line) for p in wordpiece.tokenize(w)] for line in lines]
    assert ours == ref


def test_special_tokens_of_bert_vocab():
    assert T.special_tokens(VOCAB) == SpecialIds(pad=0, unk=100, cls=101, sep=102, mask=103)


def test_vocab_errors_name_file_and_problem(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        T.load_tokenizer(tmp_path / "nope.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(DataError, match=r"empty\.txt is empty"):
        T.load_tokenizer(empty)
    no_mask = tmp_path / "no_mask.txt"
    no_mask.write_text("".join(t + "\n" for t in VOCAB.read_text().splitlines() if t != "[MASK]"))
    with pytest.raises(DataError, match=r"no_mask\.txt lacks the special token\(s\) \[MASK\];") as err:
        small_dm(tmp_path / "cache", vocab_file=str(no_mask)).prepare()
    assert "train_vocab_size" in str(err.value)  # the fix is named


def test_corpus_errors_name_path_and_fix(tmp_path):
    for corpus, problem in [(tmp_path / "missing.txt", "does not exist"), (tmp_path / "empty.txt", "is empty"),
                            (tmp_path / "bad.txt.xz", "cannot be read")]:
        if problem == "is empty":
            corpus.write_text("")
        elif problem == "cannot be read":
            corpus.write_bytes(b"not xz data at all")
        with pytest.raises(DataError, match=problem) as err:
            small_dm(tmp_path / "cache", corpus=str(corpus)).prepare()
        assert str(corpus) in str(err.value) and "ELECTRA_ABLATE_DATA" in str(err.value)
    assert not (tmp_path / "cache" / "pretrain").exists() or not any((tmp_path / "cache" / "pretrain").iterdir())


def test_bad_config_fails_before_compute(tmp_path):
    with pytest.raises(DataError, match="max_seq_length=3"):
        small_dm(tmp_path, max_seq_length=3)
    with pytest.raises(DataError, match="short_seq_prob=1.5"):
        small_dm(tmp_path, short_seq_prob=1.5)
    with pytest.raises(DataError, match="fewer than data.batch_size=10000"):
        small_dm(tmp_path, max_docs=2, batch_size=10_000).prepare()


# --- examples ----------------------------------------------------------------------------------------------


def test_examples_follow_the_reference_layout(sample):
    ids = np.asarray(sample.input_ids, dtype=np.int64)  # (N, 128)
    n, T = ids.shape
    lengths, a_end = sample.lengths, sample.segment_a_end
    rows = np.arange(n)
    pos = np.arange(T)[None, :]
    assert T == 128 and n == sample.meta["num_examples"] > 900
    assert lengths.max() <= T and lengths.min() >= 3
    assert (ids[:, 0] == CLS).all()
    assert (ids[rows, lengths - 1] == SEP).all() and (ids[rows, a_end - 1] == SEP).all()
    assert ((pos >= lengths[:, None]) == (ids == PAD)).all()  # padded with [PAD] exactly after the end
    assert (a_end >= 3).all() and (a_end <= lengths).all()
    two = a_end < lengths
    assert (lengths[two] - a_end[two] >= 2).all()  # B is never empty when present: B [SEP]
    # [CLS] and [SEP] appear only where the builder put them (literal "[SEP]" text is split into pieces).
    assert ((ids == CLS).sum(1) == 1).all()
    assert ((ids == SEP).sum(1) == 1 + two).all()
    assert 0.3 < two.mean() < 0.9 and (~two).any()
    # Token counts are the word pieces of the text: every stored non-special token was counted.
    text = ids[(ids != PAD) & (ids != CLS) & (ids != SEP)]
    assert sample.token_counts.sum() == sample.meta["num_tokens"] >= len(text)
    assert (sample.token_counts[np.unique(text)] > 0).all() and sample.token_counts[PAD] == 0


@pytest.mark.realdata
def test_short_target_lengths_follow_short_seq_prob(real_sample):
    targets, lengths = real_sample.target_lengths, real_sample.lengths
    short = targets < 128
    assert targets[0] == 128  # reference: the first example always aims at max_seq_length
    assert targets.min() >= 5 and targets.max() == 128
    # 7780 examples: the std of the fraction is 0.0025, so 0.05 +- 0.015 separates it from BERT's 0.1.
    assert abs(short.mean() - 0.05) < 0.015
    # Whole lines are accumulated and truncation is to max_seq_length (reference), so a short target gives a
    # shorter example only through line granularity: far fewer of them fill all 128 positions.
    assert (lengths[short] == 128).mean() < 0.7 * (lengths[~short] == 128).mean()


def test_builder_accumulates_splits_and_truncates():
    # Token id = 1000 * line + position, so each example shows which lines it took and in what order.
    lines = [[1000 * i + k for k in range(n)] for i, n in enumerate([10, 10, 10, 10, 10, 10, 10, 300, 10])]
    builder = ExampleBuilder(max_length=32, short_seq_prob=0.0, cls_id=CLS, sep_id=SEP, rng=random.Random(0))
    examples = [e for e in map(builder.add_line, lines) if e] + [builder.flush()]
    first_lines = []
    for ex in examples:
        assert len(ex.input_ids) <= 32 and ex.target_length == 32
        a = ex.input_ids[1 : ex.segment_a_end - 1]
        b = ex.input_ids[ex.segment_a_end : -1]
        assert a[0] % 1000 == 0  # A starts at a line start
        if b:
            assert b[0] % 1000 == 0 and b[0] // 1000 > a[-1] // 1000  # B starts at a later line
        first_lines.append(a[0] // 1000)
    # Lines 0-3 (40 >= 32 tokens), 4-7 (the 300-token line completes it), line 8 flushed at the end.
    assert first_lines == [0, 4, 8]
    long_example = examples[1]
    assert len(long_example.input_ids) == 32  # truncated to max_length, as the reference does
    assert examples[2].input_ids == [CLS, *lines[8], SEP] and examples[2].segment_a_end == 12
    # A document boundary ends the pending example however short.
    builder = ExampleBuilder(max_length=32, short_seq_prob=0.0, cls_id=CLS, sep_id=SEP, rng=random.Random(0))
    assert builder.add_line([5, 6]) is None
    assert builder.add_line([]).input_ids == [CLS, 5, 6, SEP]
    assert builder.add_line([]) is None


def test_build_is_deterministic_and_loads_without_tokenizing(tmp_path, monkeypatch):
    a = small_dm(tmp_path / "a")
    b = small_dm(tmp_path / "b")
    a.prepare(), b.prepare()
    assert a.cache.directory.name == b.cache.directory.name
    for name in _ARRAYS:
        np.testing.assert_array_equal(getattr(a.cache, name), getattr(b.cache, name))

    def no_tokenizing(*args):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(T, "_encode_lines", no_tokenizing)
    again = small_dm(tmp_path / "a")
    again.prepare()
    assert again.num_examples == a.num_examples and again.vocab_size == VOCAB_SIZE
    assert isinstance(again.cache.input_ids, np.memmap)
    assert again.vocab_path.read_text() == VOCAB.read_text()


def test_every_input_changes_the_cache_key(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(head_corpus(CORPUS, 30))
    vocab = tmp_path / "vocab.txt"
    shutil.copyfile(VOCAB, vocab)
    base = dict(corpus=corpus, vocab_file=vocab, cache_dir=tmp_path / "c", max_seq_length=64)
    keys = {build_or_load(**base).directory.name}
    for change in [dict(lowercase=False), dict(max_seq_length=65), dict(short_seq_prob=0.5),
                   dict(build_seed=1), dict(max_docs=10), dict(train_vocab_size=500)]:
        keys.add(build_or_load(**{**base, **change}).directory.name)
    with open(vocab, "a") as f:
        f.write("newtoken\n")
    keys.add(build_or_load(**base).directory.name)
    with open(corpus, "a") as f:
        f.write("\nOne more document.\n")
    keys.add(build_or_load(**base).directory.name)
    assert len(keys) == 9
    assert len(list((tmp_path / "c" / "pretrain").iterdir())) == 9


def test_a_copied_data_folder_finds_the_cache(tmp_path):
    from electra_ablate.data import cache

    (tmp_path / "a" / "corpus").mkdir(parents=True)
    (tmp_path / "a" / "corpus" / "c.txt").write_text(head_corpus(CORPUS, 30))
    settings = dict(vocab_file=VOCAB, cache_dir=tmp_path / "cache", max_seq_length=64, train_vocab_size=500)
    first = build_or_load(corpus=tmp_path / "a" / "corpus" / "c.txt", **settings)
    # A fresh copy elsewhere: another path, a new modification time, the same bytes.
    shutil.copytree(tmp_path / "a", tmp_path / "b", copy_function=shutil.copyfile)
    copy = tmp_path / "b" / "corpus" / "c.txt"
    os.utime(copy, ns=(copy.stat().st_atime_ns, copy.stat().st_mtime_ns + 10**9))
    again = build_or_load(corpus=copy, **settings)
    assert again.directory == first.directory
    assert [len(list((tmp_path / "cache" / d).iterdir())) for d in ("pretrain", "vocab")] == [1, 1]
    # Entries built when the key held the file's path and modification time are still used for that file.
    legacy = cache._hash(cache._key_inputs(cache._legacy_corpus_identity(copy), again.vocab_path, True, 64, 0.05,
                                           12345, None, 500))
    (first.directory).rename(first.directory.with_name(legacy))
    assert build_or_load(corpus=copy, **settings).directory.name == legacy


def test_xz_corpus_gives_the_same_examples(tmp_path):
    text = head_corpus(CORPUS, 40)
    (tmp_path / "c.txt").write_text(text)
    with lzma.open(tmp_path / "c.txt.xz", "wt", encoding="utf-8") as f:
        f.write(text)
    txt = build_or_load(corpus=tmp_path / "c.txt", vocab_file=VOCAB, cache_dir=tmp_path / "cache")
    xz = build_or_load(corpus=tmp_path / "c.txt.xz", vocab_file=VOCAB, cache_dir=tmp_path / "cache")
    assert txt.directory != xz.directory and txt.meta["num_docs"] == 40
    for name in _ARRAYS:
        np.testing.assert_array_equal(getattr(txt, name), getattr(xz, name))
    # max_docs cuts the same corpus at the same place.
    capped = build_or_load(corpus=CORPUS, vocab_file=VOCAB, cache_dir=tmp_path / "cache", max_docs=40)
    np.testing.assert_array_equal(capped.input_ids, txt.input_ids)


def test_failed_build_leaves_no_cache(tmp_path, monkeypatch):
    calls = []
    real = T._encode_lines

    def fail_second_time(tokenizer, lines):
        calls.append(len(lines))
        if len(calls) == 2:
            raise RuntimeError("disk full")
        return real(tokenizer, lines)

    monkeypatch.setattr(T, "_LINES_PER_ENCODE", 50)
    monkeypatch.setattr(T, "_encode_lines", fail_second_time)
    with pytest.raises(RuntimeError, match="disk full"):
        small_dm(tmp_path).prepare()
    assert list((tmp_path / "pretrain").iterdir()) == []
    monkeypatch.setattr(T, "_encode_lines", real)
    assert small_dm(tmp_path).prepare().meta["num_docs"] == 150


def test_trained_vocabulary(tmp_path):
    dm = small_dm(tmp_path, train_vocab_size=1500, max_docs=100)
    dm.prepare()
    tokens = dm.vocab_path.read_text().splitlines()
    assert tokens[:5] == list(SPECIAL_TOKENS) and dm.special == SpecialIds(0, 1, 2, 3, 4)
    assert dm.vocab_size == len(tokens) <= 1500 and len(tokens) > 1000
    assert dm.cache.input_ids.max() < dm.vocab_size
    assert (np.asarray(dm.cache.input_ids)[:, 0] == 2).all()
    unk_rate = dm.token_counts[1] / dm.token_counts.sum()
    assert unk_rate < 0.01  # the vocabulary fits its corpus
    again = small_dm(tmp_path, train_vocab_size=1500, max_docs=100)
    again.prepare()
    assert again.cache.directory == dm.cache.directory
    assert len(list((tmp_path / "vocab").iterdir())) == 1


# --- loader ------------------------------------------------------------------------------------------------


def take(loader, n):
    it = iter(loader)
    return [next(it) for _ in range(n)]


def test_batches_pad_to_longest_and_rebuild_token_types(tmp_path):
    dm = small_dm(tmp_path, batch_size=8)
    dm.prepare()
    cache = dm.cache
    for batch in take(dm.train_dataloader(), 20):
        ids, mask, types = batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
        assert ids.dtype == mask.dtype == types.dtype == torch.long and ids.shape == mask.shape == types.shape
        lengths = mask.sum(1)
        assert ids.shape[1] == lengths.max() <= 64  # padded to the longest in the batch only
        assert ((ids == PAD) == (mask == 0)).all() and (types[mask == 0] == 0).all()
        for row, n in zip(ids, lengths.tolist()):
            match = np.flatnonzero((cache.lengths == n) & (np.asarray(cache.input_ids)[:, :n] == row[:n].numpy()
                                                                  ).all(1))
            assert len(match) >= 1  # every row is a stored example
        seps = (ids == SEP).long().cumsum(1)
        # Token type 1 exactly after the first [SEP] and up to the second one.
        assert (types == ((seps >= 1) & mask.bool() & ~((seps == 1) & (ids == SEP)))).all()


def test_order_is_a_seeded_permutation_per_epoch(tmp_path):
    dm = small_dm(tmp_path, batch_size=8)
    dm.prepare()
    n = dm.num_examples
    per_epoch = n // 8
    stream = PretrainBatches(dm.cache.directory, n, 8, seed=0)
    rows = [stream.rows(g) for g in range(2 * per_epoch)]
    first, second = np.concatenate(rows[:per_epoch]), np.concatenate(rows[per_epoch:])
    assert len(set(first.tolist())) == len(first) == per_epoch * 8  # no repeats within an epoch
    assert not np.array_equal(first, second)  # each epoch gets its own permutation
    other_seed = PretrainBatches(dm.cache.directory, n, 8, seed=1)
    assert not np.array_equal(first, np.concatenate([other_seed.rows(g) for g in range(per_epoch)]))
    # The loader yields exactly these rows in this order, across the epoch boundary.
    got = take(PretrainBatches(dm.cache.directory, n, 8, seed=0, start=per_epoch - 1), 2)
    for batch, g in zip(got, [per_epoch - 1, per_epoch]):
        torch.testing.assert_close(batch, collate(dm.cache, rows[g]))
    # Two ranks take the global batches in turn: rank r's step s is global batch 2s + r.
    for rank in (0, 1):
        got = take(PretrainBatches(dm.cache.directory, n, 8, seed=0, start=3, rank=rank, world_size=2), 2)
        for batch, g in zip(got, [6 + rank, 8 + rank]):
            torch.testing.assert_close(batch, collate(dm.cache, rows[g]))


def test_workers_do_not_change_the_order(tmp_path):
    dm = small_dm(tmp_path)
    dm.prepare()
    serial = take(dm.train_dataloader(), 6)
    dm2 = small_dm(tmp_path, num_workers=2)
    parallel = take(dm2.train_dataloader(), 6)
    for a, b in zip(serial, parallel):
        torch.testing.assert_close(a, b)


class Recorder(pl.LightningModule):
    """A linear layer on the batch's token sum; records the input_ids of every batch it trains on."""

    def __init__(self, manual: bool):
        super().__init__()
        self.automatic_optimization = not manual
        self.a, self.b = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
        self.seen: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch["input_ids"].clone())
        x = batch["input_ids"].float().sum().reshape(1, 1) / 1e6
        if self.automatic_optimization:
            return self.b(self.a(x)).sum()
        # Two optimizers stepping per batch, as the adversarial/two-stage algorithms do: global_step
        # advances twice per batch, so it must not be used to count batches.
        for net, opt in zip((self.a, self.b), self.optimizers()):
            opt.zero_grad()
            self.manual_backward(net(x).sum())
            opt.step()

    def configure_optimizers(self):
        if self.automatic_optimization:
            return torch.optim.SGD(self.parameters(), lr=0.01)
        return torch.optim.SGD(self.a.parameters(), lr=0.01), torch.optim.SGD(self.b.parameters(), lr=0.01)


def fit(tmp_path, manual: bool, max_batches: int, ckpt_path=None, every=None):
    steps_per_batch = 2 if manual else 1
    callbacks = []
    if every:
        callbacks.append(ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="{step}", save_top_k=-1,
                                         every_n_train_steps=every * steps_per_batch))
    trainer = pl.Trainer(max_steps=max_batches * steps_per_batch, callbacks=callbacks, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                         enable_checkpointing=bool(every), default_root_dir=tmp_path)
    model = Recorder(manual)
    trainer.fit(model, datamodule=small_dm(tmp_path / "cache", seed=3), ckpt_path=ckpt_path)
    return model.seen


@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
# The resumed Trainer has no checkpoint callback on purpose (only the data module's state matters here).
@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`, callbacks used to create:UserWarning")
def test_resume_continues_with_the_next_batch(tmp_path, manual):
    full = fit(tmp_path, manual, max_batches=7, every=4)
    ckpt = tmp_path / "ckpt" / f"step={4 * (2 if manual else 1)}.ckpt"
    state = torch.load(ckpt, weights_only=False)["PretrainDataModule"]
    assert state["batches_consumed"] == 4
    resumed = fit(tmp_path, manual, max_batches=7, ckpt_path=ckpt)
    assert len(full) == 7 and len(resumed) == 3
    for a, b in zip(full[4:], resumed):
        assert torch.equal(a, b)
    assert not torch.equal(full[0], resumed[0])


def test_a_second_fit_continues_the_stream(tmp_path):
    # A later stage trained by a new Trainer on the same DataModule takes the batches after the first's.
    full = fit(tmp_path, manual=False, max_batches=5)
    dm = small_dm(tmp_path / "cache", seed=3)
    seen = []
    for steps in (3, 2):
        model = Recorder(manual=False)
        pl.Trainer(max_steps=steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
                   enable_checkpointing=False, accelerator="cpu", default_root_dir=tmp_path).fit(model, datamodule=dm)
        seen += model.seen
    assert dm.batches_consumed == 5
    assert all(torch.equal(a, b) for a, b in zip(full, seen, strict=True))


def test_resume_with_other_data_stream_fails(tmp_path):
    dm = small_dm(tmp_path)
    dm.prepare()
    state = dm.state_dict()
    assert state["batches_consumed"] == 0
    with pytest.raises(DataError, match="same data config"):
        small_dm(tmp_path, batch_size=5).load_state_dict(state)
    resumed = small_dm(tmp_path)
    resumed.load_state_dict({**state, "batches_consumed": 3})
    torch.testing.assert_close(take(resumed.train_dataloader(), 1)[0], take(dm.train_dataloader(), 4)[3])


def test_resume_follows_the_examples_not_the_cache_entry_name(tmp_path):
    # The same text in other bytes (compressed, so another cache entry) is the same stream; a checkpoint from
    # before the digest was saved names its entry, whose digest is read when it is still in the cache.
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(head_corpus(corpus, 150))
    dm = small_dm(tmp_path / "cache", corpus=str(corpus))
    dm.prepare()
    state = {**dm.state_dict(), "batches_consumed": 3}
    with lzma.open(tmp_path / "corpus.txt.xz", "wt", encoding="utf-8") as f:
        f.write(corpus.read_text())
    copied = small_dm(tmp_path / "cache", corpus=str(tmp_path / "corpus.txt.xz"))
    copied.prepare()
    assert copied.cache.directory != dm.cache.directory
    copied.load_state_dict(state)
    torch.testing.assert_close(take(copied.train_dataloader(), 1)[0], take(dm.train_dataloader(), 4)[3])
    older = {k: v for k, v in state.items() if k != "examples_sha256"}
    small_dm(tmp_path / "cache", corpus=str(tmp_path / "corpus.txt.xz")).load_state_dict(older)
    other = small_dm(tmp_path / "cache", max_docs=100)
    for saved in (state, older):
        with pytest.raises(DataError, match=f"examples of cache entry {dm.cache.directory.name}"):
            other.load_state_dict(saved)
    shutil.rmtree(dm.cache.directory)  # an old checkpoint whose entry is gone cannot be matched
    with pytest.raises(DataError, match="same data config"):
        copied.load_state_dict(older)


def test_real_config_instantiates_the_datamodule(tmp_path):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("pretrain", overrides=[f"paths.data_dir={DATA}", f"paths.cache_dir={tmp_path}",
                                             "data.max_docs=20", "data.batch_size=2", "seed=5"])
    dm = instantiate(cfg.data, cache_dir=cfg.paths.cache_dir, seed=cfg.seed, num_workers=0, pin_memory=False)
    assert isinstance(dm, PretrainDataModule) and dm.short_seq_prob == 0.05 and dm.seed == 5
    dm.prepare()
    assert dm.special.mask == 103 and dm.vocab_size == VOCAB_SIZE and dm.token_counts.dtype == torch.int64
    assert dm.token_counts.shape == (VOCAB_SIZE,)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        wiki = compose("pretrain", overrides=[f"paths.data_dir={DATA}", "data=wiki"]).data
    assert wiki.corpus == f"{DATA}/corpus/enwiki_2014_slice.txt.xz" and wiki.batch_size == 128
    assert wiki._target_ == "electra_ablate.data.module.PretrainDataModule" and wiki.short_seq_prob == 0.05
