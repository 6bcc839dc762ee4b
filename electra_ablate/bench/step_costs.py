"""The measured step costs a sweep's dry run prices its pre-training with (sweep/cost.py), as a small JSON file beside
the markdown report: the one-thread steps the `presets` section times at each named CPU preset (under whatever load
the machine had: their ratios hold, their seconds may not) and the `throughput` section's step at its experiment's
shape (the free-core reference a sweep's seconds are scaled to), each with its shape, its paper-accounted FLOPs and
the machine it ran on. `python -m electra_ablate.bench ... --sections presets --out reports/benchmarks_presets.md`
writes reports/benchmarks_presets.json beside its markdown; `--sections throughput` likewise.

Markdown written before the bench wrote these files converts once, through the same rows (shapes and FLOPs from the
composed configs, as the sections compute them), with the file it came from recorded:

    python -m electra_ablate.bench.step_costs reports/benchmarks_presets.md reports/benchmarks_throughput.md
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

from hydra.utils import get_class
from omegaconf import DictConfig

from electra_ablate.bench.builds import compose_pretrain
from electra_ablate.bench.settings import REPO, BenchError, Report, default_data_dir
from electra_ablate.common.io import write_text
from electra_ablate.training import build

SCHEMA = 1
SHAPE_KEYS = ("embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
TIMED_KINDS = ("preset", "attention")  # rows of rep.throughput whose step a sweep's dry run can price with


def step_shape(cfg: DictConfig, precision: str) -> dict:
    """What a timed step was beside its vocabulary, batch and FLOPs: the encoder's shape, the objective's heads
    (models/flops.py `Heads`), the precision, the attention path and the threads (one: both sections time their steps
    on one thread)."""
    heads = get_class(cfg.objective._target_).flops
    return {"model": {k: int(cfg.model[k]) for k in SHAPE_KEYS},
            "heads": {"main": heads.main, "generator": heads.generator}, "precision": precision, "attention": str(cfg.runtime.cpu_attention), "threads": 1}


def step_costs(rep: Report, source: str | None = None) -> dict | None:
    """The file's content: the machine and the timed rows of `rep` (None when it has none)."""
    keep = ("kind", "preset", "experiment", "overrides", "objective", "vocab", "batch", "step_s", "flops", "model",
            "heads", "precision", "attention", "threads")
    rows = [{k: r[k] for k in keep if k in r} for r in rep.throughput if r.get("kind") in TIMED_KINDS]
    if not rows:
        return None
    m = rep.machine
    out = {"schema": SCHEMA, "command": rep.settings.command if rep.settings else "", "date": m.get("date"),
           "commit": m.get("commit"), "cpu": m.get("cpu"), "cores": m.get("cores"),
           "load_start": list(m.get("load_start") or []), "load_end": list(m.get("load_end") or []), "rows": rows}
    if source:
        out["converted_from"] = source
    return out


def json_path(markdown: Path) -> Path:
    return Path(markdown).with_suffix(".json")


def write_step_costs(rep: Report, markdown: Path) -> Path | None:
    """Write the JSON beside `markdown` when `rep` timed steps a dry run can use; returns its path."""
    content = step_costs(rep)
    if content is None:
        return None
    path = json_path(markdown)
    write_text(path, json.dumps(content, indent=1) + "\n")
    return path


# --- the markdown written before the JSON ---------------------------------------------------------------------

_ROW = re.compile(r"^\|(.+)\|\s*$")


def _cells(text: str, header: str) -> list[list[str]]:
    """The body rows of the first table after the line `header`, as stripped cells."""
    lines = text.split(header, 1)[1].splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("|---"))
    rows = []
    for line in lines[start + 1:]:
        match = _ROW.match(line)
        if not match:
            break
        rows.append([c.strip() for c in match.group(1).split("|")])
    return rows


