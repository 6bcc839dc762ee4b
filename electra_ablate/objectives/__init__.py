"""Pre-training objectives, one small module each; the Hydra group `objective` selects one by `_target_`."""
