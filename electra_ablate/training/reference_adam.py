"""The reference's Adam update as a torch optimizer: `AdamWeightDecayOptimizer` of google-research/electra
`model/optimization.py`, which pre-training and fine-tuning both use.

Per parameter p with gradient g (after clipping at global norm 1.0, done outside the optimizer as the
reference's `create_optimizer` does), with the group's lr (layer-wise and scheduled) and weight decay wd:

    m <- b1 m + (1 - b1) g
    v <- b2 v + (1 - b2) g^2
    p <- p - lr (m / (sqrt(v) + eps) + wd p)

There is no bias correction: m and v start at zero, so, eps aside, the update is Adam's times
(1 - b1^t) / sqrt(1 - b2^t), which for betas (0.9, 0.999) is 3.2 at t = 1, 6.5 at t = 10, 3.2 at t = 100,
1.26 at t = 1000 and 1.03 at t = 3000: the reference's early steps are several times larger, a large share
of fine-tuning on the small GLUE tasks (a few hundred steps). `bias_correction=True` divides m by (1 - b1^t) and v by (1 - b2^t) before
the update, which is exactly torch.optim.AdamW (Kingma & Ba, 2015, Algorithm 1, with decoupled weight decay).
Weight decay is per group (the reference excludes LayerNorm and bias by name; the callers build those groups).

It is an ordinary `torch.optim.Optimizer`: param groups (layer-wise learning rates), lr schedulers,
gradient clipping, state_dict and Lightning's precision plugins work as with AdamW. There is no fused kernel;
`foreach=True` updates all tensors of a device and dtype with torch's multi-tensor ops (one launch per op
instead of one per parameter on GPUs), `foreach=False` loops over parameters.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import torch


class ReferenceAdam(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        bias_correction: bool = False,
        foreach: bool | None = None,
    ):
        if not lr >= 0:
            raise ValueError(f"ReferenceAdam: lr={lr!r} must be >= 0")
        if not eps > 0:
            raise ValueError(f"ReferenceAdam: eps={eps!r} must be > 0")
        if not (len(betas) == 2 and all(0 <= b < 1 for b in betas)):
            raise ValueError(f"ReferenceAdam: betas={betas!r} must be two numbers in [0, 1)")
        if not weight_decay >= 0:
            raise ValueError(f"ReferenceAdam: weight_decay={weight_decay!r} must be >= 0")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        bias_correction=bool(bias_correction), foreach=foreach)
        super().__init__(params, defaults)

    def _state_of(self, p: torch.Tensor) -> dict:
        state = self.state[p]
        if not state:
            # The step count stays on the host (as torch's non-capturable Adam keeps it): the bias corrections
            # are host scalars, so a step never waits on the device.
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)  # m
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)  # v
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if any(p.grad.is_sparse for p in params):
                raise RuntimeError("ReferenceAdam does not support sparse gradients")
            states = [self._state_of(p) for p in params]
            foreach = group["foreach"]
            if foreach is None:
                foreach = any(p.is_cuda for p in params)
            # Parameters of one group may sit on several devices or dtypes; each bucket is updated together.
            buckets: dict[tuple, list[int]] = defaultdict(list)
            for i, p in enumerate(params):
                buckets[(p.device, p.dtype, float(states[i]["step"]))].append(i)
            for (_, _, step), idx in buckets.items():
                update = _update_foreach if foreach else _update_loop
                update(
                    [params[i] for i in idx],
                    [params[i].grad for i in idx],
                    [states[i]["exp_avg"] for i in idx],
                    [states[i]["exp_avg_sq"] for i in idx],
                    step=int(step) + 1,
                    lr=float(group["lr"]),
                    betas=group["betas"],
                    eps=float(group["eps"]),
                    weight_decay=float(group["weight_decay"]),
                    bias_correction=bool(group["bias_correction"]),
                )
                for i in idx:
                    states[i]["step"] += 1
        return loss


def _scales(step: int, lr: float, betas: tuple[float, float], bias_correction: bool) -> tuple[float, float]:
    """(step size on m, divisor of sqrt(v)): (lr, 1) for the reference; Adam's corrections otherwise."""
    if not bias_correction:
        return lr, 1.0
    b1, b2 = betas
    return lr / (1 - b1**step), (1 - b2**step) ** 0.5


def _update_loop(params, grads, exp_avgs, exp_avg_sqs, *, step, lr, betas, eps, weight_decay, bias_correction):
    b1, b2 = betas
    step_size, v_scale = _scales(step, lr, betas, bias_correction)
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        m.lerp_(g, 1 - b1)  # b1 m + (1 - b1) g
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        if weight_decay:
            p.mul_(1 - lr * weight_decay)  # the decay term uses the parameter before this step's update
        denom = (v.sqrt() / v_scale).add_(eps)
        p.addcdiv_(m, denom, value=-step_size)


def _update_foreach(params, grads, exp_avgs, exp_avg_sqs, *, step, lr, betas, eps, weight_decay, bias_correction):
    b1, b2 = betas
    step_size, v_scale = _scales(step, lr, betas, bias_correction)
    torch._foreach_lerp_(exp_avgs, grads, 1 - b1)
    torch._foreach_mul_(exp_avg_sqs, b2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - b2)
    if weight_decay:
        torch._foreach_mul_(params, 1 - lr * weight_decay)
    denom = torch._foreach_sqrt(exp_avg_sqs)
    if v_scale != 1.0:
        torch._foreach_div_(denom, v_scale)
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_(params, exp_avgs, denom, value=-step_size)
