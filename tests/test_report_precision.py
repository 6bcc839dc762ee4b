"""The report says which precision and CPU each arm's runs trained in, and marks every table cell, curve point and
verdict whose runs mix them, with how many runs of each; a store recorded before attempts were tagged counts each
run's `runtime.resolved_precision` param."""

from __future__ import annotations

from mlflow.entities import Param, RunTag

from electra_ablate.report.build import write_report
from electra_ablate.tracking import runs as tracking
from tests.hermetic import finetune_hash_of
from tests.test_report import finetune_run, make_context, pretrain_run


def _record(client, run_id: str, params: dict | None = None, tags: dict | None = None) -> None:
    client.log_batch(run_id, params=[Param(k, v) for k, v in (params or {}).items()],
                     tags=[RunTag(k, v) for k, v in (tags or {}).items()])


def _mixed_store(tmp_path, data_dir):
    """electra pre-trained in bf16-mixed; bert's run resumed in 32-true after a bf16-mixed first attempt; their
    fine-tuning runs in bf16-mixed but for electra's RTE seed 2 (32-true, recorded as before: the param only), and
    electra's MRPC seed 2 on another CPU."""
    ctx = make_context(tmp_path, data_dir)
    client = tracking.setup(ctx.tracking_uri, "mini")
    ids = {v: pretrain_run(client, ctx, v) for v in ("electra", "bert")}
    bf16 = {"runtime.resolved_precision": "bf16-mixed"}
    _record(client, ids["electra"], bf16)
    _record(client, ids["bert"], bf16, {"attempt.1.precision": "bf16-mixed", "attempt.2.precision": "32-true"})
    hashes = finetune_hash_of(ctx, client)
    for variant in ("electra", "bert"):
        for step in (50, 100):
            for task in ("rte", "mrpc"):
                for seed in range(3):
                    run_id = finetune_run(client, ids[variant], variant, step, task, seed, 60.0 + seed, hashes=hashes)
                    fp32 = (variant, step, task, seed) == ("electra", 100, "rte", 2)
                    other_cpu = (variant, step, task, seed) == ("electra", 100, "mrpc", 2)
                    _record(client, run_id, {"runtime.resolved_precision": "32-true" if fp32 else "bf16-mixed"},
                            {"attempt.1.cpu": "CPU B" if other_cpu else "CPU A"})
    return ctx, client


def test_a_report_of_mixed_precisions_marks_the_mixed_cells_with_their_counts(tmp_path, data_dir):
    ctx, client = _mixed_store(tmp_path, data_dir)
    text = write_report(ctx, client, tmp_path / "reports", echo=False).read_text()
    assert "**Warning: runs of different precisions are pooled or compared here**" in text.split("## GLUE dev")[0]
    glue = text.split("## GLUE dev")[1].split("\n## ")[0]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in glue.splitlines() if line.startswith("| ")}
    electra, bert = next(r for k, r in rows.items() if k.startswith("electra")), \
        next(r for k, r in rows.items() if k.startswith("bert"))
    header = next(r for k, r in rows.items() if k == "variant")
    rte, mrpc = header.index("RTE"), header.index("MRPC")
    assert "‡" in electra[rte] and "‡" in bert[rte] and "‡" in bert[mrpc] and "‡" not in electra[mrpc]
    assert "‡ marks a cell whose runs mix precisions" in glue
    section = text.split("## Precision and hardware")[1].split("\n## ")[0]
    precisions, cpus = section.split("Numbers whose runs mix CPU models")
    assert "- table cell electra RTE: fine-tuning 2 bf16-mixed, 1 32-true" in precisions
    assert "- table cell bert RTE: pre-training 1 bf16-mixed then 32-true" in precisions
    assert "table cell electra MRPC" not in precisions  # one precision: not marked
    assert "curve point electra at step 50" not in precisions
    assert "| bert | **mixed**: 1 bf16-mixed then 32-true |" in precisions  # the arm's own row
    assert "- table cell electra MRPC: fine-tuning 2 CPU A, 1 CPU B" in cpus
    assert "table cell electra RTE" not in cpus


def test_a_store_of_one_precision_marks_nothing(tmp_path, data_dir):
    ctx = make_context(tmp_path, data_dir)
    client = tracking.setup(ctx.tracking_uri, "mini")
    pretrain_run(client, ctx, "electra")  # recorded before precision was: unrecorded, never a mix
    text = write_report(ctx, client, tmp_path / "reports", echo=False).read_text()
    assert "runs of different precisions" not in text and "‡" not in text
    assert "No table cell, curve point or verdict mixes precisions." in text
