"""Tests of the deterministic WordPiece learner (wordpiece.py) and the vocabulary `train_vocab` writes."""

from __future__ import annotations

from collections import Counter

import pytest

from electra_ablate.common.tokens import SPECIAL_TOKENS
from electra_ablate.data import tokenizer as T
from electra_ablate.data.cache import train_vocab
from electra_ablate.data.errors import DataError
from electra_ablate.data.text import iter_corpus_lines
from electra_ablate.data import wordpiece as W

SPECIALS = list(SPECIAL_TOKENS)


def test_merges_most_frequent_pair_with_lexicographic_tie_break():
    # ab x3, abc x2, bc x2: pairs (a,##b)=5, (##b,##c)=2, (b,##c)=2. Merge 1 is "ab"; then (ab,##c) and
    # (b,##c) tie at 2 and the smaller pair of strings, ("ab", "##c"), goes first.
    counts = {"ab": 3, "abc": 2, "bc": 2}
    vocab = W.learn_vocab(counts, len(SPECIALS) + 8, SPECIALS)
    assert vocab == [*SPECIALS, "a", "b", "c", "##b", "##c", "ab", "abc", "bc"]
    assert W.learn_vocab(counts, len(SPECIALS) + 7, SPECIALS)[-1] == "abc"  # stops at the requested size
    # Nothing depends on the order the counts come in.
    assert W.learn_vocab(dict(reversed(list(counts.items()))), len(SPECIALS) + 8, SPECIALS) == vocab


def test_rare_characters_and_overlong_words_do_not_vote():
    counts = {"aé": 1, "ab": 5, "ba": 4, "aaaa": 1}
    # With an alphabet of 2 the rare "é" is dropped, and so is the word holding it (it encodes to [UNK]);
    # "aaaa" is longer than max_input_chars_per_word=3, so (##a, ##a) never forms.
    vocab = W.learn_vocab(counts, 100, SPECIALS, limit_alphabet=2, max_input_chars_per_word=3)
    assert "é" not in "".join(vocab) and "##aa" not in vocab
    assert vocab == [*SPECIALS, "a", "b", "##a", "##b", "ab", "ba"]


def test_too_small_a_size_is_a_data_error_naming_the_key(tmp_path):
    with pytest.raises(W.VocabTooSmall):
        W.learn_vocab({"abc": 1}, len(SPECIALS) + 2, SPECIALS)
    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n")
    with pytest.raises(DataError, match="data.train_vocab_size=12 is too small"):
        train_vocab(corpus, tmp_path / "cache", 12)


def one_call_per_line(tok, lines) -> Counter:
    return Counter(w for line in lines
                   for w, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(line)))


def test_count_words_equals_the_tokenizer_one_line_at_a_time(data_dir):
    tok = T._bert_tokenizer(T.models.WordPiece(unk_token="[UNK]"), lowercase=True)
    # Unicode whitespace and control characters on which str.split and the pre-tokenizer could disagree.
    odd = ["a\x1cb\x1dc\x1ed\x1ff", "x\x85y\u2028z\u2029w", "no\xa0break\u3000ideo\u200bzero", "tab\tv\x0bf\x0c"]
    lines = ["Héllo, World!", "naïve\tcafé  ﬁne", "北京 is big", "end.", *odd] * 300  # more than one block
    blocked = W.count_words(lines, tok.normalizer, tok.pre_tokenizer)
    assert blocked == one_call_per_line(tok, lines) and blocked["hello"] == 300 and blocked["北"] == 300
    corpus = [line for line in iter_corpus_lines(data_dir / "corpus" / "enwiki_sample_5mb.txt", 300) if line]
    assert W.count_words(corpus, tok.normalizer, tok.pre_tokenizer) == one_call_per_line(tok, corpus)


def test_trained_vocab_is_a_wordpiece_vocab_that_covers_its_corpus(data_dir, tmp_path):
    corpus = data_dir / "corpus" / "enwiki_sample_5mb.txt"
    path = train_vocab(corpus, tmp_path, 1000, max_docs=300)
    tokens = T.read_vocab(path)
    assert tokens[:5] == SPECIALS and len(tokens) == 1000 and len(set(tokens)) == 1000
    tok = T.load_tokenizer(path)
    words = W.count_words((line for line in iter_corpus_lines(corpus, 300) if line), tok.normalizer,
                          tok.pre_tokenizer)
    alphabet = {t for t in tokens if len(t) == 1}
    for word in words:
        if set(word) <= alphabet:  # every character known: the word must encode without [UNK]
            pieces = tok.encode(word, add_special_tokens=False).tokens
            assert "[UNK]" not in pieces and pieces[0][0] == word[0], (word, pieces)
            assert all(p.startswith("##") for p in pieces[1:]), (word, pieces)
    assert any(t.startswith("##") and len(t) > 3 for t in tokens)  # merged continuation pieces exist
