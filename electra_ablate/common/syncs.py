"""Counting the points where a step makes the host wait for the device (synchronisations).

A synchronisation is a read of a device value (`.item()`, `bool()`, `int()`, `float()`, `.tolist()`), an op
whose output shape depends on the data (boolean-mask indexing, `nonzero`, `masked_select`, `unique`,
`bincount`), or a host number copied to the device (`torch.tensor`/`torch.as_tensor` of host data: a plain
copy waits for itself). Two ways to see them:
- `cuda_syncs(fn)`: on a GPU, the synchronisations CUDA itself reports (`torch.cuda.set_sync_debug_mode`);
- `host_reads(on_read)`: on any device, including the CPU, every Python entry point above calls
  `on_read(what)` -- to count them, or to raise and show where the step reads.
"""

from __future__ import annotations

import collections
import contextlib
import warnings
from collections.abc import Callable, Iterator

import torch

_TENSOR_READS = ("item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero",
                 "masked_select", "unique", "unique_consecutive", "bincount", "argwhere", "masked_scatter")
_TORCH_READS = ("nonzero", "masked_select", "unique", "unique_consecutive", "bincount", "argwhere")


def _is_mask(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(torch.is_tensor(i) and i.dtype == torch.bool for i in items)


@contextlib.contextmanager
def host_reads(on_read: Callable[[str], None]) -> Iterator[None]:
    """Call `on_read(what)` at every synchronising Python entry point used inside the block (then go on)."""
    saved: list[tuple[object, str, object, bool]] = []

    def patch(owner, name, label, when=None):
        original = getattr(owner, name)
        saved.append((owner, name, original, name in vars(owner)))

        def wrapped(*args, **kwargs):
            if when is None or when(*args, **kwargs):
                on_read(label)
            return original(*args, **kwargs)

        setattr(owner, name, wrapped)

    try:
        for name in _TENSOR_READS:
            patch(torch.Tensor, name, f"Tensor.{name}")
        for name in _TORCH_READS:
            patch(torch, name, f"torch.{name}")
        patch(torch.Tensor, "__getitem__", "boolean-mask indexing", lambda self, index: _is_mask(index))
        patch(torch.Tensor, "__setitem__", "boolean-mask assignment", lambda self, index, value: _is_mask(index))
        patch(torch, "where", "torch.where(condition)", lambda *args, **kwargs: len(args) + len(kwargs) == 1)
        for name in ("tensor", "as_tensor"):
            patch(torch, name, f"torch.{name} of host data", lambda data, *a, **k: not torch.is_tensor(data))
        yield
    finally:
        for owner, name, original, own in reversed(saved):
            if own:
                setattr(owner, name, original)
            else:  # inherited (from the C base class): remove the wrapper rather than shadow the base
                delattr(owner, name)


def count_host_reads(fn: Callable[[], object]) -> collections.Counter:
    """Run `fn()` and count its synchronising entry points by kind."""
    counts: collections.Counter = collections.Counter()
    with host_reads(lambda what: counts.update([what])):
        fn()
    return counts


def cuda_syncs(fn: Callable[[], object]) -> int:
    """Run `fn()` on a CUDA device and count the synchronisations CUDA reports (sync debug mode, warn level)."""
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return sum("synchronizing" in str(w.message) for w in caught)
