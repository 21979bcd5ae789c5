"""Phi (Phi-3, Phi-3.5, Phi-4-mini): <|user|> ... <|end|> <|assistant|>."""

from __future__ import annotations

from core.use.ollama.formats.base import ChatFormat
from core.use.ollama.layout import turns

FORMAT = ChatFormat(
    name="phi",
    display="Phi",
    markers=("<|assistant|>", "<|end|>"),  # Phi-4-mini writes '<|' + role + '|>'
    role_marks=("<|user|>", "<|assistant|>"),
    stops=("<|end|>", "<|user|>"),
    canonical=turns(
        "phi",
        "<|user|>\n",
        "<|assistant|>\n",
        "<|end|>\n",
        system_open="<|system|>\n",
        system_close="<|end|>\n",
    ),
)
