"""Fine-tune a pre-trained encoder on GLUE tasks: `python -m electra_ablate.finetune pretrained=<run id | dir |
hf:id | none> task=<task | glue> seed=<n>`. training/finetuning.py runs it (the paper's recipe, section 3.1 and
Table 7); training/finetune_source.py resolves what to fine-tune."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from electra_ablate.common import cli
from electra_ablate.training.finetuning import run


@hydra.main(version_base="1.3", config_path=str(cli.CONF_DIR), config_name="finetune")
@cli.one_line_errors
def main(cfg: DictConfig) -> float:
    return run(cfg)


def cli_main() -> None:
    """Console entry: a misspelt key stops here with the keys it may mean, before Hydra starts (common/cli.py)."""
    cli.check_args("finetune")
    main()


if __name__ == "__main__":
    cli_main()
