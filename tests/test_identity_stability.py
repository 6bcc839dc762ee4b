"""Moving or renaming code must not change the identity of any run a shipped sweep makes: a finished sweep
would otherwise be run again from scratch."""

import json

from identity_golden import GOLDEN, LEGACY_DATA_PATHS, current_identities


def test_every_shipped_sweep_keeps_its_run_identities(tmp_path):
    golden = json.loads(GOLDEN.read_text())
    legacy: dict[str, str] = {}
    now = current_identities(tmp_path, legacy)
    assert set(now) == set(golden), "sweeps or variants changed: regenerate with python tests/identity_golden.py"
    changed = {k: (golden[k], now[k]) for k in golden if golden[k] != now[k]}
    assert not changed, f"run identities changed (golden, now): {changed}"
    # Runs recorded when identities hashed the data folder's absolute path are still found: the lookup's
    # legacy hash is exactly what they were tagged with.
    recorded = json.loads(LEGACY_DATA_PATHS.read_text())
    assert {k: legacy[k] for k in recorded} == recorded


def test_a_moved_data_folder_keeps_pretraining_identities_and_finds_runs_of_the_old_spelling(tmp_path):
    from omegaconf import OmegaConf

    from electra_ablate.tracking import runs

    def cfg(data_dir: str, corpus: str = "corpus/a.txt"):
        return OmegaConf.create({"paths": {"data_dir": data_dir}, "seed": 0,
                                 "data": {"corpus": f"${{paths.data_dir}}/{corpus}",
                                          "vocab_file": "${paths.data_dir}/vocab/v.txt"}})

    here, moved = cfg("/data"), cfg("/mnt/elsewhere/data/")
    assert runs.config_hash(here) == runs.config_hash(moved)
    assert runs.identity(here)["data"]["corpus"] == "${paths.data_dir}/corpus/a.txt"
    assert runs.config_hash(cfg("/data", "corpus/b.txt")) != runs.config_hash(here)  # another file, another run
    # The hash of the old spelling (absolute paths) comes second, and differs where the folder differs.
    new, old = runs.identity_hashes(here)
    assert new == runs.config_hash(here) and old != new and old != runs.identity_hashes(moved)[1]

    client = runs.setup(f"sqlite:///{tmp_path}/mlflow.db", "e")
    recorded = client.create_run(client.get_experiment_by_name("e").experiment_id, tags={runs.TAG_CONFIG_HASH: old})
    client.set_terminated(recorded.info.run_id)
    assert runs.find_finished_run(client, "e", runs.identity_hashes(here)).info.run_id == recorded.info.run_id
    assert [r.info.run_id for r in runs.runs_of_identity(client, "e", runs.identity_hashes(here))] == \
        [recorded.info.run_id]


def test_a_new_key_at_its_old_behaviour_leaves_identities_alone(monkeypatch):
    from omegaconf import OmegaConf

    from electra_ablate.tracking import runs

    before = OmegaConf.create({"objective": {"name": "electra", "mask_prob": 0.15}, "seed": 0})
    after = OmegaConf.create({"objective": {"name": "electra", "mask_prob": 0.15, "cap": None}, "seed": 0})
    other = OmegaConf.create({"objective": {"name": "electra", "mask_prob": 0.15, "cap": 20}, "seed": 0})
    monkeypatch.setitem(runs.NEW_KEY_DEFAULTS, "objective.cap", None)
    assert runs.config_hash(after) == runs.config_hash(before) != runs.config_hash(other)
