"""A pre-training pilot judged on its curve alone: trained exactly as `python -m electra_ablate.pretrain` trains
(training/build.py builds the data, the networks, the algorithm and the Trainer from the same config), but without
the run store: nothing goes to MLflow, nothing is exported, and every train/* window (MLM loss and accuracy, also
at [MASK] and at kept positions, the sampled token's accuracy, the discriminator's loss, accuracy, precision,
recall and ROC AUC, the replaced share, loss, tokens/s, learning rate) is written to a CSV as it closes.
Pilots say which settings leave a plateau before a sweep spends its compute on them; several run side by side, one
process each, on any machine with the project's Python packages and torch (MLflow is not needed), a lent GPU
machine too.

`python -m electra_ablate.probes.pilot NAME <pre-training overrides> [--out CSV] [--cache DIR]`

`--cache DIR` reads a pre-training cache entry already built (`<paths.cache_dir>/pretrain/<key>/`) instead of
building the corpus: for a machine where the raw corpus is not. Its sequence length, vocabulary size, article
count and casing must be the data config's; a mismatch is refused before any network is built.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from electra_ablate.bench.builds import compose_pretrain
# The loop and its CSV's columns are the bench's (its `loop` section runs the same loop), read here by tests too.
from electra_ablate.bench.loop import CACHE_KEYS, COLUMNS, METRICS, CsvRows, cache_problems, run  # noqa: F401
from electra_ablate.bench.settings import BenchError, log
from electra_ablate.common import cli


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m electra_ablate.probes.pilot", description=__doc__.split("\n\n")[0],
        epilog="example:\n  python -m electra_ablate.probes.pilot electra-lr5e-4 experiment=cpu_regime "
        "objective=electra \\\n    optim.lr=5e-4 trainer.max_steps=4944 --out pilots/electra-lr5e-4.csv",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="the pilot's name, the CSV's first column")
    p.add_argument("overrides", nargs="*", help="pre-training overrides of conf/pretrain.yaml, as "
                                                "python -m electra_ablate.pretrain takes them")
    p.add_argument("--out", type=Path, default=None, help="the CSV to write (default <paths.output_root>/pilots/"
                                                          "<name>.csv)")
    p.add_argument("--cache", type=Path, default=None, help="a built pre-training cache entry to read instead of "
                                                            "building the corpus")
    return p.parse_intermixed_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    a = parse_args(argv)
    message = cli.unknown_key_message("pretrain", a.overrides)
    if message:
        raise BenchError(message)
    cfg = compose_pretrain([f"paths.output_dir={tempfile.gettempdir()}/electra_ablate_pilot", *a.overrides])
    out = a.out or Path(cfg.paths.output_root) / "pilots" / f"{a.name}.csv"
    rows = run(a.name, cfg, out, a.cache)
    log(f"pilot {a.name}: {len(rows)} windows in {out}")
    return rows


@cli.one_line_errors
def cli_main() -> None:
    """Console entry: a refused option ends in one line (common/cli.py)."""
    main()


if __name__ == "__main__":
    cli_main()
