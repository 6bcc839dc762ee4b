"""How far a running job has got, for the console of the sweep that launched it (sweep/progress.py).

A Lightning callback that appends `{job, step, total, seconds_per_step}` to the sweep's progress file
(common/console.py `heartbeat`) at most every half of the console's interval: its global step (after a resume, the
step it resumed from plus what it has run since), the steps the trainer will run in all, and the seconds per step
over this process's recent steps: the median over its last intervals between reports, so that one slow interval (the
process paused with SIGSTOP or Ctrl-Z, a checkpoint written, an evaluation) does not stretch the time left. The first
step of the process is left out (start-up, compilation, the data loader's first batch), and so is the time before a
resume. Outside a sweep it does nothing; it reads no tensor and draws no random number, so a run's results are the
same with it or without it.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable

import pytorch_lightning as pl

from electra_ablate.common import console

# The seconds per step is the median over the last RATE_WINDOW intervals between heartbeats (5 minutes at the default
# interval): recent enough to follow a lasting change of load on a shared machine within half of that, and blind to
# a single interval that a pause or a checkpoint stretched.
RATE_WINDOW = 10


class Heartbeat(pl.Callback):
    """Reports the job's step, its total and its recent seconds per step, every `every_s` seconds (default: half of
    the console's interval, ELECTRA_ABLATE_PROGRESS_EVERY_S); the first report comes after the process's first step,
    without a rate."""

    def __init__(self, every_s: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.every_s, self.clock = every_s, clock
        self.samples: deque[tuple[float, int]] = deque(maxlen=RATE_WINDOW + 1)  # (clock, global step)
        self._due = 0.0
        self._total: int | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not trainer.is_global_zero or not console.reporting():
            return
        now = self.clock()
        if self.samples and now < self._due:
            return
        if self.every_s is None:
            self.every_s = console.progress_every() / 2
        step = int(trainer.global_step)
        self.samples.append((now, step))
        points = list(self.samples)
        rates = [(t1 - t0) / (s1 - s0) for (t0, s0), (t1, s1) in zip(points, points[1:]) if s1 > s0]
        rate = statistics.median(rates) if rates else None
        console.heartbeat(step, self.total(trainer), rate)
        self._due = now + self.every_s

    def total(self, trainer) -> int:
        """The optimizer steps the trainer runs in all: trainer.max_steps, or its epochs' steps (fine-tuning)."""
        if self._total is None:
            estimated = trainer.estimated_stepping_batches
            self._total = int(estimated) if estimated != float("inf") else 0
        return self._total
