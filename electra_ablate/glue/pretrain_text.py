"""A pre-training corpus made of GLUE tasks' unlabelled training text (`data=glue_text`).

In-domain pre-training text for small-compute regimes: the sentences of the chosen tasks' *training* splits,
labels dropped; dev and test text never enter it. Self-pre-training on a task's own text (Krishna et al.
2023, "Downstream datasets make surprisingly good pretraining corpora") is beyond the ELECTRA paper, which
pre-trains on Wikipedia and BooksCorpus (section 3.1).

The text is written once as a plain corpus file in the layout every other corpus uses (one paragraph per
line, a blank line between documents) under `<cache_dir>/glue_text/`, named by the digest of the TSVs it
came from and of the settings below; from there the single-file build (`PretrainDataModule`) tokenizes and
packs it, trains a vocabulary on it if asked, and caches the examples as for any corpus.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from electra_ablate.common.io import atomic_file
from electra_ablate.data.errors import DataError
from electra_ablate.data.module import PretrainDataModule
from electra_ablate.glue.tasks import get_task, split_path
from electra_ablate.glue.readers import read_tsv


def glue_text_corpus(tasks: Sequence[str], glue_dir: str | Path, cache_dir: str | Path,
                     sentences_per_document: int) -> Path:
    """Write (once) and return the corpus file of `tasks`' training sentences, `sentences_per_document` lines
    a document, tasks in the order given and rows in file order; a pair task gives both sentences of a row."""
    if not tasks:
        raise DataError("data.tasks is empty: name the GLUE tasks whose training text to pre-train on, e.g. [sst2]")
    if sentences_per_document < 1:
        raise DataError(f"data.sentences_per_document={sentences_per_document} must be at least 1")
    specs = [get_task(t) for t in tasks]
    digest = hashlib.sha256(json.dumps({"tasks": list(tasks), "per_doc": sentences_per_document}).encode())
    for spec in specs:
        path = split_path(spec, glue_dir, "train")
        digest.update(path.read_bytes() if path.is_file() else b"")  # read_tsv below names a missing file
    out = Path(cache_dir) / "glue_text" / f"{'-'.join(tasks)}-{digest.hexdigest()[:16]}.txt"
    if out.is_file():
        return out
    lines = [text for spec in specs for ex in read_tsv(spec, glue_dir, "train")
             for text in (ex.text_a, ex.text_b) if text and text.strip()]
    with atomic_file(out) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            for i in range(0, len(lines), sentences_per_document):
                f.write("\n".join(" ".join(s.split()) for s in lines[i:i + sentences_per_document]) + "\n\n")
    return out


class GlueTextDataModule(PretrainDataModule):
    """`PretrainDataModule` over `glue_text_corpus(tasks, glue_dir, ...)`: data.corpus is made, not given."""

    def __init__(self, *, tasks: Sequence[str], glue_dir: str, sentences_per_document: int = 32, **data_args):
        self.tasks, self.glue_dir, self.sentences_per_document = list(tasks), glue_dir, sentences_per_document
        super().__init__(corpus=f"glue_text:{','.join(self.tasks)}", **data_args)

    def _build_cache(self):
        self.corpus = str(glue_text_corpus(self.tasks, self.glue_dir, self.cache_dir, self.sentences_per_document))
        return super()._build_cache()
