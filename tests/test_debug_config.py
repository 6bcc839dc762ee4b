"""The smoke shape as a config group (conf/debug/smoke.yaml): `debug=smoke` is the 2-layer, 64-wide encoder the
tests and the docs' smoke runs type out, it sets values only (no key of its own, nothing else changed), and a run
configured with it has the identity of the same values typed on the command line."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from electra_ablate.common.cli import CONF_DIR, unknown_key_message
from electra_ablate.tracking.identity import config_hash

# The shape as the tests wrote it by hand before the group (tests/test_docs_commands.py's TINY_SHAPE).
TYPED = ("model.hidden_size=64", "model.embedding_size=32", "model.num_hidden_layers=2",
         "model.num_attention_heads=2", "model.intermediate_size=128")


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("pretrain", overrides=["paths.output_dir=/tmp/run", *overrides])


def plain(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=False)


def test_debug_smoke_is_the_typed_shape_and_nothing_else():
    for base in ((), ("experiment=cpu_regime_30k", "objective=bert")):
        smoke, typed = composed(*base, "debug=smoke"), composed(*base, *TYPED)
        assert "debug" not in smoke
        assert plain(smoke) == plain(typed)
        assert config_hash(smoke) == config_hash(typed)
        assert (smoke.model.num_hidden_layers, smoke.model.hidden_size) == (2, 64)


def test_without_the_group_nothing_changes():
    """The group's default is null: the primary config composes as it did before the group existed."""
    cfg = composed()
    assert "debug" not in cfg and (cfg.model.num_hidden_layers, cfg.model.hidden_size) == (4, 128)


def test_the_command_line_check_knows_the_group():
    assert unknown_key_message("pretrain", ["debug=smoke"]) is None
    assert "debug=" in (unknown_key_message("pretrain", ["debug=smok"]) or "")
