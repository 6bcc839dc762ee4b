"""Fine-tune a pre-trained encoder on GLUE tasks: `python -m electra_ablate.finetune pretrained=<run id | dir |
hf:id | none> task=<task | glue> seed=<n>`. finetuning/run.py runs it (the paper's recipe, section 3.1 and
Table 7); finetuning/source.py resolves what to fine-tune."""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from electra_ablate.common import cli, console
from electra_ablate.finetuning.run import run


@hydra.main(version_base="1.3", config_path=str(cli.CONF_DIR), config_name="finetune")
@cli.one_line_errors
def main(cfg: DictConfig) -> float:
    console.setup()
    with console.job(f"{_checkpoint_name(cfg)} {cfg.run_name}"):
        return run(cfg)


def _checkpoint_name(cfg: DictConfig) -> str:
    """The sweep's name for the checkpoint (`+sweep_checkpoint=electra-s0-final`), else what `pretrained` says."""
    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    return str(choices.get("sweep_checkpoint") or cfg.pretrained)


@cli.one_line_errors
def cli_main() -> None:
    """Console entry: a misspelt key stops here with the keys it may mean, before Hydra starts; a stop ends the
    command with one line and its exit status (common/cli.py)."""
    console.take_verbose_flag()
    cli.check_args("finetune")
    main()


if __name__ == "__main__":
    cli_main()
