"""Using a trained model: generation with a KV cache, and exports to transformers, PEFT,
safetensors and GGUF. May import `core.weights` and everything below it; not `core.training`."""
