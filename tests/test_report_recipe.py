"""The report's fine-tuning recipe section: the runs' settings beside the paper's, deviations named."""

from __future__ import annotations

import pandas as pd

from types import SimpleNamespace

from electra_ablate.report.recipe import pretrain_recipe_lines, recipe_lines


def _runs(**params):
    base = {"resolved.lr": "0.0003", "resolved.size": "small", "finetune_optim.bias_correction": "False",
            "finetune_optim.loss_reduction": "sum", "task.epochs": "3", "glue_data.max_train_examples": "None",
            "glue_data.max_seq_length": "128", "glue_data.batch_size": "32", "finetune_optim.warmup_fraction": "0.1",
            "finetune_optim.weight_decay": "0.0", "dropout.hidden": "0.1", "dropout.attention": "0.1",
            "dropout.classifier": "0.1"}
    base.update(params)
    frame = pd.DataFrame([{"run_id": f"r{i}", **{f"params.{k}": v for k, v in base.items()}} for i in range(3)])
    scores = pd.DataFrame({"run_id": ["r0", "r1", "r2"], "task": ["sst2"] * 3})
    return scores, frame


def test_paper_recipe_has_no_deviation():
    text = "\n".join(recipe_lines(*_runs()))
    assert "These runs follow the paper's fine-tuning recipe." in text
    assert "**deviation**" not in text


def test_cpu_scale_settings_are_named_as_deviations():
    text = "\n".join(recipe_lines(*_runs(**{"resolved.lr": "0.001", "resolved.size": "tiny", "task.epochs": "2",
                                            "glue_data.max_train_examples": "2000",
                                            "glue_data.max_seq_length": "64"})))
    declared = text.split("Declared deviations from the paper's fine-tuning recipe")[1]
    assert "learning rate: 0.001 (paper: 0.0003 (Small's, for tiny))" in declared
    assert "epochs: 2 (sst2) (paper: 3 (sst2))" in declared
    assert "training examples (None = the whole training set): 2000" in declared
    assert "max sequence length: 64 (paper: 128)" in declared
    assert "bias correction" not in declared and "batch size" not in declared  # those follow the paper


def test_no_runs_no_section():
    assert recipe_lines(pd.DataFrame(columns=["run_id", "task"]), pd.DataFrame()) == []


def test_mean_pooling_is_a_deviation_and_runs_from_before_the_option_read_as_cls():
    text = "\n".join(recipe_lines(*_runs(pooling="mean")))
    assert "sentence representation (cls = the final [CLS] state): mean (paper: cls)" in text
    older = "\n".join(recipe_lines(*_runs()))  # no `pooling` param logged: the [CLS] state they used
    assert "| sentence representation (cls = the final [CLS] state) | cls | cls | |" in older
    assert "These runs follow the paper's fine-tuning recipe." in older


def test_the_named_recipe_and_its_dropout_are_declared():
    text = "\n".join(recipe_lines(*_runs(pooling="mean", preset="cpu_regime", **{"dropout.hidden": "0.0",
                                                                                 "dropout.attention": "0.0"})))
    assert "named recipe `cpu_regime` (conf/recipe/cpu_regime.yaml)" in text
    declared = text.split("Declared deviations from the paper's fine-tuning recipe")[1]
    assert "encoder dropout, hidden: 0.0 (paper: 0.1)" in declared
    assert "encoder dropout, attention: 0.0 (paper: 0.1)" in declared
    assert "classifier dropout" not in declared  # kept at the paper's 0.1
    assert "named recipe" not in "\n".join(recipe_lines(*_runs(preset="None")))


def test_the_named_recipes_per_task_settings_are_listed_and_each_tasks_value_shown():
    # conf/recipe/cpu_glue.yaml cuts SST-2's training set (its `per_task` table); CoLA takes the recipe's own.
    scores, frame = _runs(preset="cpu_glue")
    frame["params.glue_data.max_train_examples"] = ["8000", "None", "None"]
    scores["task"] = ["sst2", "cola", "cola"]
    text = "\n".join(recipe_lines(scores, frame))
    assert "| training examples (None = the whole training set) | None | None (cola), 8000 (sst2) | **deviation** |" in text
    assert ("Per-task settings of `cpu_glue` (its `per_task` table, conf/recipe/cpu_glue.yaml: each merged over the "
            "recipe for that task's runs alone; the other tasks (cola) take the recipe's own):") in text
    assert "| sst2 | `glue_data.max_train_examples` | 8000 |" in text
    # A recipe without a per-task table adds none.
    assert "Per-task settings" not in "\n".join(recipe_lines(*_runs(preset="cpu_regime")))


def _pretrain_states(**params):
    base = {"model.hidden_dropout_prob": "0.1", "model.attention_probs_dropout_prob": "0.1", "preset": "None"}
    base.update(params)
    run = SimpleNamespace(data=SimpleNamespace(params=base))
    return [SimpleNamespace(run=run), SimpleNamespace(run=None)]  # a job without a run yet is left out


def test_pretrain_recipe_names_the_layout_deviations_and_reads_older_runs_as_the_paper_block():
    older = "\n".join(pretrain_recipe_lines(_pretrain_states()))  # from before layer_norm / linear_bias existed
    assert "| LayerNorm placement (post = BERT's and ELECTRA's block) | post | post | |" in older
    assert "**deviation**" not in older and "named preset" not in older
    text = "\n".join(pretrain_recipe_lines(_pretrain_states(**{
        "model.layer_norm": "pre", "model.hidden_dropout_prob": "0.0", "model.attention_probs_dropout_prob": "0.0",
        "preset": "cpu_regime"})))
    assert "named preset `cpu_regime` (conf/experiment/cpu_regime.yaml)" in text
    declared = text.split("Declared deviations from the paper's pre-training recipe: ")[1]
    assert "LayerNorm placement (post = BERT's and ELECTRA's block): pre (paper: post)" in declared
    assert "hidden dropout: 0.0 (paper: 0.1)" in declared and "linear biases" not in declared
    assert pretrain_recipe_lines([SimpleNamespace(run=None)]) == []


def test_reinit_top_layers_is_a_deviation_and_runs_from_before_the_option_read_as_none():
    text = "\n".join(recipe_lines(*_runs(reinit_top_layers="1")))
    declared = text.split("Declared deviations from the paper's fine-tuning recipe")[1]
    assert "top layers re-initialised before fine-tuning: 1 (paper: 0)" in declared
    older = "\n".join(recipe_lines(*_runs()))  # no `reinit_top_layers` param logged: every layer as pre-trained
    assert "| top layers re-initialised before fine-tuning | 0 | 0 | |" in older
    assert "These runs follow the paper's fine-tuning recipe." in older
