"""electra-ablate: re-run the ELECTRA paper's ablations (Clark et al., 2020) with Lightning, Hydra and MLflow."""

import os

from omegaconf import OmegaConf

# `${cwd:}` resolves without a running Hydra app, unlike `${hydra:runtime.cwd}`: the sweeper resolves
# `hydra.sweep.dir` (which points into paths.output_root) before Hydra's own config exists.
if not OmegaConf.has_resolver("cwd"):
    OmegaConf.register_new_resolver("cwd", os.getcwd)
