"""Research probes: commands that answer a question about a regime or a checkpoint, not the harness's speed.

`pilot` trains a config exactly as pre-training does and writes its curve to a CSV, without the run store, so a
setting can be tried before a sweep spends its compute on it (its loop is the bench's, bench/loop.py); `curve`
trains an independent ELECTRA built from `transformers` beside ours on the same batches, so a curve that stalls can
be told apart: the regime or this implementation; `states` measures what pre-trained encoders' hidden states look
like per layer, so a collapsed checkpoint is told in seconds before fine-tuning is spent on it. Each runs as
`python -m electra_ablate.probes.<name>`; the lab notebook (docs/notebook/) holds what they found. They build on
the bench's reference and composition (bench/builds.py), never the other way round.
"""
