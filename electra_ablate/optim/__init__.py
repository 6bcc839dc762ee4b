"""Optimisation shared by pre-training and fine-tuning (google-research/electra `model/optimization.py`):
Adam with the reference's update (`reference_adam`), weight-decay parameter groups (`groups`), the linear
warmup and decay schedule (`schedule`) and gradient clipping under a fused optimizer (`clipping`)."""
