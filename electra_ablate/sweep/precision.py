"""One precision per sweep: `precision: auto` (conf/sweep.yaml) is resolved once, at the sweep's first launch,
recorded on its MLflow record (the `precision` tag of its kind=sweep run) and given to every job it launches as
`runtime.precision=<it>` (first of the phase's overrides, in the multirun's command line rather than in the
generated config files, which a report of the sweep rewrites), so each of its pre-training and fine-tuning jobs
trains in it wherever it is launched. A later launch reads it back from the newest record of the sweep at the
same scale; a sweep recorded before the tag was takes the precision of its first pre-training run. An explicit
`precision=32-true|bf16-mixed` switches the sweep, and its record says so; a runtime.precision of the user's own
in pretrain_overrides or finetune_overrides comes after it and wins for that phase, and the record says that too."""

from __future__ import annotations

import dataclasses
import logging

from electra_ablate.common import precision
from electra_ablate.sweep.compose import SweepContext
from electra_ablate.tracking import attempts
from electra_ablate.tracking import runs as tracking

log = logging.getLogger(__name__)


def recorded(client, ctx: SweepContext) -> tuple[str, str] | None:
    """(precision, where it was read) of the sweep's earlier launches, or None for a sweep never launched."""
    exp = client.get_experiment_by_name(ctx.experiment)
    if exp is None:
        return None
    records = client.search_runs([exp.experiment_id], max_results=1000, order_by=["attributes.start_time DESC"],
                                 filter_string=f"tags.{tracking.TAG_KIND} = 'sweep' and "
                                               f"tags.{tracking.TAG_SWEEP} = '{ctx.spec.name}'")
    for r in records:
        if r.data.tags.get("scale") == ctx.spec.scale_name and r.data.tags.get(attempts.TAG_PRECISION):
            return r.data.tags[attempts.TAG_PRECISION], f"the sweep's record {r.info.run_id}"
    first = client.search_runs([exp.experiment_id], max_results=1, order_by=["attributes.start_time ASC"],
                               filter_string=f"tags.{tracking.TAG_KIND} = 'pretrain' and "
                                             f"tags.{tracking.TAG_SWEEP} = '{ctx.spec.name}'")
    resolved = first[0].data.params.get(attempts.PARAM_RESOLVED_PRECISION) if first else None
    if resolved:
        return resolved, f"its first pre-training run {first[0].info.run_id}"
    return None


def device_type(ctx: SweepContext) -> str:
    """Where the sweep's jobs train ("cpu" | "cuda"), as this machine sees it, from a fine-tuning job's config with
    the sweep's overrides."""
    return precision.training_device(ctx.compose_finetune().trainer.accelerator)


def choose(client, ctx: SweepContext, requested: str) -> attempts.Choice:
    """The sweep's precision for `precision=requested`: its recorded one for `auto` (resolved here on its first
    launch), else the one given; a warning line where this machine is much slower at it."""
    requested = str(requested)
    device = device_type(ctx)
    before = recorded(client, ctx) if client is not None else None
    if requested == precision.AUTO and before is not None:
        chosen, how = before[0], (f"kept from {before[1]} (precision=auto would be "
                                  f"{precision.resolve(requested, device)} here)")
    elif requested == precision.AUTO:
        chosen, how = precision.resolve(requested, device), f"precision=auto resolved on {device} at the first launch"
    else:
        chosen = requested
        how = (f"precision={requested} given: switched from {before[0]} ({before[1]})"
               if before is not None and before[0] != requested else f"precision={requested} given")
    choice = attempts.Choice(chosen, how, attempts.slow_warning(chosen, device, how, switch="precision=32-true"))
    if choice.warning:
        log.warning("sweep %s: %s", ctx.spec.name, choice.warning)
    else:
        log.info("sweep %s: its jobs train in %s (%s)", ctx.spec.name, chosen, how)
    return choice


def applied(ctx: SweepContext, choice: attempts.Choice) -> tuple[SweepContext, attempts.Choice]:
    """`ctx` whose every job trains in `choice.precision`, and the choice with the overrides of the user's own that
    set another for a phase named in its `how`."""
    first = f"runtime.precision={choice.precision}"
    own = [f"{phase}_overrides set {o}" for phase, overrides in (("pretrain", ctx.pretrain_overrides),
                                                                  ("finetune", ctx.finetune_overrides))
           for o in overrides if o.startswith("runtime.precision=") and o != first]
    if own:
        log.warning("sweep %s: %s, which wins over the sweep's %s for those jobs", ctx.spec.name, "; ".join(own),
                    choice.precision)
        choice = choice._replace(how=f"{choice.how}; {'; '.join(own)}, which wins for those jobs")
    return dataclasses.replace(ctx, pretrain_overrides=[first, *ctx.pretrain_overrides],
                               finetune_overrides=[first, *ctx.finetune_overrides]), choice
