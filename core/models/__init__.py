"""The network: one GPT module configured per family (norm, positions, MLP, heads, biases),
LoRA adapters, parameter counting. May import `core.config` and `core.platform`; never training,
data or weights."""
