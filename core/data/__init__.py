"""Training data: sources (files, folders, the embedded corpus), tokenizers (bytes, BPE, a
pretrained model's), chat templates and answer masks, packing, and the token cache read in
windows. May import `core.config`, `core.runs` and `core.platform`."""
