"""Qwen2 / Qwen2.5 (and DeepSeek-R1-Distill-Qwen): Llama's layers with q/k/v biases."""

from __future__ import annotations

import dataclasses

from core.models.model import GPTConfig
from core.weights.families.base import Family, llama_options, llama_table


def config(hf: dict, source: str) -> GPTConfig:
    c = llama_options(hf, source, qkv_bias=True, out_bias=False)
    window = hf.get("sliding_window")
    if window and hf.get("use_sliding_window"):  # within the window, full attention is the same
        c = dataclasses.replace(c, seq_len=min(c.seq_len, window))
    return c


FAMILY = Family(
    name="qwen2",
    display="Qwen2",
    hf_arch="Qwen2ForCausalLM",
    config=config,
    table=llama_table,
    gguf_arch="qwen2",
    chat_format="chatml",
    stops=("<|im_end|>",),
)
