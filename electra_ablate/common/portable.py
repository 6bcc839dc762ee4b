"""Reports without the paths of the machine that made them: a report is committed and read elsewhere, so the
folders it names (the MLflow store, the generated configs, the data, the checkout, the interpreter) are written
relative to the roots a reader has too: `$ELECTRA_ABLATE_HOME` (or `outputs` of the checkout), the data folder,
the checkout itself. Any other absolute path keeps its last component only (`…/reports`).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path


# An absolute path in running text: a `/` that starts a word (not a fraction or `tokens/s`), followed by at
# least two components; web addresses are left alone, and file URIs are matched with their scheme.
_URI = re.compile(r"\b(file://|sqlite:///)(/(?![$.~…])[^\s'\"`\]),;]+)")
_WEB = r"\bhttps?://[^\s)>\]`'\"]+"
_ABSOLUTE = re.compile(_WEB + r"|(?<![\w:/.~$<>#?&-])/(?![/\s])[\w.+@-]+(?:/[\w.+@=-]+)+/?")
_PYTHON = re.compile(r"^.*/bin/python[0-9.]*$")
REPO_ROOT = Path(__file__).resolve().parents[2]


def roots(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Absolute folder -> how a report names it; the longest match wins."""
    env = os.environ if environ is None else environ
    out = {str(REPO_ROOT / "outputs"): "outputs", str(REPO_ROOT.parent / "shared" / "data"): "../shared/data"}
    if env.get("ELECTRA_ABLATE_HOME"):
        out[str(Path(env["ELECTRA_ABLATE_HOME"]).resolve())] = "$ELECTRA_ABLATE_HOME"
    if env.get("ELECTRA_ABLATE_DATA"):
        out[str(Path(env["ELECTRA_ABLATE_DATA"]).resolve())] = "$ELECTRA_ABLATE_DATA"
    out[str(REPO_ROOT)] = "."
    return out


def _portable_path(path: str, known: Mapping[str, str]) -> str:
    if _PYTHON.match(path) or path == sys.executable:
        return "python"
    for root in sorted(known, key=len, reverse=True):
        if path == root or path.startswith(root.rstrip("/") + "/"):
            rest = path[len(root):].lstrip("/")
            name = known[root]
            return (rest if name == "." and rest else f"{name}/{rest}" if rest else name)
    trailing = "/" if path.endswith("/") else ""
    return "…/" + path.rstrip("/").rsplit("/", 1)[-1] + trailing


def portable(text: str, known: Mapping[str, str] | None = None) -> str:
    """`text` with every absolute path written relative to a root a reader has (module docstring); URIs such as
    `sqlite:////abs/mlflow.db` and `file:///abs/conf` keep their scheme."""
    known = roots() if known is None else known
    text = _URI.sub(lambda m: m.group(1) + _portable_path(m.group(2), known), text)
    return _ABSOLUTE.sub(lambda m: m.group(0) if m.group(0).startswith("http") else _portable_path(m.group(0), known),
                         text)


def absolute_paths(text: str) -> list[str]:
    """The absolute paths left in `text` (what a committed report must not hold)."""
    found = [m.group(2) for m in _URI.finditer(text)]
    return found + [m.group(0) for m in _ABSOLUTE.finditer(text) if not m.group(0).startswith("http")]
