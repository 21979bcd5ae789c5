"""Mistral 7B (v0.1-v0.3): Llama's layers, with a sliding window over the whole model."""

from __future__ import annotations

import dataclasses

from core.models.model import GPTConfig
from core.weights.families.base import Family, llama_options, llama_table


def config(hf: dict, source: str) -> GPTConfig:
    c = llama_options(hf, source)
    window = hf.get("sliding_window")
    if window:  # within the window, full attention is the same
        c = dataclasses.replace(c, seq_len=min(c.seq_len, window))
    return c


FAMILY = Family(
    name="mistral",
    display="Mistral",
    hf_arch="MistralForCausalLM",
    config=config,
    table=llama_table,
    gguf_arch="llama",
    chat_format="mistral",
    stops=("</s>",),
    gguf_permute=True,
)
