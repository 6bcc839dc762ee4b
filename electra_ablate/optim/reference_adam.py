"""The reference's Adam update as a torch optimizer: `AdamWeightDecayOptimizer` of google-research/electra
`model/optimization.py`, which the reference's pre-training and fine-tuning both use. Here fine-tuning uses it
by default (finetune_optim.bias_correction=false) and pre-training with optim.bias_correction=false (its
default is torch's AdamW).

Per parameter p with gradient g (after clipping at global norm 1.0, done outside the optimizer as the
reference's `create_optimizer` does), with the group's lr (layer-wise and scheduled) and weight decay wd:

    m <- b1 m + (1 - b1) g
    v <- b2 v + (1 - b2) g^2
    p <- p - lr (m / (sqrt(v) + eps) + wd p)

There is no bias correction: m and v start at zero, so, eps aside, the update is Adam's times
(1 - b1^t) / sqrt(1 - b2^t), which for betas (0.9, 0.999) is 3.2 at t = 1, 6.5 at t = 10, 3.2 at t = 100,
1.26 at t = 1000 and 1.03 at t = 3000: the reference's early steps are several times larger, a large share
of fine-tuning on the small GLUE tasks (a few hundred steps). Weight decay is per group (the reference
excludes LayerNorm and bias by name; the callers build those groups).

How: torch's AdamW computes exactly this update when its corrections 1 - b1^t and 1 - b2^t are 1, which they
are (to the last bit, in float32 and float64) once its step count t is large. So every parameter's step count
starts at 2^60 instead of 0, and torch's own kernels (fused, foreach or for-loop; CPU or CUDA) do the rest.
`state["step"]` therefore does not count steps. `bias_correction=True` leaves it at 0: plain AdamW (Kingma &
Ba 2015, Algorithm 1, with decoupled weight decay). Param groups (layer-wise lrs), lr schedulers, gradient
clipping, state_dict and Lightning's precision plugins work as with AdamW.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

# b^(2^60) underflows to exactly 0 for every b < 1 representable in float64, so 1 - b^t == 1; adding 1 to it in
# float32 leaves it unchanged, and in float64 keeps it that large.
_NO_CORRECTION_STEP = 2.0**60


class ReferenceAdam(torch.optim.AdamW):
    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        bias_correction: bool = False,
        foreach: bool | None = None,
        fused: bool | None = None,
    ):
        super().__init__(params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                         foreach=foreach, fused=fused)
        self.defaults["bias_correction"] = bool(bias_correction)  # for groups added later
        for group in self.param_groups:
            group.setdefault("bias_correction", bool(bias_correction))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:  # first: the closure makes the gradients that decide which parameters step
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            # A group loaded from a state_dict written without the key takes the constructor's setting.
            if group.setdefault("bias_correction", self.defaults["bias_correction"]):
                continue
            for p in group["params"]:
                if p.grad is not None and not self.state[p]:
                    self._init_without_correction(p, group)
        super().step()
        return loss

    def _init_without_correction(self, p: torch.Tensor, group: dict) -> None:
        # As AdamW's lazy initialisation (torch/optim/adam.py `_init_group`: the step on the parameter's device
        # for fused or capturable kernels, else on the host), with the step count at _NO_CORRECTION_STEP.
        on_device = group["fused"] or group["capturable"]
        state = self.state[p]
        state["step"] = torch.full((), _NO_CORRECTION_STEP, dtype=torch.float32, device=p.device if on_device else "cpu")
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)  # m
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)  # v
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
