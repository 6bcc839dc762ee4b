"""A variant's name is its config option: conf/objective/electra.yaml names `electra`.

Each option of a variant group (objective, sharing, weighting, algorithm) names its class by `_target_`, and
the class lives in the module the option is named after (`objectives/electra.py` <-> `electra.yaml`), so the
name is read off the class instead of being repeated in every file. A class whose module is named otherwise
(several toy variants in one test module; joint training in training/system.py) declares `option` itself.
conf/pretrain.yaml sets `<group>.name: ${variant_name:${<group>._target_}}` once for every group, so
`cfg.objective.name` reads as before (run names, tags, params and the run identity are unchanged).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml
from hydra.utils import get_class


def option_name(cls: type) -> str:
    """The config option that selects `cls`: its own `option` attribute, else the name of its module."""
    return cls.__dict__.get("option") or cls.__module__.rsplit(".", 1)[-1]


def variant_name(target: str) -> str:
    """`${variant_name:<_target_>}`: the option name of the class at `target`."""
    return option_name(get_class(target))


def options(conf_dir: Path, group: str) -> list[str]:
    """The options of a config group: the stems of conf/<group>/*.yaml (the group is the registry)."""
    return sorted(p.stem for p in (Path(conf_dir) / group).glob("*.yaml"))


@cache
def option_class(conf_dir: Path, group: str, option: str) -> type | None:
    """The class that conf/<group>/<option>.yaml selects by `_target_` (None: no such file, or no class)."""
    path = Path(conf_dir) / group / f"{option}.yaml"
    target = (yaml.safe_load(path.read_text()) or {}).get("_target_") if path.is_file() else None
    return get_class(target) if target else None
