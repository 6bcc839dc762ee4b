"""electra-ablate: re-run the ELECTRA paper's ablations (Clark et al., 2020) with Lightning, Hydra and MLflow."""

import os
from pathlib import Path

from omegaconf import OmegaConf

# `${cwd:}` resolves without a running Hydra app, unlike `${hydra:runtime.cwd}`: the sweeper resolves
# `hydra.sweep.dir` (which points into paths.output_root) before Hydra's own config exists.
if not OmegaConf.has_resolver("cwd"):
    OmegaConf.register_new_resolver("cwd", os.getcwd)

# `${electra_ablate_root:}`: the checkout holding this package and conf/ (paths.root_dir's default), so the
# outputs, the MLflow store and the caches do not depend on the directory a command is started from.
if not OmegaConf.has_resolver("electra_ablate_root"):
    OmegaConf.register_new_resolver("electra_ablate_root", lambda: str(Path(__file__).resolve().parent.parent))

# `${sweep_name:${sweep}}`: a sweep given by path (`sweep=/path/to/mine.yaml`) is named by its file's stem, as
# one given by name (sweeps/<name>.yaml) is, so a run folder named after it is one folder, not a nested path.
if not OmegaConf.has_resolver("sweep_name"):
    OmegaConf.register_new_resolver(
        "sweep_name", lambda sweep: Path(str(sweep)).name.removesuffix(".yaml").removesuffix(".yml"))

# `${variant_name:${objective._target_}}`: a variant's name read off its class (common/variants.py), so no
# config file of a variant group repeats its own name.
if not OmegaConf.has_resolver("variant_name"):

    def _variant_name(target: str) -> str:
        from electra_ablate.common.variants import variant_name

        return variant_name(target)

    OmegaConf.register_new_resolver("variant_name", _variant_name)
