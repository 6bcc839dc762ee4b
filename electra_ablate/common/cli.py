"""Command-line overrides checked before Hydra starts: a misspelt key gets the keys it may have meant.

Hydra answers `optim.learning_rate=1` with "To append to your config use +optim.learning_rate=1", which
adds a key that nothing reads: the run then trains with the default learning rate. Here every `key=value`
override of an existing config group's keys is looked up in the config it would change, and an unknown one
stops the command with the closest existing keys instead.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
_ABSENT = object()


def _leaf_keys(cfg: DictConfig) -> list[str]:
    container = OmegaConf.to_container(cfg, resolve=False)
    out: list[str] = []

    def walk(node, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
                out.append(f"{prefix}{k}")

    walk(container, "")
    return out


def unknown_key_message(config_name: str, args: Sequence[str]) -> str | None:
    """The message for the first `key=value` override naming no key of `config_name`, else None (Hydra then
    reports anything else itself)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    try:
        overrides = OverridesParser.create().parse_overrides([a for a in args if not a.startswith("-")])
    except Exception:  # noqa: BLE001 - a syntax error: Hydra's own message is the right one
        return None
    if any(o.type != OverrideType.CHANGE for o in overrides if "." not in o.key_or_group):
        return None  # `+group=...` configs (generated sweep variants) may bring keys of their own
    groups, values = [], []
    for o in overrides:
        key = o.key_or_group
        if key.startswith("hydra") or o.type != OverrideType.CHANGE:
            continue
        if "." not in key and (CONF_DIR / key).is_dir():
            first = next(iter(o.sweep_string_iterator())) if o.is_sweep_override() else o.get_value_element_as_str()
            groups.append(f"{key}={first}")
        else:
            values.append(key)
    if not values:
        return None
    if GlobalHydra.instance().is_initialized():
        return None  # inside a running Hydra app: nothing to check
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name, overrides=[*groups, "paths.output_dir=."])
    except Exception:  # noqa: BLE001 - a bad group option: Hydra lists the valid ones itself
        return None
    finally:
        GlobalHydra.instance().clear()
    for key in values:
        if OmegaConf.select(cfg, key, default=_ABSENT) is not _ABSENT:
            continue
        keys = _leaf_keys(cfg)
        close = difflib.get_close_matches(key, keys, n=3, cutoff=0.75)
        parent, _, leaf = key.rpartition(".")
        if not close:  # the same name under another parent (model.lr -> optim.lr)
            close = [k for k in keys if k.rsplit(".", 1)[-1] == leaf][:3]
        siblings = sorted(k.rsplit(".", 1)[-1] for k in keys if k.rpartition(".")[0] == parent and k != parent)
        if close:
            hint = f"; did you mean {' or '.join(close)}?"
        elif parent and siblings:
            hint = f"; {parent} has: {', '.join(siblings)}"
        else:
            hint = f"; see conf/{config_name}.yaml and its groups"
        return (f"{key} is not a key of the {config_name} config{hint} (a `+{key}=...` would only add a key "
                "that nothing reads)")
    return None


def check_args(config_name: str, args: Sequence[str] | None = None) -> None:
    """Exit with one message when the command line sets a key the config does not have."""
    message = unknown_key_message(config_name, sys.argv[1:] if args is None else args)
    if message:
        sys.exit(f"error: {message}")
