"""Gradient clipping by global norm (reference `clip_by_global_norm`) that also works with a fused optimizer."""

from __future__ import annotations

import torch


class FusedClipping:
    """Mix into a LightningModule (before it) so gradient clipping works with a fused optimizer under bf16."""

    def clip_gradients(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        # Lightning's mixed-precision plugin refuses to clip for a fused optimizer (runtime.fused_adam), assuming
        # an fp16 gradient scaler that the fused step unscales; bf16-mixed (the GPU default) has no scaler, so
        # the gradients are true values and are clipped here by global norm (reference clip_by_global_norm).
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        if gradient_clip_val and getattr(optimizer, "_step_supports_amp_scaling", False) and scaler is None:
            if gradient_clip_algorithm not in (None, "norm"):
                raise ValueError(f"gradient_clip_algorithm={gradient_clip_algorithm!r}: only 'norm' clipping is supported")
            torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], gradient_clip_val)
            return
        super().clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
