"""Reports carry no path of the machine that made them (common/portable.py): the rewriting rules, and every
committed file under reports/ (markdown, verdict records, figures' metadata)."""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import pytest

from electra_ablate.common.portable import REPO_ROOT, absolute_paths, portable, roots

KNOWN = {"/data/store": "$ELECTRA_ABLATE_HOME", "/srv/shared/data": "../shared/data", "/home/me/electra-ablate": "."}


@pytest.mark.parametrize("text, expected", [
    ("at `sqlite:////data/store/mlflow.db`.", "at `sqlite:///$ELECTRA_ABLATE_HOME/mlflow.db`."),
    ("\"hydra.searchpath=['file:///data/store/sweeps/quick/tiny/conf']\"",
     "\"hydra.searchpath=['file://$ELECTRA_ABLATE_HOME/sweeps/quick/tiny/conf']\""),
    ("`/home/me/electra-ablate/.venv/bin/python -m electra_ablate.finetune`", "`python -m electra_ablate.finetune`"),
    ("paths.data_dir=/srv/shared/data paths.root_dir=/home/me/electra-ablate report_dir=/scratch/x/reports",
     "paths.data_dir=../shared/data paths.root_dir=. report_dir=…/reports"),
    ("written to /home/me/electra-ablate/reports/quick.md", "written to reports/quick.md"),
])
def test_paths_are_written_relative_to_roots_a_reader_has(text, expected):
    assert portable(text, KNOWN) == expected
    assert absolute_paths(portable(text, KNOWN)) == []
    assert absolute_paths(text)


@pytest.mark.parametrize("text", [
    "generators 1/4-1/2 of the discriminator, 215k tokens/s, GLUE 85.0/82.2",
    "the dashboard at <http://127.0.0.1:5000/#/experiments/6?workflowType=machine_learning>",
    "figures in (quick/glue.png), the store `sqlite:///outputs/mlflow.db`, and `$ELECTRA_ABLATE_HOME/mlflow.db`",
])
def test_text_without_absolute_paths_is_left_alone(text):
    assert portable(text, KNOWN) == text
    assert absolute_paths(text) == []


def test_the_outputs_folder_is_named_by_the_variable_that_moved_it(tmp_path):
    assert roots({"ELECTRA_ABLATE_HOME": str(tmp_path)})[str(tmp_path.resolve())] == "$ELECTRA_ABLATE_HOME"
    assert portable(f"{REPO_ROOT}/outputs/mlflow.db", roots({})) == "outputs/mlflow.db"


def _png_text(path: Path) -> str:
    """The PNG's text chunks (tEXt, zTXt, iTXt), where savefig writes its metadata."""
    data, out, at = path.read_bytes(), [], 8
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        if kind == b"tEXt":
            out.append(body.decode("latin-1"))
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            out.append(key.decode("latin-1") + zlib.decompress(rest[1:]).decode("latin-1"))
        elif kind == b"iTXt":
            out.append(body.decode("utf-8", "replace"))
        at += 12 + length
    return "\n".join(out)


COMMITTED = sorted(p for p in (REPO_ROOT / "reports").rglob("*") if p.is_file())


@pytest.mark.parametrize("path", COMMITTED, ids=[str(p.relative_to(REPO_ROOT)) for p in COMMITTED])
def test_no_committed_report_names_a_path_of_the_machine_that_made_it(path):
    text = (_png_text(path) if path.suffix == ".png" else gzip.decompress(path.read_bytes()).decode("utf-8")
            if path.suffix == ".gz" else path.read_text(encoding="utf-8"))  # .gz: a results bundle's tables
    assert absolute_paths(text) == [], f"{path.relative_to(REPO_ROOT)} names machine paths; re-make it (or run it " \
                                       "through electra_ablate.common.portable)"
