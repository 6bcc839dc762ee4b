"""Every module and file the docs, sweeps and configs name exists: a reader who copies `electra_ablate.x.y`,
`python -m electra_ablate...`, `conf/...yaml` or a markdown link finds it. The lab notebook (docs/notebook/) is
dated history and is left out; what it names was true on its day."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "electra_ablate"
NOTEBOOK = REPO / "docs" / "notebook"

# A dotted name under the package: a module, a package, or a module and a name it defines.
MODULE = re.compile(r"(?<![\w.])electra_ablate(?:\.[A-Za-z_]\w*)+")
# A repository path with a file extension, or a folder with its trailing slash, standing on its own (not the tail
# of another path: `../reports/x.md` is a markdown link, checked from its file; `<outputs>/sweeps/` is a template).
FOLDERS = ("conf", "electra_ablate", "docs", "reports", "sweeps", "tests", "scripts")
EXTENSIONS = "py|yaml|md|sh|json|png|toml|txt"
FILE = re.compile(rf"(?<![\w./<>-])(?:{'|'.join(FOLDERS)})/[\w./-]*?(?:\.(?:{EXTENSIONS})\b|/(?=[\s`'\")\],;:]|$))")
LINK = re.compile(r"\]\(([^)\s]+)\)")

# Named paths a command writes rather than the repository holds.
WRITTEN = {
    "reports/benchmarks_gpu.md": "the GPU check writes it on a machine with a GPU (docs/gpu.md)",
}

def sources() -> list[Path]:
    docs = [p for p in sorted((REPO / "docs").rglob("*.md")) if NOTEBOOK not in p.parents]
    configs = [*sorted((REPO / "sweeps").glob("*.yaml")), *sorted((REPO / "conf").rglob("*.yaml"))]
    return [REPO / "README.md", *docs, *configs]


def module_exists(dotted: str) -> bool:
    """`dotted` is a module or package of the checkout, or a name one of them defines (a class, a function, a
    constant), or a `python -m` entry point."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:n])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file():
            rest = parts[n:]
            if not rest:
                return True
            return len(rest) <= 2 and re.search(rf"^\s*(?:class|def)\s+{rest[0]}\b|^{rest[0]}\s*[:=]",
                                                module.read_text(), re.M) is not None
    return False


def named(path: Path) -> list[tuple[str, str]]:
    """(kind, name) of every module, repository path and relative markdown link in `path`."""
    text = path.read_text()
    out = [("module", m.group(0).rstrip(".")) for m in MODULE.finditer(text)]
    out += [("file", m.group(0)) for m in FILE.finditer(text)]
    if path.suffix == ".md":
        for m in LINK.finditer(text):
            target = m.group(1).split("#")[0]
            if target and not re.match(r"^[a-z]+:", target):
                out.append(("link", target))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)  # no headings inside code blocks
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def broken_anchors(path: Path) -> list[str]:
    """Links `[x](page.md#anchor)` and `[x](#anchor)` in `path` whose page has no such heading."""
    out = []
    for m in LINK.finditer(path.read_text()):
        target, _, anchor = m.group(1).partition("#")
        page = (path.parent / target) if target else path
        if anchor and page.suffix == ".md" and page.is_file() and anchor not in anchors(page):
            out.append(m.group(1))
    return out


def exists(path: Path, kind: str, name: str) -> bool:
    if kind == "module":
        return module_exists(name)
    if kind == "link":
        return (path.parent / name).exists()
    return name in WRITTEN or (REPO / name).exists()


@pytest.mark.parametrize("path", sources(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_named_module_and_path_exists(path: Path):
    where = path.relative_to(REPO).as_posix()
    missing = sorted({f"{kind} {name}" for kind, name in named(path)
                      if not exists(path, kind, name)})
    assert not missing, f"{where} names what the checkout does not hold: {missing}"


@pytest.mark.parametrize("path", [p for p in sources() if p.suffix == ".md"],
                         ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_link_to_a_section_finds_its_heading(path: Path):
    broken = broken_anchors(path)
    assert not broken, f"{path.relative_to(REPO).as_posix()} links sections that are not there: {broken}"


def test_the_check_finds_modules_files_and_links(tmp_path):
    doc = tmp_path / "docs" / "x.md"
    doc.parent.mkdir()
    doc.write_text("`python -m electra_ablate.probes.curve`, electra_ablate.models.flops.Heads, "
                   "electra_ablate.flops, conf/debug/smoke.yaml, `docs/notebook/`, <outputs>/sweeps/a.yaml, "
                   "[p](presets.md#x), [w](https://example.org)\n")
    found = named(doc)
    assert ("module", "electra_ablate.probes.curve") in found and ("file", "conf/debug/smoke.yaml") in found
    assert ("file", "docs/notebook/") in found and ("link", "presets.md") in found
    assert not any(name.startswith("sweeps/a") for _, name in found)
    assert module_exists("electra_ablate.models.flops.Heads") and not module_exists("electra_ablate.flops")
    assert module_exists("electra_ablate.probes.curve") and not module_exists("electra_ablate.bench.curve")
