"""BERT's special tokens and their ids in a vocabulary: built by the data from its vocab.txt, used by the
objectives (which positions may be masked, the [MASK] id) and the generators (which ids never to propose)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

# In the order of SpecialIds' fields. BERT's vocab.txt lists them, [PAD] first so that its id is 0.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class SpecialIds(NamedTuple):
    pad: int
    unk: int
    cls: int
    sep: int
    mask: int

    @classmethod
    def from_vocab(cls, tokens: Sequence[str]) -> SpecialIds:
        """The ids of SPECIAL_TOKENS in `tokens`, the vocabulary in id order (line i of vocab.txt = id i)."""
        return cls(*(tokens.index(t) for t in SPECIAL_TOKENS))
