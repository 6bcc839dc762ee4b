"""No sharing: independent generator and discriminator (paper section 3.2: GLUE 83.6)."""

from __future__ import annotations

from electra_ablate.models.encoder import ElectraForPretraining
from electra_ablate.sharing.base import SharingMode


class NoSharing(SharingMode):
    display_name = "no sharing"
    paper = "section 3.2 (GLUE 83.6)"
    shares_weights = False

    def tie(self, generator: ElectraForPretraining, model: ElectraForPretraining) -> None:
        pass
