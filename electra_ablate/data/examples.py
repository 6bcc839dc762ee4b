"""Pre-training examples from tokenized lines, as google-research/electra `build_pretraining_dataset.py`.

The lines of one document are accumulated until a target length is reached (the full `max_seq_length`, or
with probability `short_seq_prob` a random one in [5, max_seq_length]); the lines are then split into two
segments `[CLS] A [SEP] B [SEP]` (with 10% chance a single segment, "as in classification tasks").
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

# Reference ExampleBuilder._create_example: "small chance to only have one segment as in classification tasks".
SINGLE_SEGMENT_PROB = 0.1
# Reference: random.randint(5, max_length) for a short target length.
MIN_TARGET_LENGTH = 5


class Example(NamedTuple):
    input_ids: list[int]  # [CLS] A [SEP] (B [SEP]), unpadded, at most max_seq_length
    segment_a_end: int  # len([CLS] A [SEP]): token type 0 before it, 1 from it to the end
    target_length: int  # the length this example was accumulated towards (short with prob short_seq_prob)


class ExampleBuilder:
    """Turns a stream of tokenized lines into pre-training examples, as the reference's ExampleBuilder.

    `add_line(ids)` takes the token ids of one line (an empty list = document boundary) and returns an
    Example when one is complete; `flush()` returns the pending partial example at the end of the corpus.
    """

    def __init__(self, max_length: int, short_seq_prob: float, cls_id: int, sep_id: int, rng: random.Random):
        self.max_length = max_length
        self.short_seq_prob = short_seq_prob
        self.cls_id, self.sep_id = cls_id, sep_id
        self.rng = rng
        self._sentences: list[list[int]] = []
        self._length = 0
        # Reference: the first example always targets max_length; later ones are redrawn after each example.
        self._target_length = max_length

    def add_line(self, ids: Sequence[int]) -> Example | None:
        if not ids:
            # Reference: an empty line ends the document, and with it the pending example however short.
            return self.flush()
        self._sentences.append(list(ids))
        self._length += len(ids)
        if self._length >= self._target_length:
            return self._create_example()
        return None

    def flush(self) -> Example | None:
        return self._create_example() if self._length else None

    def _create_example(self) -> Example:
        rng = self.rng
        if rng.random() < SINGLE_SEGMENT_PROB:
            first_target = self.max_length * 1000  # never reached: every line goes to segment A
        else:
            # Reference: -3 for the [CLS]/[SEP]/[SEP] not yet in the text.
            first_target = (self._target_length - 3) // 2
        first: list[int] = []
        second: list[int] = []
        for sentence in self._sentences:
            # Reference: a line joins A if A is empty, if it keeps A under its target, or (while B is still
            # empty and A is under target) on a coin flip when it would push A over.
            if (
                not first
                or len(first) + len(sentence) < first_target
                or (not second and len(first) < first_target and rng.random() < 0.5)
            ):
                first += sentence
            else:
                second += sentence
        # Reference truncation: to max_length (not the target), leaving room for [CLS] and the [SEP]s.
        first = first[: self.max_length - 2]
        second = second[: max(0, self.max_length - len(first) - 3)]
        target_length = self._target_length

        self._sentences, self._length = [], 0
        # Reference: the next example gets a random shorter target with probability short_seq_prob.
        if rng.random() < self.short_seq_prob:
            self._target_length = rng.randint(MIN_TARGET_LENGTH, self.max_length)
        else:
            self._target_length = self.max_length

        ids = [self.cls_id, *first, self.sep_id]
        segment_a_end = len(ids)
        if second:
            ids += [*second, self.sep_id]
        return Example(ids, segment_a_end, target_length)
