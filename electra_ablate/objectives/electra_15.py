"""ELECTRA 15% (paper section 3.3): the discriminator loss covers only the selected (masked) positions.

Isolates how much of ELECTRA's gain comes from learning from all tokens rather than 15% of them.
"""

from __future__ import annotations

import torch

from electra_ablate.objectives.base import Batch, Fake
from electra_ablate.objectives.electra import Electra


class Electra15(Electra):
    display_name = "ELECTRA 15%"
    paper = "section 3.3, Table 5 (GLUE 82.4)"
    # flops as Electra: the loss covers 15% of positions but the head still runs on every token

    def disc_weights(self, batch: Batch, fake: Fake) -> torch.Tensor:
        return fake.masked.selected
