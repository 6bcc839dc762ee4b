"""Pre-train one variant: `python -m electra_ablate.pretrain objective=electra sharing=embeddings model=small`.

The config's groups choose every piece by `_target_` (objective, generator, sharing, weighting, algorithm,
data); training/pretraining.py runs it, skipping finished work and resuming interrupted work (docs/architecture.md).
The command ends with the run's outcome: what it reached in its last logged window and where it went.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from electra_ablate.common import cli, console
from electra_ablate.tracking import runs as tracking
from electra_ablate.training.pretraining import train

# (metric, what it is, factor, format) shown in the outcome when the run logged it
OUTCOME_METRICS = (
    ("train/masked_lm_accuracy", "masked-LM accuracy", 100, "{:.1f}%"),
    ("train/disc_auc", "discriminator ROC AUC (chance 0.5)", 1, "{:.3f}"),
    ("train/replaced_fraction", "tokens replaced", 100, "{:.1f}%"),
    ("train/loss", "loss", 1, "{:.3f}"),
)


def outcome(run) -> str:
    """Two or three lines: the run's name, steps, FLOPs and time; its last window's metrics; its checkpoint."""
    m, info = run.data.metrics, run.info
    seconds = (info.end_time - info.start_time) / 1000 if info.end_time and info.start_time else None
    head = f"pre-trained {info.run_name} ({info.status})"
    if "train/flops" in m or "flops/total" in m:
        head += f": {m.get('flops/total', m.get('train/flops')):.2g} FLOPs"
    if seconds is not None:
        head += f", {seconds:.0f} s of wall time"
    shown = [f"{name} {fmt.format(m[key] * factor)}" for key, name, factor, fmt in OUTCOME_METRICS if key in m]
    lines = [head] + ([f"  at its end: {', '.join(shown)}"] if shown else [])
    lines.append(f"  checkpoint: {run.data.tags.get(tracking.TAG_CHECKPOINT, '-')}; MLflow run {info.run_id}")
    return "\n".join(lines)


@hydra.main(config_path=str(cli.CONF_DIR), config_name="pretrain", version_base="1.3")
@cli.one_line_errors
def main(cfg: DictConfig) -> str | None:
    console.setup()
    with console.job(cfg.run_name):
        run_id = train(cfg)
    if run_id is not None:
        print(outcome(tracking.setup(cfg.logger.tracking_uri, cfg.logger.experiment).get_run(run_id)), flush=True)
    return run_id


@cli.one_line_errors
def cli_main() -> None:
    """Console entry: a misspelt key stops here with the keys it may mean, before Hydra starts; a stop ends the
    command with one line and its exit status (common/cli.py)."""
    console.take_verbose_flag()
    cli.check_args("pretrain")
    main()


if __name__ == "__main__":
    cli_main()
