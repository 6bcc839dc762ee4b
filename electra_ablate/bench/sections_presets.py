"""What a step costs at each named CPU preset (section `presets`): the price of a pre-training budget on one core.

BERT and ELECTRA steps at the shape of each preset in `PRESETS` (conf/experiment/: `cpu_regime`, a 2k vocabulary
and 64-token sequences; `cpu_regime_30k`, BERT's 30,522-piece vocabulary, at 64 and at its own 128 tokens),
interleaved step by step in this process on one thread, so that every ratio to `cpu_regime`'s BERT step is
measured under the same load. Beside each: the paper-accounted FLOPs of the step (electra_ablate.models.flops),
whose ratio says how far FLOPs predict the time, and the hours of one core that 1,000 such steps take.
"""

from __future__ import annotations

import torch

from electra_ablate.bench.builds import FastPath, OursRunner, compose_config, load_data, tokens
from electra_ablate.bench.measure import interleaved, median, paper_flops
from electra_ablate.bench.settings import Report, Settings, log
from electra_ablate.bench.step_costs import step_shape
from electra_ablate.common import precision as precision_lib

# (preset, overrides beside it): the first is the one every ratio is taken against.
PRESETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cpu_regime", ()),
    ("cpu_regime_30k", ("data.max_seq_length=64",)),
    ("cpu_regime_30k", ()),
)
OBJECTIVES = ("bert", "electra")


def section_presets(s: Settings, rep: Report) -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runners, batches, cfgs = {}, {}, {}
        for preset, extra in PRESETS:
            for objective in OBJECTIVES:
                name = " ".join((preset, *extra, objective))
                cfg = compose_config(s, "tiny", f"experiment={preset}", f"objective={objective}", *extra,
                                     keep_shape=True)
                data = load_data(cfg, s.device, 3)
                runners[name] = OursRunner(cfg, data, s.device, FastPath.from_runtime(cfg, s.device))
                batches[name], cfgs[name] = data.batches, cfg
        steps = {n: (lambda i, r=r, b=batches[n]: r.step([b[i]])) for n, r in runners.items()}
        timed, _ = interleaved(steps, 3, s.warmup, s.piece_reps, s.device)
        for (preset, extra), objective in ((p, o) for p in PRESETS for o in OBJECTIVES):
            name = " ".join((preset, *extra, objective))
            cfg, batch = cfgs[name], batches[name][0]
            b, t = batch["input_ids"].shape
            step_s = median(timed[name])
            rep.throughput.append({
                "kind": "preset", "preset": preset, "overrides": list(extra), "objective": objective,
                "batch": (b, t), "vocab": runners[name].system.model.config.vocab_size, "step_s": step_s,
                "tokens_per_s": tokens(batch) / step_s, "flops": paper_flops(runners[name], cfg, b, t),
                "core_h_per_1k_steps": step_s * 1000 / 3600,
                **step_shape(cfg, precision_lib.resolve(cfg.runtime.precision, s.device.type))})
            log(f"presets {name}: {step_s:.3f} s/step")
    finally:
        torch.set_num_threads(previous)
