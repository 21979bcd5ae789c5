"""Chat formats: one module each (chatml.py, llama3.py, mistral.py, ...), each a ChatFormat
(base.py) of data (markers, role marks, stops, its common form, its tool-call text) and, where
its Go template differs from the shared turn-by-turn writer, methods. This registry lists
them; a model's format is found by its template's markers. A family names its usual format
(Family.chat_format). Adding a chat format is one module here and its name in _ORDER."""

from __future__ import annotations

from core.use.ollama.formats import (
    chatml,
    deepseek,
    gemma,
    gemma4,
    granite,
    harmony,
    llama3,
    llama4,
    mistral,
    mistral_small,
    phi,
    plain,
    qwen3_5,
)
from core.use.ollama.formats.base import ChatFormat

__all__ = ["FORMATS", "ChatFormat", "get"]

# Listed in this order in messages; plain (no template) last.
_ORDER = (
    chatml,
    qwen3_5,
    llama3,
    llama4,
    mistral,
    mistral_small,
    gemma,
    gemma4,
    phi,
    granite,
    deepseek,
    harmony,
    plain,
)
FORMATS: dict[str, ChatFormat] = {m.FORMAT.name: m.FORMAT for m in _ORDER}


def get(name: str) -> ChatFormat:
    if name not in FORMATS:
        raise ValueError(f"ollama: unknown template kind {name!r}; one of {', '.join(FORMATS)}")
    return FORMATS[name]
