"""Using a trained model: generation with a KV cache, evaluation with lm-evaluation-harness's
definitions (and lm_eval itself, optional, behind its LM interface), the before/after report,
and exports to transformers, PEFT, safetensors and GGUF. May import `core.weights` and
everything below it; not `core.training`."""
