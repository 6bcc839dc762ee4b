"""`python -m electra_ablate.results export|import|render sweep=<name> [scale=...] [bundle=<folder>]`.

export: the sweep's runs in the store ($ELECTRA_ABLATE_HOME, logger.tracking_uri) -> a results bundle, by default
        reports/<report>/runs beside the committed report.
import: a bundle -> the store's MLflow experiment: the runs keep their ids, tags, metrics and predictions; runs
        already there are skipped, a conflict is refused with nothing written; the sweep's dry run then plans
        only what is left.
render: the report from the bundle alone: imported into a new temporary store, then written as
        `python -m electra_ablate.report` writes it (report_dir=...), with no store and no ../shared.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig

from electra_ablate.common import cli, console
from electra_ablate.common.portable import portable
from electra_ablate.report.build import BUNDLE_DIR, write_report
from electra_ablate.results import bundle as files
from electra_ablate.results.bundle import BundleError
from electra_ablate.results.export import export, placeholders
from electra_ablate.results.importing import import_bundle
from electra_ablate.sweep.compose import SweepContext, context_from_cfg, make_context
from electra_ablate.sweep.spec import REPO_ROOT
from electra_ablate.tracking import runs as tracking

ACTIONS = ("export", "import", "render")
USAGE = ("usage: python -m electra_ablate.results export|import|render sweep=<name> [scale=...] [bundle=<folder>] "
         "[report_dir=<folder>] (--help for more)")


def bundle_dir(cfg: DictConfig, ctx: SweepContext) -> Path:
    """The bundle's folder: `bundle=`, else reports/<report>/runs of the checkout."""
    return Path(cfg.bundle) if cfg.bundle else REPO_ROOT / "reports" / ctx.spec.report_name / BUNDLE_DIR


def _checked(bundle: files.Bundle, where: Path, ctx: SweepContext) -> files.Bundle:
    """Refuse a bundle of another experiment or scale than the sweep named."""
    m = bundle.manifest
    if m.get("experiment") != ctx.experiment or m.get("scale") != ctx.spec.scale_name:
        raise BundleError(
            f"{where} holds runs of MLflow experiment {m.get('experiment')!r} at scale {m.get('scale')!r} (sweep "
            f"{m.get('sweep')!r}), not of {ctx.experiment!r} at scale {ctx.spec.scale_name!r} as sweep="
            f"{ctx.spec.name} names: give the sweep and scale it was exported from (sweep={m.get('sweep')} "
            f"scale={m.get('scale')}), or the bundle of this one")
    return bundle


def do_export(cfg: DictConfig, ctx: SweepContext) -> Path:
    client = tracking.existing_client(ctx.tracking_uri, ctx.experiment)
    if client is None or client.get_experiment_by_name(ctx.experiment) is None:
        raise BundleError(f"no MLflow experiment {ctx.experiment!r} in {portable(ctx.tracking_uri)}: nothing to "
                          "export (set ELECTRA_ABLATE_HOME or logger.tracking_uri to the store the sweep ran in)")
    tic = time.perf_counter()
    made = export(ctx, client, str(cfg.paths.data_dir))
    out = files.write(made, bundle_dir(cfg, ctx))
    size = sum(f["bytes"] for f in made.manifest["files"].values())
    runs = made.manifest["runs"]
    counts = ", ".join(f"{kind} {sum(s.values())}" for kind, s in sorted(runs.items()))
    left = made.manifest.get("running_left_out")
    print(f"exported {len(made.run_ids)} run(s) ({counts}) of experiment {ctx.experiment} to {portable(str(out))}: "
          f"{size / 2**20:.2f} MiB in {time.perf_counter() - tic:.0f} s"
          + (f"; {left} run(s) still RUNNING left out" if left else ""), flush=True)
    return out


def _import_into(bundle: files.Bundle, ctx: SweepContext, data_dir: str) -> tuple:
    client = tracking.setup(ctx.tracking_uri, ctx.experiment)
    paths = {name: path for path, name in placeholders(ctx, data_dir).items()}
    return client, import_bundle(bundle, client, ctx.experiment, ctx.output_root, paths)


def do_import(cfg: DictConfig, ctx: SweepContext) -> None:
    where = bundle_dir(cfg, ctx)
    bundle = _checked(files.read(where), where, ctx)
    tic = time.perf_counter()
    _, done = _import_into(bundle, ctx, str(cfg.paths.data_dir))
    print(f"imported {len(done.written)} run(s) from {portable(str(where))} into experiment {ctx.experiment} of "
          f"{portable(ctx.tracking_uri)}; {len(done.skipped)} already there, skipped "
          f"({time.perf_counter() - tic:.0f} s)", flush=True)


def do_render(cfg: DictConfig, ctx: SweepContext) -> Path:
    where = bundle_dir(cfg, ctx)
    bundle = _checked(files.read(where), where, ctx)
    with tempfile.TemporaryDirectory(prefix="electra_ablate_render_") as tmp:
        store = Path(tmp) / "store"
        paths = {"root_dir": str(REPO_ROOT), "data_dir": str(cfg.paths.data_dir), "output_root": str(store),
                 "cache_dir": str(store / "cache")}
        here = make_context(ctx.spec.path, ctx.spec.scale, paths, f"sqlite:///{store}/mlflow.db",
                            ctx.pretrain_overrides, ctx.finetune_overrides)
        here.bundle = portable(str(where))
        before = os.environ.get("ELECTRA_ABLATE_HOME")
        os.environ["ELECTRA_ABLATE_HOME"] = str(store)  # the report names the store as $ELECTRA_ABLATE_HOME
        try:
            client, _ = _import_into(bundle, here, str(cfg.paths.data_dir))
            return write_report(here, client, cfg.report_dir, bootstrap_seed=cfg.bootstrap_seed)
        finally:
            if before is None:
                os.environ.pop("ELECTRA_ABLATE_HOME", None)
            else:
                os.environ["ELECTRA_ABLATE_HOME"] = before


@hydra.main(config_path=str(cli.CONF_DIR), config_name="results", version_base="1.3")
@cli.one_line_errors
def main(cfg: DictConfig) -> str | None:
    console.setup()
    ctx = context_from_cfg(cfg)
    action = str(cfg.action)
    if action == "export":
        return str(do_export(cfg, ctx))
    if action == "import":
        do_import(cfg, ctx)
        return None
    return str(do_render(cfg, ctx))


@cli.one_line_errors
def cli_main() -> None:
    """Console entry: the action first (`export`, `import`, `render`), then Hydra overrides."""
    console.take_verbose_flag()
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        sys.exit(__doc__ if not args else USAGE + "\n\n" + __doc__)
    if args[0] not in ACTIONS:
        sys.exit(f"error: the first word is what to do, one of {', '.join(ACTIONS)}; got {args[0]!r}. {USAGE}")
    sys.argv = [sys.argv[0], *args[1:], f"action={args[0]}"]
    cli.check_args("results")
    main()
