"""A tiny data folder laid out like the shared real one, written from a seeded generator in about a second.

The default test run uses it instead of ../shared/data, so it passes on a machine with no data at all. Its
files carry the real names (corpus/enwiki_sample_5mb.txt, vocab/bert-base-uncased-vocab.txt, glue/<Task>/*.tsv)
so that the shipped configs resolve against it unchanged; their content is small and synthetic:

- corpus: documents of pseudo-words built from syllables (Zipf-distributed, so a WordPiece learner finds real
  subword structure) mixed with English function words, one paragraph per line, a blank line between
  documents, as WikiExtractor writes the real slice; the .xz "slice" holds the same text compressed.
- vocab: BERT's layout where the code relies on it ([PAD]=0, [unused0..98], [UNK]=100, [CLS]=101, [SEP]=102,
  [MASK]=103), then characters, continuation pieces and whole words: every corpus word has a WordPiece split.
- glue: CoLA, SST-2, MRPC, STS-B and RTE train/dev in the official layouts described in
  ../shared/data/README.md (CoLA headerless, MRPC with a UTF-8 BOM, STS-B's ten columns), with labels that
  follow a rule of the text, so a fine-tuned model can learn them.
"""

from __future__ import annotations

import itertools
import lzma
import random
import shutil
import string
import tempfile
from pathlib import Path

SEED = 1234
NUM_DOCS = 600
VOCAB_SIZE = 2200  # >= 2100: tests/test_hf.py keeps the first 2100 lines, as it did of BERT's vocabulary
GLUE_ROWS = {"train": 128, "dev": 64}  # the largest max_train_examples / max_eval_examples tests use
GLUE_TASKS = ("CoLA", "SST-2", "MRPC", "STS-B", "RTE")

SYLLABLES = ("ka lo mi ren tor vas el an dur fi gal hen is jor kel mar nor ost pel quin ra sol tan ul vek "
             "win yar zel ber cha dom eth fro gui hal").split()
# Words a test names by value (test_hf encodes "the world was") are among them.
FUNCTION_WORDS = ("the of and in to a was is for on as by with from at that it his her their which world "
                  "were had has after first new two also one its into city state war team film").split()
# Words tests encode by value that the corpus need not hold (test_glue's "The cat sat.").
NAMED_WORDS = "cat sat dog ran hello".split()
POSITIVE, NEGATIVE = ("good", "bright", "warm", "fine"), ("bad", "dark", "cold", "poor")
PUNCTUATION = ".,;:()'\"-!?"


def lexicon(rng: random.Random, size: int = 2500) -> list[str]:
    """Distinct pseudo-words of 1-4 syllables, most frequent first (sampling follows a Zipf law on rank)."""
    words: dict[str, None] = {}
    while len(words) < size:
        words["".join(rng.choice(SYLLABLES) for _ in range(rng.choice((1, 2, 2, 3, 3, 4))))] = None
    return list(words)


class TextGenerator:
    def __init__(self, seed: int = SEED):
        self.rng = random.Random(seed)
        self.words = lexicon(self.rng)
        self.cum_weights = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(self.words))))

    def word(self) -> str:
        if self.rng.random() < 0.4:
            return self.rng.choice(FUNCTION_WORDS)
        return self.rng.choices(self.words, cum_weights=self.cum_weights)[0]

    def sentence(self, extra: tuple[str, ...] = ()) -> str:
        words = [self.word() for _ in range(self.rng.randint(4, 16))]
        for w in extra:
            words.insert(self.rng.randrange(len(words) + 1), w)
        if self.rng.random() < 0.2:
            words.insert(self.rng.randrange(len(words)), str(self.rng.randint(1800, 2014)))
        if self.rng.random() < 0.2:
            words[self.rng.randrange(len(words))] += ","
        text = " ".join(words)
        return text[0].upper() + text[1:] + "."

    def document(self) -> str:
        title = " ".join(self.rng.choices(self.words, cum_weights=self.cum_weights, k=self.rng.randint(1, 3))).title()
        paragraphs = [" ".join(self.sentence() for _ in range(self.rng.randint(1, 5)))
                      for _ in range(self.rng.randint(1, 8))]
        return "\n".join([title, *paragraphs]) + "\n"


def corpus_text(num_docs: int = NUM_DOCS, seed: int = SEED) -> str:
    gen = TextGenerator(seed)
    return "\n".join(gen.document() for _ in range(num_docs))


