"""The sections that check our pre-training step rather than time it: equal work against the transformers
reference (`equal`), peak memory and gradient accumulation (`memory`), host-device synchronisation (`sync`)."""

from __future__ import annotations

import torch

from electra_ablate.bench.builds import FastPath, OursRunner, TransformersRunner, compose_config, load_data
from electra_ablate.bench.measure import SyncFinder, on_cuda, run_probe
from electra_ablate.bench.settings import BenchError, Report, Settings, log
from electra_ablate.objectives.base import Batch


def section_equal(s: Settings, rep: Report, model: str) -> None:
    """Identical weights and corrupted batch, dropout off: both implementations must agree on losses and gradients."""
    cfg = compose_config(s, model)
    data = load_data(cfg, s.device, 1)
    batch = data.batches[0]
    fp = FastPath.from_runtime(cfg, s.device)
    ours = OursRunner(cfg, data, s.device, fp)
    ref = TransformersRunner(cfg, data, s.device, fp.fused_adam)
    ref.load_from(ours)
    ours.system.eval()
    ref.disc.eval()
    ref.gen.eval()
    objective = ours.system.objective
    captured = {}
    corrupt = objective.corrupt

    def capture(b, generator):
        captured["fake"] = fake = corrupt(b, generator)
        return fake

    objective.corrupt = capture
    torch.manual_seed(1234)
    out = objective(Batch(**batch), ours.nets)
    out.loss.backward()
    fake = captured["fake"]
    gen_out, disc_out, ref_loss = ref.losses(batch, fake.masked.input_ids, fake.masked.labels, fake.input_ids, fake.replaced)
    ref_loss.backward()
    pairs = []
    for net, hf_net in ((ours.nets.model, ref.disc), (ours.nets.generator, ref.gen)):
        hf_params = dict(hf_net.named_parameters())
        pairs += [(p.grad, hf_params[n].grad) for n, p in net.named_parameters()
                  if n in hf_params and p.grad is not None and hf_params[n].grad is not None]
    # Difference relative to the tensor's largest gradient, floored at 1e-3 of the largest gradient anywhere:
    # some gradients are exactly zero in exact arithmetic (attention key biases: softmax ignores a constant
    # added to every score of a query) and only rounding noise in both implementations.
    floor = 1e-3 * max(float(b.abs().max()) for _, b in pairs)
    worst = max(float((a - b).abs().max()) / max(float(b.abs().max()), floor) for a, b in pairs)
    compared = len(pairs)
    values = {
        "total": (out.loss.item(), ref_loss.item()),
        "generator MLM": (out.sums["mlm_loss"][0].item(), gen_out.loss.item()),
        "discriminator": (out.sums["disc_loss"][0].item(), disc_out.loss.item()),
    }
    rel = {k: abs(a - b) / max(abs(b), 1e-12) for k, (a, b) in values.items()}
    passed = max(rel.values()) < 1e-4 and worst < 1e-3 and compared > 0
    rep.equal.append({"model": model, "values": values, "rel": rel, "grad_rel": worst, "grads_compared": compared,
                      "passed": passed, "masked": int(fake.masked.selected.sum()), "replaced": int(fake.replaced.sum())})
    log(f"equal work {model}: {'PASS' if passed else 'FAIL'} (loss rel {max(rel.values()):.2e}, grad rel {worst:.2e})")
    if not passed:
        raise BenchError(f"equal-work check failed for {model}: losses {values}, gradient rel diff {worst:.3g}")


def section_memory(s: Settings, rep: Report, model: str) -> None:
    """Peak memory of each configuration in a fresh process; gradient accumulation at the paper's batch size."""
    specs = [{"model": model, "impl": impl, "batch_size": s.batch_size, "accumulate": 1, "steps": 2}
             for impl in ("ours", "transformers")]
    if s.accumulate > 1 and model == s.models[-1]:
        # The paper's batch (128 for Small) as one batch and as `accumulate` micro-batches.
        big = s.batch_size * s.accumulate
        specs += [{"model": model, "impl": "ours", "batch_size": big, "accumulate": 1, "steps": 2},
                  {"model": model, "impl": "ours", "batch_size": s.batch_size, "accumulate": s.accumulate, "steps": 2}]
    for spec in specs:
        result = run_probe(s, spec)
        rep.memory.append({**spec, **result, "global_batch": spec["batch_size"] * spec["accumulate"]})
        log(f"memory {model} {spec['impl']} {spec['batch_size']}x{spec['accumulate']}: {result['peak_mib']:.0f} MiB")


def section_sync(s: Settings, rep: Report, model: str) -> None:
    cfg = compose_config(s, model)
    data = load_data(cfg, s.device, 1)
    ours = OursRunner(cfg, data, s.device, FastPath.from_runtime(cfg, s.device))
    ours.step([data.batches[0]])  # optimizer state exists before the recorded step
    finder = SyncFinder(s.device)
    with finder:
        ours.step([data.batches[0]])
    for (op, why, site, lib), n in sorted(finder.found.items(), key=lambda kv: kv[0][2:]):
        rep.syncs.append({"model": model, "op": op, "why": why, "site": site, "lib": lib, "count": n,
                          "cuda": on_cuda(site, lib) if s.device.type == "cpu" else "yes"})
    log(f"sync points {model}: {sum(finder.found.values())}")
