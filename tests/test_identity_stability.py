"""Moving or renaming code must not change the identity of any run a shipped sweep makes: a finished sweep
would otherwise be run again from scratch."""

import json

from identity_golden import GOLDEN, current_identities


def test_every_shipped_sweep_keeps_its_run_identities(tmp_path):
    golden = json.loads(GOLDEN.read_text())
    now = current_identities(tmp_path)
    assert set(now) == set(golden), "sweeps or variants changed: regenerate with python tests/identity_golden.py"
    changed = {k: (golden[k], now[k]) for k in golden if golden[k] != now[k]}
    assert not changed, f"run identities changed (golden, now): {changed}"


def test_a_new_key_at_its_old_behaviour_leaves_identities_alone(monkeypatch):
    from omegaconf import OmegaConf

    from electra_ablate.tracking import runs

    before = OmegaConf.create({"objective": {"name": "electra", "mask_prob": 0.15}, "seed": 0})
    after = OmegaConf.create({"objective": {"name": "electra", "mask_prob": 0.15, "cap": None}, "seed": 0})
    other = OmegaConf.create({"objective": {"name": "electra", "mask_prob": 0.15, "cap": 20}, "seed": 0})
    monkeypatch.setitem(runs.NEW_KEY_DEFAULTS, "objective.cap", None)
    assert runs.config_hash(after) == runs.config_hash(before) != runs.config_hash(other)
