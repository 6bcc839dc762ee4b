"""The markdown report of one sweep: `python -m electra_ablate.report sweep=<name> [scale=...]`.

Reads the sweep's MLflow experiment into pandas (report/collect.py) and writes `reports/<name>.md` with PNG
figures in `reports/<name>/` (`<name>_<scale>` at a scale other than the sweep's default): the median GLUE dev table per variant beside the paper's number
(report/paper.py, reading report/paper_results.yaml, the one place published numbers live), the spread over
fine-tuning seeds (mean, std, min, max, best-of-N: the paper reports the median of 10 runs, section 3.1),
bootstrap confidence intervals for each variant's difference from the baseline (report/stats.py), each
arm's degenerate runs (dev predictions of one class: report/predictions.py), generator-size curves (paper
Figure 3 left), learning curves against pre-training FLOPs counted as the paper does whenever the sweep
fine-tunes intermediate checkpoints, with where each arm clears random init and crosses the baseline at equal FLOPs
(electra_ablate.models.flops; report/curves.py, report/figures.py), each pre-training
run's masked-LM accuracy and discriminator AUC against its FLOPs (report/collect.py, pretraining_curves), verdicts on the
paper's claims (report/claims.py) on the GLUE mean and, for several tasks, per task (report/verdicts.py), which tasks see
pre-training at all (report/sensitivity.py: each pre-trained arm against random init per task, with the dev-set
noise and the cost of a fine-tuning run), the verdicts also as data in `reports/<name>/verdicts.json`, from which
report/holds.py (with holds_record.py and holds_tables.py) makes the README's "What holds at CPU scale" table,
refreshed here when a CPU-scale report is written into the repository's `reports/`, failed and missing runs (a task
without local GLUE data once, as skipped), the fine-tuning recipe with each task's own settings (report/recipe.py),
and how the numbers were produced (report/provenance.py); report/markdown.py renders it. The runs counted are
exactly the sweep's grid: pre-training runs found by config hash, fine-tuning runs by (pre-training run, step, task,
seed), newest finished first.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import hydra
from omegaconf import DictConfig

from electra_ablate.common import cli, console
from electra_ablate.common.io import atomic_dir, atomic_file
from electra_ablate.common.portable import portable
from electra_ablate.report import (arms, expected_max, headline, holds, outcome, precision, recipes, sensitivity, stats,
                                   verdicts)
from electra_ablate.report.collect import SweepData, collect
from electra_ablate.report.figures import (generator_size_figure, glue_figure, learning_curves_figure, task_curves_figure,
                                           pretraining_curves_figure)
from electra_ablate.report.markdown import TASK_NAMES, end_of_pretraining_section, final_health, render
from electra_ablate.report.paper import load_paper_results
from electra_ablate.report.provenance import provenance
from electra_ablate.report.recipe import pretrain_recipe_lines, recipe_lines
from electra_ablate.report.stats import Summary, summarize
from electra_ablate.sweep.compose import SweepContext, context_from_cfg
from electra_ablate.sweep.spec import REPO_ROOT
from electra_ablate.tracking import runs as tracking

BUNDLE_DIR = "runs"  # reports/<report>/runs: the results bundle the report re-renders from (electra_ablate.results)


def write_report(ctx: SweepContext, client, report_dir: str | Path, running_sweep_run: str | None = None,
                 running_wall_time: float | None = None, echo: bool = True, bootstrap_seed: int | None = None) -> Path:
    """Write <report_dir>/<stem>.md and <report_dir>/<stem>/*.png atomically (the stem: spec.report_name);
    returns the markdown's path. With `echo`, print what it says (report/outcome.py) to the console. Every bootstrap
    of the report is drawn from `bootstrap_seed` (None: 0, the committed reports' seed)."""
    with stats.bootstrap_seed(bootstrap_seed):
        return _write(ctx, client, report_dir, running_sweep_run, running_wall_time, echo)


def _write(ctx: SweepContext, client, report_dir: str | Path, running_sweep_run: str | None,
           running_wall_time: float | None, echo: bool) -> Path:
    report_dir = Path(report_dir)
    name = ctx.spec.report_name
    data = collect(ctx, client)
    summary = summarize(data)
    # The markdown is written first and put in place last, after the figure folder it points at: leaving the
    # `with`, the folder is swapped in, then the markdown; an error on the way leaves the old report whole.
    with atomic_file(report_dir / f"{name}.md") as md_tmp, atomic_dir(report_dir / name) as staging:
        kept = report_dir / name / BUNDLE_DIR
        if kept.is_dir():  # the results bundle beside the report is the runs', not the rendering's: it stays
            shutil.copytree(kept, staging / BUNDLE_DIR)
        text, results, under = _render_into(ctx, client, data, summary, staging, running_sweep_run, running_wall_time)
        md_tmp.write_text(portable(text))
    feeds = holds.is_cpu_scale(ctx.spec) or ctx.spec.report_name == headline.PROTOCOL  # README's and findings' lines
    if feeds and report_dir.resolve() == (REPO_ROOT / "reports").resolve():
        holds.sync(REPO_ROOT, report_dir)
    path = report_dir / f"{name}.md"
    if echo:
        health = final_health(data, summary.tasks)
        said = outcome.lines(data, summary, health, load_paper_results(), results, shown_path(path))
        if under:
            said += ["across recipes:", *(f"  {line}" for line in recipes.agreement_lines(under))]
        print("\n".join(said), flush=True)
    return path


def shown_path(path: Path) -> Path:
    """`path` relative to the working directory when it lies below it."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return Path(path)


def _render_into(ctx: SweepContext, client, data: SweepData, summary: Summary, staging: Path,
                 running_sweep_run: str | None, running_wall_time: float | None) -> tuple[str, list, list]:
    """Draw the figures into `staging`; return the markdown that points at them, the verdicts and, for a sweep of
    several recipes, each recipe's (report/recipes.py)."""
    name = ctx.spec.report_name
    figures: dict[str, str] = {}
    if summary.tasks:
        glue_figure(data, summary, staging / "glue.png")
        figures["glue"] = f"{name}/glue.png"
    if "generator_size" in ctx.spec.figures and generator_size_figure(data, staging / "generator_size.png"):
        figures["generator_size"] = f"{name}/generator_size.png"
    wants_curves = "learning_curves" in ctx.spec.figures or data.intermediate  # every checkpoint fine-tuned is shown
    if wants_curves and learning_curves_figure(data, staging / "learning_curves.png"):
        figures["learning_curves"] = f"{name}/learning_curves.png"
        if task_curves_figure(data, staging / "task_curves.png"):
            figures["task_curves"] = f"{name}/task_curves.png"
    if pretraining_curves_figure(data, staging / "pretraining_curves.png"):
        figures["pretraining_curves"] = f"{name}/pretraining_curves.png"
    final = data.final
    if summary.tasks:
        panels = expected_max.curves(final, summary.seed_glue, summary.tasks)
        titles = {**{t: TASK_NAMES[t] for t in summary.tasks}, "glue": verdicts.glue_label(summary.tasks)}
        if expected_max.figure(panels, titles, [v.label for v in ctx.spec.variants], staging / "expected_max.png"):
            figures["expected_max"] = f"{name}/expected_max.png"
    paper = load_paper_results()
    going = {s.job.variant: s.failed.info.status for s in data.pretrain if s.run is None and s.failed is not None}
    waiting = {v: f"the end of {v}'s pre-training ({status} in MLflow; the sweep resumes it)"
               for v, status in going.items()}
    results = verdicts.verdicts(ctx.spec, final, client, paper, predictions=data.predictions, waiting=waiting)
    scale = arms.numbers(ctx.spec, data.pretrain)
    under = recipes.gather(ctx, client, recipes.under(data, summary, results), paper, waiting)  # [] for one recipe
    holds.write_record(staging / holds.RECORD, ctx.spec, results, scale, data.problems, summary.tasks, data.skipped,
                       summary.as_record(), recipes.as_record(under, ctx.spec, scale))
    end = end_of_pretraining_section(ctx.spec, data.pretrain, paper, figures.get("pretraining_curves"))
    closing = pretrain_recipe_lines(data.pretrain) + end + recipe_lines(final, data.frame) + verdicts.render(results)
    if results:
        closing += ["In words, with the scale each verdict was reached at:", "",
                    *arms.scale_sentences(results, arms.describe(ctx.spec, data.pretrain)), ""]
    closing += sensitivity.section(ctx.spec, summary.tasks, summary.medians, results,
                                   sensitivity.task_seconds(final, data.frame, client))
    closing += precision.section(data, results)
    closing += recipes.section(under)
    return (render(data, summary, figures, provenance(data, running_sweep_run, running_wall_time, client), closing),
            results, under)


@hydra.main(config_path=str(cli.CONF_DIR), config_name="report", version_base="1.3")
@cli.one_line_errors
def main(cfg: DictConfig) -> str:
    console.setup()
    ctx = context_from_cfg(cfg)
    client = tracking.setup(ctx.tracking_uri, ctx.experiment)
    return str(write_report(ctx, client, cfg.report_dir, bootstrap_seed=cfg.bootstrap_seed))


@cli.one_line_errors
def cli_main() -> None:
    """Console entry: a misspelt key stops here with the keys it may mean, before Hydra starts (cli.py)."""
    console.take_verbose_flag()
    cli.check_args("report")
    main()


if __name__ == "__main__":
    cli_main()