def _machine(text: str) -> dict:
    def find(pattern: str) -> str:
        found = re.search(pattern, text, re.MULTILINE)
        if found is None:
            raise BenchError(f"the markdown has no line matching {pattern!r}: not a bench report")
        return found.group(1)

    loads = re.search(r"^- Load average \(1/5/15 min\) at start: ([\d., ]+); at end: ([\d., ]+)", text, re.MULTILINE)
    return {"command": find(r"^- Command: `(.+)`"), "date": find(r"^- Date: (.+?); git commit"),
            "commit": find(r"; git commit (.+)$"), "cpu": find(r"^- Hardware: (.+?) \(\d+ cores"),
            "cores": int(find(r"^- Hardware: .+? \((\d+) cores")),
            "precision": find(r"`runtime\.precision=auto` resolves to (\S+) here"),
            "load_start": [float(x) for x in loads.group(1).split(",")] if loads else [],
            "load_end": [float(x) for x in loads.group(2).rstrip(" (").split(",")] if loads else []}


def _compose(preset: str, objective: str, overrides: list[str], data_dir: Path) -> DictConfig:
    # As the sections compose it (bench/builds.py `compose_config` with keep_shape): the preset's own shape.
    return compose_pretrain(["model=tiny", "runtime.num_workers=0", "runtime.compile=false", f"paths.root_dir={REPO}",
                             f"paths.data_dir={data_dir}",
                             f"paths.output_dir={tempfile.gettempdir()}/electra_ablate_bench",
                             "trainer.max_steps=1000000", f"experiment={preset}", f"objective={objective}", *overrides])


def _preset_rows(text: str, machine: dict, data_dir: Path) -> list[dict]:
    rows = []
    for name, objective, vocab, batch, step_s, *_ in _cells(text, "## A step at each CPU preset"):
        preset, *overrides = name.replace("`", "").split()
        b, t = (int(x) for x in batch.split(" x "))
        cfg = _compose(preset, objective, overrides, data_dir)
        rows.append({"kind": "preset", "preset": preset, "overrides": overrides, "objective": objective,
                     "vocab": int(vocab), "batch": [b, t], "step_s": float(step_s),
                     "flops": build.config_step_flops(cfg, int(vocab))["joint"],
                     **step_shape(cfg, machine["precision"])})
    return rows


def _attention_rows(text: str, machine: dict, data_dir: Path) -> list[dict]:
    header = "## Tokens per CPU-hour at the sweep's shape"
    experiment = re.search(r"Pre-training steps of `experiment=(\w+)`", text.split(header, 1)[1]).group(1)
    rows = []
    for objective, batch, attention, step_s, *_ in _cells(text, header):
        b, t = (int(x) for x in batch.split(" x "))
        cfg = _compose(experiment, objective, [f"runtime.cpu_attention={attention.strip('`')}"], data_dir)
        vocab = int(cfg.data.train_vocab_size) or len((Path(cfg.data.vocab_file)).read_text().splitlines())
        rows.append({"kind": "attention", "experiment": experiment, "objective": objective, "vocab": vocab,
                     "batch": [b, t], "step_s": float(step_s), "flops": build.config_step_flops(cfg, vocab)["joint"],
                     **step_shape(cfg, machine["precision"])})
    return rows


def from_markdown(markdown: Path, data_dir: Path | None = None) -> dict:
    """The JSON of a bench report's `presets` or `throughput` section, read from its markdown."""
    text = Path(markdown).read_text()
    machine = _machine(text)
    data_dir = data_dir or default_data_dir()
    rows = []
    if "## A step at each CPU preset" in text:
        rows += _preset_rows(text, machine, data_dir)
    if "## Tokens per CPU-hour at the sweep's shape" in text:
        rows += _attention_rows(text, machine, data_dir)
    if not rows:
        raise BenchError(f"{markdown} has neither a presets nor a throughput section: nothing a dry run can price with")
    try:
        source = str(Path(markdown).resolve().relative_to(REPO))
    except ValueError:
        source = str(markdown)
    return {"schema": SCHEMA, **{k: v for k, v in machine.items() if k != "precision"}, "rows": rows,
            "converted_from": source}


def main(argv: list[str] | None = None) -> list[Path]:
    paths = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not paths:
        raise BenchError("give the bench reports to convert, e.g. reports/benchmarks_presets.md")
    out = []
    for markdown in paths:
        path = json_path(markdown)
        write_text(path, json.dumps(from_markdown(markdown), indent=1) + "\n")
        out.append(path)
        print(f"wrote {path}")
    return out


if __name__ == "__main__":
    from electra_ablate.common import cli

    cli.one_line_errors(main)()
