"""Pretrained weights: one table per family (weight names both ways), reading HF folders, hub
ids, runs and checkpoints through the one loader, fingerprints. May import `core.models`,
`core.data` (tokenizers), `core.runs` (checkpoint format), `core.config` and `core.platform`."""
