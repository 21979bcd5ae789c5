"""Gemma (2 and 3): <start_of_turn>user ... <end_of_turn>, the answer's turn named model;
Gemma 3 writes the system prompt at the start of the first user message, Gemma 2 takes none."""

from __future__ import annotations

from core.use.ollama.formats.base import ChatFormat
from core.use.ollama.layout import turns

FORMAT = ChatFormat(
    name="gemma",
    display="Gemma",
    markers=("<start_of_turn>", "<end_of_turn>"),
    role_marks=("<start_of_turn>user", "<start_of_turn>model"),
    stops=("<end_of_turn>", "<start_of_turn>"),
    canonical=turns(
        "gemma",
        "<start_of_turn>user\n",
        "<start_of_turn>model\n",
        "<end_of_turn>\n",
        system_join="\n\n",
        system_open="",
    ),
)
