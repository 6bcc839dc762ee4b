"""A deterministic WordPiece vocabulary learner: the same corpus and options give the same vocab.txt, byte for
byte, in any process on any machine.

Why not `tokenizers.trainers.WordPieceTrainer`: it learns BPE merges and breaks ties between equally frequent
pairs by internal ids that follow Rust hash-map iteration order, which is seeded per process, so two builds
of one corpus give different pieces and different ids (huggingface/tokenizers#1794; the fix proposed in
PR 2066 is not in tokenizers 0.23.3, the newest release when this was written). Here the same learning rule
runs over word counts with every choice pinned down:

- words are produced by tokenizers' own BERT normalizer and pre-tokenizer (the ones `load_tokenizer` encodes
  with), so training and encoding see the same words;
- the alphabet is the `limit_alphabet` most frequent characters (ties: lower code point); a word holding a
  character outside it, or longer than the encoder's `max_input_chars_per_word`, encodes to [UNK] whatever
  the vocabulary, so it does not vote for merges;
- each step merges the most frequent adjacent pair of pieces (summed over words, weighted by word count),
  ties going to the lexicographically smallest (left, right) pair of strings, as in tokenizers' BPE trainer
  minus the hash-dependent ids; a continuation piece keeps BERT's `##` prefix (`##a` + `##b` = `##ab`);
- ids are canonical: the special tokens in the given order, then the alphabet's characters as word-initial
  pieces and the `##` forms of those that occur inside words (each sorted by code point), then the merged
  pieces in the order they were learned.

Encoding with the result is BERT's greedy longest-match-first WordPiece (reference `tokenization.py`), as for
any vocab.txt.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Sequence

from tokenizers.normalizers import Normalizer
from tokenizers.pre_tokenizers import PreTokenizer

PREFIX = "##"  # BERT's continuation prefix
_LINES_PER_CALL = 1024  # lines normalized and pre-tokenized per call into Rust


class VocabTooSmall(ValueError):
    """The requested size cannot hold the special tokens and the corpus alphabet."""


def count_words(lines: Iterable[str], normalizer: Normalizer, pre_tokenizer: PreTokenizer) -> Counter[str]:
    """How often each word occurs, as the tokenizer's `normalizer` and `pre_tokenizer` split the lines.

    Fast path with the same result for BERT's normalizer and pre-tokenizer: lines are normalized a block at
    a time (joined by newlines, which the normalizer turns into spaces, as it maps every character on its
    own), the normalized text is cut at whitespace and the pieces counted, and only each distinct piece goes
    through the pre-tokenizer, which splits it further at punctuation. Cutting at whitespace first does not
    change the words: `str.split` and the pre-tokenizer agree on whitespace once the normalizer has removed
    control characters (tests/test_wordpiece.py checks this on the corpus).
    """
    pieces: Counter[str] = Counter()
    block: list[str] = []
    for line in lines:
        block.append(line)
        if len(block) == _LINES_PER_CALL:
            pieces.update(normalizer.normalize_str("\n".join(block)).split())
            block.clear()
    if block:
        pieces.update(normalizer.normalize_str("\n".join(block)).split())
    counts: Counter[str] = Counter()
    for piece, n in pieces.items():
        for word, _ in pre_tokenizer.pre_tokenize_str(piece):
            counts[word] += n
    return counts


def learn_vocab(
    word_counts: Counter[str] | dict[str, int],
    vocab_size: int,
    special_tokens: Sequence[str],
    limit_alphabet: int = 1000,
    max_input_chars_per_word: int = 200,
) -> list[str]:
    """The vocabulary (index = id) learned from `word_counts`: at most `vocab_size` pieces, fewer only when
    every word is already a single piece. A pure function of its arguments."""
    chars: Counter[str] = Counter()
    for word, n in word_counts.items():
        for c in word:
            chars[c] += n
    alphabet = set(sorted(chars, key=lambda c: (-chars[c], c))[:limit_alphabet])
    words, freqs = _candidate_words(word_counts, alphabet, max_input_chars_per_word)

    # As tokenizers' trainer: every alphabet character as a word-initial piece, and the `##` forms that occur.
    nexts = sorted({s for w in words for s in w[1:]})
    vocab = [*special_tokens, *sorted(alphabet), *nexts]
    if len(vocab) > vocab_size:
        raise VocabTooSmall(
            f"a vocabulary of {vocab_size} cannot hold the {len(special_tokens)} special tokens and the "
            f"{len(vocab) - len(special_tokens)} characters and continuation characters of the corpus"
        )
    known = set(vocab)

    pair_count, pair_words = _pair_statistics(words, freqs)
    # Max-heap by count, then smallest (left, right); stale entries are skipped when popped.
    heap = [(-n, pair) for pair, n in pair_count.items()]
    heapq.heapify(heap)

    while len(vocab) < vocab_size and heap:
        neg, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -neg or neg == 0:
            continue
        merged = pair[0] + pair[1][len(PREFIX):]  # the right symbol is never word-initial: it carries the prefix
        if merged not in known:  # two pairs may spell one piece ("##a"+"##bc", "##ab"+"##c"): list it once
            known.add(merged)
            vocab.append(merged)
        for p in _apply_merge(pair, merged, words, freqs, pair_count, pair_words):
            n = pair_count[p]
            if n > 0:
                heapq.heappush(heap, (-n, p))
            else:
                del pair_count[p]  # gone from every word
                pair_words.pop(p, None)
    return vocab


def _candidate_words(word_counts: Counter[str] | dict[str, int], alphabet: set[str],
                     max_input_chars_per_word: int) -> tuple[list[list[str]], list[int]]:
    """Words that can become pieces, as lists of symbol strings ("c" first, "##c" after), and their counts."""
    words: list[list[str]] = []
    freqs: list[int] = []
    for word in sorted(word_counts):  # sorted only to fix the work order; the result does not depend on it
        if len(word) > max_input_chars_per_word or not set(word) <= alphabet:
            continue
        words.append([word[0], *(PREFIX + c for c in word[1:])])
        freqs.append(word_counts[word])
    return words, freqs


def _pair_statistics(words: list[list[str]], freqs: list[int]):
    """Weighted count of each adjacent pair of symbols, and the words (indices) it occurs in."""
    pair_count: dict[tuple[str, str], int] = {}
    pair_words: dict[tuple[str, str], set[int]] = {}
    for i, (w, n) in enumerate(zip(words, freqs)):
        for pair in zip(w, w[1:]):
            pair_count[pair] = pair_count.get(pair, 0) + n
            pair_words.setdefault(pair, set()).add(i)
    return pair_count, pair_words


def _merged(w: list[str], left: str, right: str, merged: str) -> list[str]:
    """`w` with non-overlapping occurrences of (left, right) merged, left to right."""
    new: list[str] = []
    j = 0
    while j < len(w):
        if j + 1 < len(w) and w[j] == left and w[j + 1] == right:
            new.append(merged)
            j += 2
        else:
            new.append(w[j])
            j += 1
    return new


def _apply_merge(pair: tuple[str, str], merged: str, words: list[list[str]], freqs: list[int],
                 pair_count: dict[tuple[str, str], int], pair_words: dict[tuple[str, str], set[int]]) -> set:
    """Merge `pair` in every word that holds it and update the pair statistics in place; returns the pairs
    whose count changed (to be pushed again, or dropped at zero)."""
    left, right = pair
    # Only pairs holding one of these symbols can change in a word (the rest keep their positions), so only
    # they are recounted: subtracted as they were and added as they are.
    touched = {left, right, merged}
    changed: set[tuple[str, str]] = set()
    for i in pair_words.pop(pair):
        w, n = words[i], freqs[i]
        new = _merged(w, left, right, merged)
        if len(new) == len(w):
            continue  # the pair left this word in an earlier merge
        for p in zip(w, w[1:]):
            if p[0] in touched or p[1] in touched:
                pair_count[p] -= n
                changed.add(p)
        for p in zip(new, new[1:]):
            if p[0] in touched or p[1] in touched:
                pair_count[p] = pair_count.get(p, 0) + n
                changed.add(p)
                pair_words.setdefault(p, set()).add(i)
        words[i] = new
    pair_count.pop(pair, None)
    changed.discard(pair)
    return changed
