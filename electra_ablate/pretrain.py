"""Pre-train one variant: `python -m electra_ablate.pretrain objective=electra sharing=embeddings model=small`.

The config's groups choose every piece by `_target_` (objective, generator, sharing, weighting, algorithm,
data); training/pretraining.py runs it, skipping finished work and resuming interrupted work (docs/architecture.md).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from electra_ablate.common import cli
from electra_ablate.training.pretraining import train


@hydra.main(config_path=str(cli.CONF_DIR), config_name="pretrain", version_base="1.3")
@cli.one_line_errors
def main(cfg: DictConfig) -> str | None:
    return train(cfg)


def cli_main() -> None:
    """Console entry: a misspelt key stops here with the keys it may mean, before Hydra starts (common/cli.py)."""
    cli.check_args("pretrain")
    main()


if __name__ == "__main__":
    cli_main()
