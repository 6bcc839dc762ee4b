"""The package's shape (docs/architecture.md): modules of one concern and modest size, functions short enough
to read at once, dependencies that point one way from the entry points down to the shared helpers, and no
import cycle between modules or between sub-packages (function-level imports count too)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "electra_ablate"
MAX_LINES = 400
MAX_FUNCTION_LINES = 80

# Functions still over MAX_FUNCTION_LINES, to be split where they are edited next; keep this list short.
LONG_FUNCTIONS: set[str] = set()

# Lower layers never import higher ones. Entry points: pretrain, finetune, export, submit, sweep, report, bench,
# probes (the research probes build on the bench's reference; the bench never imports them), results (a sweep's
# runs as files and back, rendered by the report; neither imports it).
LAYERS = {
    "common": 0, "tracking": 0,
    "models": 1, "data": 1, "optim": 1,
    "objectives": 2, "generators": 2, "sharing": 2, "weighting": 2,
    "training": 3, "finetuning": 3, "algorithms": 3, "glue": 3, "hf": 3,
    "pretrain": 4, "finetune": 4, "export": 4, "submit": 4, "sweep": 4, "report": 4, "bench": 4,
    "probes": 4, "results": 4,
}


def module_name(path: Path, root: Path = PACKAGE.parent) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str], root: Path = PACKAGE.parent) -> set[str]:
    """The package's modules `path` imports anywhere in its body (function-level and relative imports included)."""
    here = module_name(path, root).split(".")
    if path.name != "__init__.py":
        here = here[:-1]  # the package a relative import starts from
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # `from ..x import y`: each dot past the first goes one package up
                base = ".".join([*here[: len(here) - node.level + 1], *([base] if base else [])])
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        out |= {n for n in names if n in known and n.startswith("electra_ablate.")}
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports(p, known) - {m, "electra_ablate"} for m, p in mods.items()}


def package(module: str) -> str:
    """The sub-package (or top-level module) of electra_ablate that `module` belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def package_graph() -> dict[str, set[str]]:
    """Which sub-packages import which others: an edge for every module of one importing a module of another."""
    out: dict[str, set[str]] = {}
    for a, deps in graph().items():
        out.setdefault(package(a), set()).update(package(b) for b in deps if package(b) != package(a))
    return out


def cycles(g: dict[str, set[str]]) -> list[str]:
    """One cycle through each back edge of a depth-first walk: empty exactly when `g` has no cycle."""
    state: dict[str, int] = {}
    found = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(g.get(node, ())):
            if state.get(nxt) == 1:
                found.append(" -> ".join(stack[stack.index(nxt):] + [node, nxt]) if nxt in stack else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, [*stack, node])
        state[node] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [])
    return found


def layer(module: str) -> int:
    return LAYERS.get(package(module), 0)


def test_every_module_is_placed_in_a_layer():
    unplaced = sorted({m.split(".")[1] for m in modules() if "." in m} - set(LAYERS))
    assert not unplaced, f"add these packages or modules to LAYERS (and docs/architecture.md): {unplaced}"


def test_no_module_is_over_the_size_limit():
    long = {m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these modules by concern (lines): {long}"


def functions(tree: ast.AST, prefix: str):
    """(qualified name, lines from `def` to its last line) of every function and method, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}.{node.name}"
            if not isinstance(node, ast.ClassDef):
                yield name, node.end_lineno - node.lineno + 1
            yield from functions(node, name)


def test_no_function_is_over_the_size_limit():
    """A function a reader can hold in their head: split longer ones where a reader would want them split."""
    lengths = {name: n for m, p in modules().items() for name, n in functions(ast.parse(p.read_text()), m)}
    long = {name: n for name, n in lengths.items() if n > MAX_FUNCTION_LINES and name not in LONG_FUNCTIONS}
    assert not long, f"split these functions (lines): {long}"
    fixed = sorted(name for name in LONG_FUNCTIONS if lengths.get(name, 0) <= MAX_FUNCTION_LINES)
    assert not fixed, f"short now (or gone): remove them from LONG_FUNCTIONS: {fixed}"


def test_dependencies_point_down_the_layers():
    upward = sorted(f"{a} -> {b}" for a, deps in graph().items() for b in deps if layer(b) > layer(a))
    assert not upward, upward


def test_there_is_no_import_cycle():
    found = cycles(graph())
    assert not found, found


def test_no_two_sub_packages_import_each_other():
    """Not even through other modules or inside a function: a sub-package needs only those below it, so it
    can be read, tested and moved without the ones above. Where two need each other, the shared part moves
    into a lower package (optim/ for training and glue), or the lower one is handed a callable (the sweep
    runner gets the report writer from conf/sweep.yaml)."""
    found = cycles(package_graph())
    assert not found, found


def test_the_bench_and_the_entry_points_never_import_the_probes():
    """The research probes (probes/) stand on the bench and the training code; nothing but a probe needs a probe,
    so moving or dropping one touches nothing else."""
    users = sorted(a for a, deps in graph().items()
                   if package(a) != "probes" and any(package(b) == "probes" for b in deps))
    assert not users, users


def test_the_cycle_check_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "electra_ablate"
    (pkg / "low").mkdir(parents=True)
    (pkg / "high").mkdir()
    (pkg / "low" / "a.py").write_text("def f():\n    from electra_ablate.high import b\n")
    (pkg / "high" / "b.py").write_text("from ..low import a\n")
    known = {"electra_ablate.low.a", "electra_ablate.high.b"}
    assert imports(pkg / "low" / "a.py", known, root=tmp_path) == {"electra_ablate.high.b"}
    assert imports(pkg / "high" / "b.py", known, root=tmp_path) == {"electra_ablate.low.a"}
    assert cycles({"low": {"high"}, "high": {"low"}}) == ["high -> low -> high"]
