"""The WordPiece vocabulary and tokenizer: reading a vocab.txt, BERT's tokenizer over it, its special tokens.

The tokenizer is the reference's FullTokenizer (google-research/electra `tokenization.py`) built from
`tokenizers` parts; lines are encoded a batch at a time, one call into its Rust thread pool per batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from electra_ablate.common.tokens import SPECIAL_TOKENS, SpecialIds
from electra_ablate.data.errors import DataError

# Reference tokenization.WordpieceTokenizer: words longer than this become [UNK] (tokenizers' default is 100).
MAX_INPUT_CHARS_PER_WORD = 200
_LINES_PER_ENCODE = 2048  # lines per encode_batch call: big enough for the Rust thread pool, small in memory


def read_vocab(vocab_file: str | Path) -> list[str]:
    """The tokens of a WordPiece vocab.txt in id order (line i = id i), validated for BERT's special tokens."""
    path = Path(vocab_file)
    fix = (
        "Set data.vocab_file to a WordPiece vocab.txt (one token per line, e.g. "
        "<paths.data_dir>/vocab/bert-base-uncased-vocab.txt), or set data.train_vocab_size > 0 to train one "
        "on the corpus."
    )
    if not path.is_file():
        raise DataError(f"Vocabulary file {path} does not exist. {fix}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"Vocabulary file {path} cannot be read as UTF-8 text ({err}). {fix}") from err
    # Reference tokenization.load_vocab: one token per line, surrounding whitespace stripped.
    tokens = [line.strip() for line in text.splitlines()]
    if not tokens:
        raise DataError(f"Vocabulary file {path} is empty. {fix}")
    missing = [t for t in SPECIAL_TOKENS if t not in tokens]
    if missing:
        raise DataError(
            f"Vocabulary file {path} lacks the special token(s) {' '.join(missing)}; ELECTRA needs all of "
            f"{' '.join(SPECIAL_TOKENS)}. Add them as lines of the file (BERT puts [PAD] on line 1 so its id "
            "is 0), or set data.train_vocab_size > 0 to train a vocabulary that has them."
        )
    seen: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if t in seen:
            raise DataError(
                f"Vocabulary file {path} lists {t!r} twice (lines {seen[t] + 1} and {i + 1}), so its id is "
                "ambiguous. Remove the duplicate line."
            )
        seen[t] = i
    return tokens


def _bert_tokenizer(model: models.Model, lowercase: bool) -> Tokenizer:
    tok = Tokenizer(model)
    # Reference BasicTokenizer: clean control chars, split CJK characters, lower-case and strip accents
    # together (strip_accents=None follows lowercase), then split on whitespace and punctuation.
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def load_tokenizer(vocab_file: str | Path, lowercase: bool = True) -> Tokenizer:
    """A BERT WordPiece tokenizer for `vocab_file`, equivalent to the reference's FullTokenizer.

    The special tokens are not registered as "added tokens", so literal text such as "[SEP]" in the corpus
    is split into "[", "sep", "]" as the reference does. `encode(a, b)` still adds [CLS]/[SEP] for pairs.
    """
    tokens = read_vocab(vocab_file)
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = _bert_tokenizer(
        models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD), lowercase
    )
    tok.post_processor = processors.BertProcessing(("[SEP]", vocab["[SEP]"]), ("[CLS]", vocab["[CLS]"]))
    return tok


def special_tokens(vocab_file: str | Path) -> SpecialIds:
    return SpecialIds.from_vocab(read_vocab(vocab_file))


def _encode_lines(tokenizer: Tokenizer, lines: list[str]) -> list[list[int]]:
    """Token ids of each line, without [CLS]/[SEP]; one call into the Rust thread pool per batch of lines."""
    return [e.ids for e in tokenizer.encode_batch_fast(lines, add_special_tokens=False)]


def _encoded_chunks(tokenizer: Tokenizer, lines: Iterator[str]) -> Iterator[list[list[int]]]:
    """Token ids per line in corpus order ([] for a document boundary), a chunk of lines at a time."""
    for chunk in iter(lambda: list(itertools.islice(lines, _LINES_PER_ENCODE)), []):
        encoded = iter(_encode_lines(tokenizer, [line for line in chunk if line]))
        yield [next(encoded) if line else [] for line in chunk]
