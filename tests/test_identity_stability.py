"""Moving or renaming code must not change the identity of any run a shipped sweep makes: a finished sweep
would otherwise be run again from scratch."""

import hashlib
import json

from identity_golden import GOLDEN, LEGACY_DATA_PATHS, LEGACY_NUMBERS, current_identities


def test_every_shipped_sweep_keeps_its_run_identities(tmp_path):
    golden = json.loads(GOLDEN.read_text())
    lookups: dict[str, list[str]] = {}
    now = current_identities(tmp_path, lookups)
    assert set(now) == set(golden), "sweeps or variants changed: regenerate with python tests/identity_golden.py"
    changed = {k: (golden[k], now[k]) for k in golden if golden[k] != now[k]}
    assert not changed, f"run identities changed (golden, now): {changed}"
    # Runs recorded when identities hashed the data folder's absolute path, or numbers as written, are still
    # found: the lookup tries exactly what they were tagged with.
    for legacy in (LEGACY_DATA_PATHS, LEGACY_NUMBERS):
        recorded = json.loads(legacy.read_text())
        lost = {k: h for k, h in recorded.items() if h not in lookups[k]}
        assert not lost, f"runs recorded before ({legacy.name}) no longer found: {lost}"


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


def test_a_number_written_as_int_or_float_is_one_identity(tmp_path, pretrain_cfg):
    from electra_ablate.tracking import runs

    for key, as_int, as_float in [("objective.disc_weight", "50", "50.0"), ("generator.hidden_size", "1", "1.0"),
                                  ("optim.warmup_steps", "10", "10.0")]:
        a, b = pretrain_cfg(tmp_path, f"{key}={as_int}"), pretrain_cfg(tmp_path, f"{key}={as_float}")
        assert runs.config_hash(a) == runs.config_hash(b), key
    assert runs.config_hash(pretrain_cfg(tmp_path, "objective.disc_weight=50.5")) != \
        runs.config_hash(pretrain_cfg(tmp_path, "objective.disc_weight=50"))
    assert runs.config_hash({"lr": 1, "flag": True}) == runs.config_hash({"lr": 1.0, "flag": True}) != \
        runs.config_hash({"lr": 1.0, "flag": 1})  # fine-tuning identities are dicts; a bool is no number

    # A run recorded when numbers were hashed as written is still found: the config as it was written then.
    cfg = pretrain_cfg(tmp_path)  # the shipped spelling: disc_weight 50.0
    written = hashlib.sha256(json.dumps(runs.identity(cfg), sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert written != runs.config_hash(cfg) and written in runs.identity_hashes(cfg)
    client = runs.setup(f"sqlite:///{tmp_path}/mlflow.db", "e")
    recorded = client.create_run(client.get_experiment_by_name("e").experiment_id,
                                 tags={runs.TAG_CONFIG_HASH: written})
    client.set_terminated(recorded.info.run_id)
    assert runs.find_finished_run(client, "e", runs.identity_hashes(cfg)).info.run_id == recorded.info.run_id
