"""The package's shape (docs/architecture.md): modules of one concern and modest size, dependencies that
point one way from the entry points down to the shared helpers, and no import cycle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "electra_ablate"
MAX_LINES = 400

# Lower layers never import higher ones. Entry points: pretrain, finetune, export, submit, sweep, report, bench.
LAYERS = {
    "common": 0, "tracking": 0,
    "models": 1, "data": 1,
    "objectives": 2, "generators": 2, "sharing": 2, "weighting": 2,
    "training": 3, "algorithms": 3, "glue": 3, "hf": 3,
    "pretrain": 4, "finetune": 4, "export": 4, "submit": 4, "sweep": 4, "report": 4, "bench": 4,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """The package's modules `path` imports anywhere in its body (function-level imports included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        out |= {n for n in names if n in known and n.startswith("electra_ablate.")}
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports(p, known) - {m, "electra_ablate"} for m, p in mods.items()}


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1]] if len(parts) > 1 else 0


def test_every_module_is_placed_in_a_layer():
    unplaced = sorted({m.split(".")[1] for m in modules() if "." in m} - set(LAYERS))
    assert not unplaced, f"add these packages or modules to LAYERS (and docs/architecture.md): {unplaced}"


def test_no_module_is_over_the_size_limit():
    long = {m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these modules by concern (lines): {long}"


def test_dependencies_point_down_the_layers():
    upward = sorted(f"{a} -> {b}" for a, deps in graph().items() for b in deps if layer(b) > layer(a))
    assert not upward, upward


def test_there_is_no_import_cycle():
    g = graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(g[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [node, nxt]) if nxt in stack else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, [*stack, node])
        state[node] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [])
    assert not cycles, cycles
