"""The "What holds at CPU scale" tables (docs/findings.md's short and full ones) and README.md's headline: made from
the CPU-scale reports' verdict records, current with the committed ones, a claim on shared runs listed once, a sweep
not run yet listed with its command, the sanity checks folded into one row of the short table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from electra_ablate.report import build, headline, holds, holds_tables
from electra_ablate.report import multibootstrap as mb
from electra_ablate.report.verdicts import Claim, Verdict
from electra_ablate.sweep.compose import make_context
from electra_ablate.sweep.spec import REPO_ROOT, load_sweep
from electra_ablate.tracking import runs as tracking

BERT = {"steps": 6000, "batch": 128, "seq": 64, "tokens": 49_152_000, "flops": 2.029e14}
ELECTRA = {"steps": 4944, "batch": 128, "seq": 64, "tokens": 40_501_248, "flops": 2.030e14}


def difference(estimate: float, low: float, high: float) -> mb.Difference:
    return mb.Difference(estimate=estimate, low=low, high=high, sign_probability=0.99, sd=1.0, sd_seeds=0.8,
                         sd_examples=0.5, mean_a=0.0, mean_b=0.0)


def cpu_regime_verdicts() -> list[Verdict]:
    vs = Claim("ELECTRA beats BERT", "Table 5", ("electra",), ("bert",), "85.0 vs 82.2 (+2.8)")
    floor = Claim("Pre-training beats no pre-training (sanity check): bert > none", "none (floor of every table)",
                  ("bert",), ("none",))
    return [Verdict(vs, difference(-7.6682, -10.6271, -4.9763), ("sst2",), {"electra": 3, "bert": 3}, 5.0, True,
                    "reversed", "–", runs={"electra": 15, "bert": 15}),
            Verdict(floor, difference(2.8158, 0.6911, 5.2389), ("sst2",), {"bert": 3, "none": 15}, 3.0, True,
                    "holds", "–", runs={"bert": 15, "none": 15})]


def write_records(report_dir: Path, records: dict[str, list[Verdict]]) -> None:
    for (name, scale), results in records.items():
        spec = load_sweep(name, scale)
        (report_dir / f"{spec.report_name}.md").write_text("# report\n")
        holds.write_record(report_dir / spec.report_name / holds.RECORD, spec, results,
                           {"bert": BERT, "electra": ELECTRA, "none": None})


def test_the_tables_are_current_with_the_committed_reports():
    for path, (text, expected) in holds.rewritten(REPO_ROOT, REPO_ROOT / "reports").items():
        assert expected == text, f"{path}'s 'What holds at CPU scale' is out of date: run `python -m electra_ablate.report.holds`"
    assert holds.main(["--check"]) == 0


def test_the_short_row_says_claim_verdict_difference_and_report_and_folds_the_sanity_checks(tmp_path):
    verdicts = cpu_regime_verdicts()
    electra_floor = Verdict(Claim("Pre-training beats no pre-training (sanity check): electra > none", "floor",
                                  ("electra",), ("none",)), difference(-4.85, -7.69, -2.24), ("sst2",),
                            {"electra": 3, "none": 15}, 3.0, True, "reversed", "–", runs={"electra": 15, "none": 15})
    write_records(tmp_path, {("cpu_regime", None): [*verdicts, electra_floor],
                             ("table5_efficiency", "cpu"): verdicts[:1]})
    lines = holds.summary_table(holds.load_records(tmp_path))
    assert lines[:2] == ["| claim | verdict (SST-2) | Δ points [95% interval] | report |", "|---|---|---|---|"]
    assert ("| ELECTRA beats BERT | **reversed** | -7.7 [-10.6, -5.0] | [cpu_regime.md](reports/cpu_regime.md), "
            "[table5_efficiency_cpu.md](reports/table5_efficiency_cpu.md) |") in lines
    (sanity,) = [line for line in lines if line.startswith("| Pre-training beats no pre-training")]
    assert sanity == ("| Pre-training beats no pre-training (each pre-trained arm against random init of its shape: "
                      "2 comparisons) | **holds** for 1 (bert); **reversed** for 1 (electra) | -4.8 to +2.8 | "
                      "[cpu_regime.md](reports/cpu_regime.md) |"), sanity
    assert not any("sanity check" in line for line in lines)


def test_a_row_says_the_verdict_interval_scale_seeds_and_report(tmp_path):
    write_records(tmp_path, {("cpu_regime", None): cpu_regime_verdicts()})
    rows = [line for line in holds.table(holds.load_records(tmp_path)) if "reports/cpu_regime.md" in line]
    assert rows == [
        "| ELECTRA beats BERT | Table 5: 85.0 vs 82.2 (+2.8) | **reversed** | -7.67 [-10.63, -4.98] on SST-2 | "
        "electra 40.5M tokens, bert 49.2M tokens; 2e+14 FLOPs each | 3 x 5 | [cpu_regime.md](reports/cpu_regime.md) |",
        "| Pre-training beats no pre-training (sanity check): bert > none | none (floor of every table) | **holds** | "
        "+2.82 [+0.69, +5.24] on SST-2 | bert 49.2M tokens, none not pre-trained; 2e+14 FLOPs | 3 x 5 / 15 runs | "
        "[cpu_regime.md](reports/cpu_regime.md) |"]


def test_a_claim_two_reports_test_on_the_same_runs_is_listed_once_with_both(tmp_path):
    verdicts = cpu_regime_verdicts()
    write_records(tmp_path, {("cpu_regime", None): verdicts, ("table5_efficiency", "cpu"): verdicts[:1]})
    rows = [line for line in holds.table(holds.load_records(tmp_path)) if line.startswith("| ELECTRA beats BERT |")]
    assert len(rows) == 1, rows
    assert rows[0].endswith("[cpu_regime.md](reports/cpu_regime.md), "
                            "[table5_efficiency_cpu.md](reports/table5_efficiency_cpu.md) |")


def test_a_sweep_without_a_committed_report_lists_its_claims_and_the_command(tmp_path):
    lines = holds.table(holds.load_records(tmp_path))
    pending = [line for line in lines if line.startswith("|") and "not run yet" in line]
    assert any(line.startswith("| Tying all weights beats no tying |") for line in pending)
    assert any("Generators 1/4-1/2" in line for line in pending) and any("two-stage" in line for line in pending)
    for name, scale in holds.CPU_SCALE:
        assert any(f"sweep={name}{'' if scale is None else f' scale={scale}'} hydra/launcher=joblib" in line
                   for line in lines), name
    # A report whose record is missing (written before records were) counts as not committed.
    (tmp_path / "weight_sharing_cpu.md").write_text("# report\n")
    assert holds.load_records(tmp_path)[2]["report"] is None


def test_the_section_needs_both_markers_and_only_its_lines_change():
    text = f"intro\n{holds.START}\nold\n{holds.END}\nafter\n"
    assert holds.replace_section(text, ["| a |"]) == f"intro\n{holds.START}\n| a |\n{holds.END}\nafter\n"
    with pytest.raises(holds.HoldsError, match="needs one"):
        holds.replace_section("no markers\n", ["| a |"])
    with pytest.raises(holds.HoldsError, match="needs one"):
        holds.replace_section(f"{holds.END}\n{holds.START}\n", ["| a |"])


def test_a_bad_record_names_the_file_and_the_command_that_remakes_it(tmp_path):
    write_records(tmp_path, {("cpu_regime", None): cpu_regime_verdicts()})
    (tmp_path / "cpu_regime" / holds.RECORD).write_text("{half")
    with pytest.raises(holds.HoldsError, match=r"cpu_regime/verdicts.json is not JSON.*sweep=cpu_regime`"):
        holds.load_records(tmp_path)


def test_writing_a_cpu_scale_report_into_the_repository_refreshes_the_findings(tmp_path, data_dir, monkeypatch, capsys):
    """Into the repository's reports/ (here a stand-in), docs/findings.md and README.md follow; into any other
    folder they do not."""
    repo = tmp_path / "repo"
    (repo / "reports").mkdir(parents=True)
    readme, findings = repo / "README.md", repo / holds.DETAIL_DOC
    readme_text = f"# x\n{holds.QUICK_START}\n{holds.QUICK_END}\n{headline.SUMMARY_START}\n{headline.SUMMARY_END}\n"
    readme.write_text(readme_text)
    findings.parent.mkdir()
    findings_text = (f"# y\n{holds.START}\n{holds.END}\n{headline.START}\n{headline.END}\n"
                     f"{holds.DETAIL_START}\n{holds.DETAIL_END}\n")
    findings.write_text(findings_text)
    monkeypatch.setattr(build, "REPO_ROOT", repo)
    paths = {"root_dir": str(tmp_path), "data_dir": str(data_dir), "output_root": str(tmp_path / "outputs"),
             "cache_dir": str(tmp_path / "cache")}
    ctx = make_context("weight_sharing", "cpu", paths, f"sqlite:///{tmp_path}/mlflow.db")
    client = tracking.setup(ctx.tracking_uri, ctx.experiment)

    build.write_report(ctx, client, tmp_path / "elsewhere")
    # The console gets what the report says: its state, one line per verdict, and where it is.
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("weight_sharing (scale cpu): ") and "No fine-tuning run of a final checkpoint" in out[1]
    assert "  not run     Tying all weights beats no tying: needs fine-tuning runs of all, none" in out
    assert out[-1] == f"report: {tmp_path / 'elsewhere' / 'weight_sharing_cpu.md'}"
    assert (tmp_path / "elsewhere" / "weight_sharing_cpu" / holds.RECORD).is_file()
    assert readme.read_text() == readme_text and findings.read_text() == findings_text

    build.write_report(ctx, client, repo / "reports")
    record = json.loads((repo / "reports" / "weight_sharing_cpu" / holds.RECORD).read_text())
    assert record["report"] == "weight_sharing_cpu.md" and {c["verdict"] for c in record["claims"]} == {"not run"}
    # Every preset's column is there from the start: the others' reports are not committed yet. The page is under
    # docs/, so its links to reports/ go up a folder.
    text = findings.read_text()
    assert ("| Tying all weights beats no tying | not run | – | not run yet | – |  | "
            "[weight_sharing_cpu.md](../reports/weight_sharing_cpu.md) |" in text)
    assert "| Tying all weights beats no tying | Section 3.2: 84.4 vs 83.6 (+0.8) | not run |" in text
    assert "](reports/" not in text
    # No main-job or long-run report yet: README's blocks say so, and the headline links the findings page.
    assert "The main job's report is not committed yet" in readme.read_text()
    assert "The long run's report is not committed yet." in readme.read_text()
    assert f"[{headline.FINDINGS}]({headline.FINDINGS})" in readme.read_text()


def test_the_readme_headline_is_the_long_run_in_one_paragraph():
    record = json.loads((REPO_ROOT / "reports" / "cpu_long" / holds.RECORD).read_text())
    lines = headline.summary(record)
    assert len(lines) <= 6, lines
    text = " ".join(lines)
    claim = record["claims"][0]
    assert f"{claim['claim']}: **{claim['verdict']}**, {claim['estimate']:+.1f}" in text
    assert text.endswith(f"[{headline.FINDINGS}]({headline.FINDINGS}).")


def test_a_report_with_jobs_missing_is_marked_incomplete(tmp_path):
    spec = load_sweep("table5_efficiency", "cpu")
    (tmp_path / f"{spec.report_name}.md").write_text("# report\n")
    holds.write_record(tmp_path / spec.report_name / holds.RECORD, spec, cpu_regime_verdicts()[:1],
                       {"bert": BERT, "electra": ELECTRA}, ["pre-training electra_15 seed 2: missing", "x: FAILED"])
    lines = holds.table(holds.load_records(tmp_path))
    (row,) = [line for line in lines if line.startswith("|") and "table5_efficiency_cpu.md" in line]
    assert row.endswith("[table5_efficiency_cpu.md](reports/table5_efficiency_cpu.md) (incomplete) |"), row
    assert ("- [table5_efficiency_cpu.md](reports/table5_efficiency_cpu.md): 2 jobs of its grid missing or failed "
            "(the report lists them); `OMP_NUM_THREADS=1 python -m electra_ablate.sweep sweep=table5_efficiency "
            "scale=cpu hydra/launcher=joblib hydra.launcher.n_jobs=2` runs what is missing") in lines


def test_an_arm_not_pre_trained_yet_is_not_called_random_init(tmp_path):
    spec = load_sweep("table5_efficiency", "cpu")
    claim = Claim("Pre-training beats no pre-training (sanity check): electra_15 > none", "floor", ("electra_15",),
                  ("none",))
    missing = Verdict(claim, None, (), {}, float("nan"), False, "not run", "fine-tuning runs of electra_15")
    (arms,) = [c["arms"] for c in holds.record(spec, [missing], {"none": None})["claims"]]
    assert holds_tables._arms(arms) == "electra_15 not run yet, none not pre-trained"


LONG = ("cpu_long", "250M tokens, 30k vocabulary")
GLUE5 = ("cola", "sst2", "mrpc", "stsb", "rte")
TABLE1 = Claim("ELECTRA-Small beats BERT-Small at equal compute", "Table 1", ("electra",), ("bert",),
               "79.9 vs 75.1 (+4.8)")


def test_each_claim_shows_its_verdict_under_every_preset_side_by_side(tmp_path):
    write_records(tmp_path, {("cpu_regime", None): cpu_regime_verdicts()})
    # No report of the 30k preset or of the long run yet: their columns say so, and their sweeps' commands follow.
    pending = holds.table(*holds.preset_records(tmp_path))
    assert pending[0].startswith("| claim | paper (GLUE) | verdict: `cpu_regime` (2k vocabulary, sequence 64) | ")
    (row,) = [line for line in pending if line.startswith("| ELECTRA beats BERT |")]
    assert "| **reversed** | -7.67 [-10.63, -4.98] on SST-2 | not run yet | – | not in its sweeps | – |" in row
    assert any("`cpu_long`: `OMP_NUM_THREADS=1 python -m electra_ablate.sweep sweep=cpu_long hydra" in line
               for line in pending)
    # At the 30k vocabulary ELECTRA beats BERT and clears the floor; only the ELECTRA claims are recorded there.
    vs, floor = cpu_regime_verdicts()
    turned = Verdict(vs.claim, difference(3.1, 0.9, 5.2), ("sst2",), {"electra": 3, "bert": 3}, 5.0, True, "holds",
                     "–", runs={"electra": 15, "bert": 15})
    write_records(tmp_path, {("cpu_regime_30k", None): [turned]})
    lines = holds.table(*holds.preset_records(tmp_path))
    assert lines[0] == ("| claim | paper (GLUE) | verdict: `cpu_regime` (2k vocabulary, sequence 64) | "
                        "Δ points [95% interval] | verdict: `cpu_regime_30k` (30k vocabulary, sequence 128) | "
                        "Δ points [95% interval] | verdict: `cpu_long` (250M tokens, 30k vocabulary) | "
                        "Δ points [95% interval] | pre-training per run (cpu_regime; cpu_regime_30k; cpu_long) | "
                        "runs, pre-training x fine-tuning seeds (cpu_regime; cpu_regime_30k; cpu_long) | reports |")
    (row,) = [line for line in lines if line.startswith("| ELECTRA beats BERT |")]
    assert row == ("| ELECTRA beats BERT | Table 5: 85.0 vs 82.2 (+2.8) | **reversed** | -7.67 [-10.63, -4.98] on SST-2 "
                   "| **holds** | +3.10 [+0.90, +5.20] on SST-2 | not in its sweeps | – | electra 40.5M tokens, bert "
                   "49.2M tokens; 2e+14 FLOPs each; electra 40.5M tokens, bert 49.2M tokens; 2e+14 FLOPs each; – | "
                   "3 x 5; 3 x 5; – | [cpu_regime.md](reports/cpu_regime.md), [cpu_regime_30k.md](reports/cpu_regime_30k.md) |")
    # The long run's claim on the same arms (the paper's Table 1) stands right under it, not run yet.
    after = lines[lines.index(row) + 1]
    assert after.startswith("| ELECTRA-Small beats BERT-Small at equal compute | Table 1: 79.9 vs 75.1 (+4.8) | "
                            "not in its sweeps | – | not in its sweeps | – | not run yet | – |"), after
    (row,) = [line for line in lines if line.startswith(f"| {floor.claim.text} |")]
    # Not in the 30k record; table5_efficiency at scale cpu_30k tests it too, and is not committed yet; so does the
    # long run.
    assert "| **holds** | +2.82 [+0.69, +5.24] on SST-2 | not run yet | – | not run yet | – |" in row
    # The 30k sweeps not committed yet are listed with their commands, beside the first preset's.
    assert any("sweep=table5_efficiency scale=cpu_30k hydra/launcher=joblib" in line for line in lines)
    assert holds.is_cpu_scale(load_sweep("weight_sharing", "cpu_30k")) and holds.is_cpu_scale(load_sweep("cpu_long"))
    # The short table: each ablation preset's verdict and difference side by side, the long run's in one
    # column, empty for the claims it does not test.
    short = holds.summary_table(*holds.preset_records(tmp_path))
    assert short[0] == ("| claim | `cpu_regime` (SST-2) | Δ [95% interval] | `cpu_regime_30k` (SST-2) | Δ [95% interval] "
                        "| `cpu_long` (250M tokens, 30k vocabulary): verdict, Δ [95% interval] | reports |")
    assert ("| ELECTRA beats BERT | **reversed** | -7.7 [-10.6, -5.0] | **holds** | +3.1 [+0.9, +5.2] |  | "
            "[cpu_regime.md](reports/cpu_regime.md), [cpu_regime_30k.md](reports/cpu_regime_30k.md) |") in short
    assert ("| ELECTRA-Small beats BERT-Small at equal compute | not in its sweeps | – | not in its sweeps | – | "
            "not run yet |  |") in short
    # A claim not run yet under one preset says so in its cell; the commands stay out of the short table, which
    # names the sweeps not run yet once, under it.
    (tying,) = [line for line in short if line.startswith("| Tying all weights beats no tying |")]
    assert tying == "| Tying all weights beats no tying | not run yet | – | not run yet | – |  |  |", tying
    assert not any("python -m electra_ablate.sweep" in line for line in short)
    assert short[-1].startswith("Not run yet: `table5_efficiency` at scale `cpu`, `weight_sharing` at scale `cpu`")
    assert "`training_algorithms` at scale `cpu_30k`, `cpu_long`;" in short[-1] and "`cpu_regime_30k`" not in short[-1]
    # The sanity checks fold into one row that counts each preset's comparisons apart.
    (sane,) = [line for line in short if line.startswith(f"| {holds.SANITY}")]
    assert sane.startswith(f"| {holds.SANITY} (each pre-trained arm against random init of its shape: 1 comparison at "
                           "`cpu_regime`, none run yet at `cpu_regime_30k`, none run yet at `cpu_long`) | **holds** for "
                           "1 (bert) | +2.8 to +2.8 | not run yet | – | not run yet |"), sane


def test_the_long_run_fills_its_one_short_column_once_its_report_is_committed(tmp_path):
    vs, _ = cpu_regime_verdicts()
    glue5 = Verdict(TABLE1, difference(2.04, -0.51, 4.47), GLUE5, {"electra": 1, "bert": 1}, 5.0, True,
                    "unresolved at this scale", "–", runs={"electra": 5, "bert": 5})
    floor = Verdict(Claim("Pre-training beats no pre-training (sanity check): electra > none", "floor", ("electra",),
                          ("none",)), difference(3.3, 1.2, 5.1), GLUE5, {"electra": 1, "none": 5}, 5.0, True, "holds",
                    "–", runs={"electra": 5, "none": 5})
    write_records(tmp_path, {("cpu_regime", None): [vs], ("cpu_long", None): [glue5, floor]})
    short = holds.summary_table(*holds.preset_records(tmp_path))
    assert short[0].endswith("| `cpu_long` (250M tokens, 30k vocabulary; GLUE-5: CoLA, SST-2, MRPC, STS-B, RTE): "
                             "verdict, Δ [95% interval] | reports |"), short[0]
    (row,) = [line for line in short if line.startswith(f"| {TABLE1.text} |")]
    assert row == (f"| {TABLE1.text} | not in its sweeps | – | not in its sweeps | – | **unresolved at this scale** "
                   "(one pre-training seed), +2.0 [-0.5, +4.5] | [cpu_long.md](reports/cpu_long.md) |")
    (sane,) = [line for line in short if line.startswith(f"| {holds.SANITY}")]
    assert "1 comparison at `cpu_long`)" in sane and sane.endswith(
        "| **holds** for 1 (electra) (+3.3 to +3.3) | [cpu_long.md](reports/cpu_long.md) |"), sane
    assert "`cpu_long`" not in short[-1]  # committed: no longer among the sweeps not run yet
    full = holds.table(*holds.preset_records(tmp_path))
    (row,) = [line for line in full if line.startswith(f"| {TABLE1.text} |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:8] == ["not in its sweeps", "–", "not in its sweeps", "–", "**unresolved at this scale**",
                          "+2.04 [-0.51, +4.47] on GLUE-5: CoLA, SST-2, MRPC, STS-B, RTE"], cells
    assert cells[-2] == "–; –; 1 x 5" and cells[-1] == "[cpu_long.md](reports/cpu_long.md)"
