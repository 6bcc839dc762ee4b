"""Fine-tuning a pre-trained encoder on GLUE (paper section 3.1 and Table 7; the reference's run_finetuning.py):
the run (`run`), its checks (`checks`), what it fine-tunes (`source`), the tasks it runs and their identities
(`tasks`), the Lightning system (`system`) and its batches (`data`). GLUE itself (tasks, readers, features,
metrics, the submission) is glue/."""