def vocab_tokens(size: int = VOCAB_SIZE, seed: int = SEED) -> list[str]:
    """BERT-layout vocabulary: specials at BERT's ids, characters, pieces, then the most frequent words."""
    tokens = ["[PAD]", *(f"[unused{i}]" for i in range(99)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = list(PUNCTUATION + string.digits + string.ascii_lowercase)
    tokens += chars + [f"##{c}" for c in string.digits + string.ascii_lowercase]
    tokens += [*FUNCTION_WORDS, *POSITIVE, *NEGATIVE, *NAMED_WORDS, *SYLLABLES, *(f"##{s}" for s in SYLLABLES)]
    tokens = list(dict.fromkeys(tokens))  # "a" is a character and a word: one line each
    seen = set(tokens)
    for word in lexicon(random.Random(seed)):
        if len(tokens) == size:
            break
        if word not in seen:
            tokens.append(word)
            seen.add(word)
    assert len(tokens) == size, f"the lexicon is too small for a {size}-token vocabulary"
    return tokens


def _rows(task: str, split: str, gen: TextGenerator) -> list[str]:
    """Rows of one GLUE file in its official layout (header included); labels follow a rule of the text."""
    rng = gen.rng
    rows = []
    for i in range(GLUE_ROWS[split]):
        label = i % 2  # balanced classes
        marker = (POSITIVE if label else NEGATIVE)[i // 2 % 4]
        if task == "CoLA":  # source, label, original judgement, sentence; no header
            rows.append(f"gj04\t{label}\t{'' if label else '*'}\t{gen.sentence((marker,))}")
        elif task == "SST-2":
            rows.append(f"{gen.sentence((marker,)).lower()[:-1]} \t{label}")
        elif task == "MRPC":
            a = gen.sentence()
            b = a if label else gen.sentence()
            rows.append(f"{label}\t{100000 + 2 * i}\t{100001 + 2 * i}\t{a}\t{b}")
        elif task == "STS-B":
            a = gen.sentence()
            score = rng.choice((0.0, 1.25, 2.5, 3.75, 5.0))
            b = a if score == 5.0 else gen.sentence()
            rows.append(f"{i}\tmain-captions\tMSRvid\t2012test\t{i:04d}\tnone\tnone\t{a}\t{b}\t{score:.3f}")
        elif task == "RTE":
            a = gen.sentence((marker,))
            rows.append(f"{i}\t{a}\t{gen.sentence((marker,))}\t{'entailment' if label else 'not_entailment'}")
    header = {
        "CoLA": None,
        "SST-2": "sentence\tlabel",
        "MRPC": "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String",
        "STS-B": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
        "RTE": "index\tsentence1\tsentence2\tlabel",
    }[task]
    return ([header] if header else []) + rows


def write_data_dir(root: Path) -> Path:
    """Write the whole tiny data folder under `root` (created) and return it."""
    text = corpus_text()
    (root / "corpus").mkdir(parents=True)
    (root / "corpus" / "enwiki_sample_5mb.txt").write_text(text, encoding="utf-8")
    with lzma.open(root / "corpus" / "enwiki_2014_slice.txt.xz", "wt", encoding="utf-8") as f:
        f.write(text)
    (root / "vocab").mkdir()
    (root / "vocab" / "bert-base-uncased-vocab.txt").write_text("".join(t + "\n" for t in vocab_tokens()),
                                                                 encoding="utf-8")
    gen = TextGenerator(SEED + 1)
    for task in GLUE_TASKS:
        (root / "glue" / task).mkdir(parents=True)
        for split in GLUE_ROWS:
            (root / "glue" / task / f"{split}.tsv").write_text("".join(r + "\n" for r in _rows(task, split, gen)),
                                                               encoding="utf-8")
    return root


def make_data_dir() -> Path:
    """A fresh tiny data folder in a new temporary directory (the caller removes it with remove_data_dir)."""
    return write_data_dir(Path(tempfile.mkdtemp(prefix="electra-ablate-data-")) / "data")


def remove_data_dir(data_dir: Path) -> None:
    shutil.rmtree(data_dir.parent, ignore_errors=True)


def finetune_hash_of(ctx, client):
    """(variant or pre-training run id, pretrained step, task, seed) -> the config hash a fine-tuning job of `ctx`'s grid records, for
    stores that tests fill by hand: the report counts only runs of the grid's current fine-tuning config."""
    from electra_ablate.sweep.jobs import Checkpoint
    from electra_ablate.sweep.plan import (checkpoints_of, finetune_hashes, pretrain_states, random_init_checkpoints,
                                           saved_so_far)

    checkpoints = [Checkpoint(v.label, None, None, None, True, None) for v in ctx.spec.variants
                   if v.pretrained is not None]
    for state in pretrain_states(ctx, client):
        if state.run is not None:
            checkpoints += checkpoints_of(state, ctx.spec.checkpoints)[0]
        else:
            checkpoints += saved_so_far(state, ctx.spec.checkpoints)
    checkpoints += random_init_checkpoints(ctx.spec, checkpoints)
    by_name = {c.config_name: c for c in checkpoints}
    out = {}
    for (name, task, seed), hashes in finetune_hashes(ctx, checkpoints).items():
        c, h = by_name[name], hashes[0]
        out[(c.variant, c.step, task, seed)] = h  # one pre-training seed per variant: the variant names it
        if c.run_id is not None and not c.random_init:
            out[(c.run_id, c.step, task, seed)] = h  # several: the pre-training run does
    return out
