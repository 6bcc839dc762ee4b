"""The learning-rate schedule of the reference (`optimization.create_optimizer`): linear warmup, linear decay."""

from __future__ import annotations

from collections.abc import Callable


def linear_warmup_decay(warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """LR multiplier per step, the reference's exact shape (`optimization.create_optimizer`): a linear decay
    from 1 at step 0 to 0 at `total_steps`, multiplied by min(1, step / warmup_steps)."""

    def factor(step: int) -> float:
        warm = min(1.0, step / warmup_steps) if warmup_steps > 0 else 1.0
        return warm * max(0.0, 1.0 - step / max(1, total_steps))

    return factor
