"""A toy objective and a toy sharing mode, written the way docs/architecture.md tells a user to add their own:
one module (this file) and one config file per axis (tests/toy_conf/), nothing else in the package."""

from __future__ import annotations

import torch

from electra_ablate.models.encoder import ElectraForPretraining, Networks
from electra_ablate.models.flops import Heads
from electra_ablate.objectives.base import Batch, Objective, ObjectiveOutput, disc_sums, maskable, ratio, rtd_loss, select_positions
from electra_ablate.sharing.base import SharingMode


class ShuffledTokenDetection(Objective):
    """No generator: the selected tokens of each row are shuffled among themselves, and the discriminator
    tells, at every token, whether it moved."""

    option = "shuffled"  # this module holds two variants, so each names its option (tests/toy_conf/)
    display_name = "shuffled token detection"
    paper = "not in the paper (a test of extending the harness)"
    model_heads = {"disc_head": True}
    flops = Heads("disc", 1.0, generator=False)

    def forward(self, batch: Batch, nets: Networks) -> ObjectiveOutput:
        selected = select_positions(maskable(batch.input_ids, self.special), self.mask_prob)
        ids = batch.input_ids.clone()
        for row in range(ids.shape[0]):
            where = selected[row].nonzero().squeeze(1)
            ids[row, where] = ids[row, where[torch.randperm(where.numel(), device=ids.device)]]
        moved = ids != batch.input_ids
        hidden = nets.model(ids, batch.attention_mask, batch.token_type_ids)
        logits = nets.model.disc_logits(hidden)
        weights = batch.attention_mask.bool()
        loss = rtd_loss(logits, moved, weights)
        return ObjectiveOutput(loss, {"loss": ratio(loss, 1), "disc_loss": ratio(loss, 1),
                                      **disc_sums(logits, moved, weights)})


class PositionSharing(SharingMode):
    """Only the position embeddings are shared; the generator keeps its own token embeddings."""

    option = "positions"
    display_name = "shared position embeddings"
    paper = "not in the paper (a test of extending the harness)"

    def tie(self, generator: ElectraForPretraining, model: ElectraForPretraining) -> None:
        if generator.config.embedding_size != model.config.embedding_size:
            raise ValueError(f"sharing={self.name} needs equal embedding sizes")
        generator.electra.embeddings.position_embeddings = model.electra.embeddings.position_embeddings
