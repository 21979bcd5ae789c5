"""Llama 3 (3.0 to 3.3): <|start_header_id|>role<|end_header_id|> ... <|eot_id|>; tool calls
as JSON in an answer, results in an ipython turn."""

from __future__ import annotations

from core.use.ollama.formats.base import ChatFormat
from core.use.ollama.layout import turns


class Llama3(ChatFormat):
    def go_result(self) -> str:
        # Llama 3.1's template writes a text result as JSON (tojson).
        return "<|start_header_id|>ipython<|end_header_id|>\n\n{{ json .Content }}<|eot_id|>"


# Llama 3.0, with BOS added by Ollama's tokenizer.
FORMAT = Llama3(
    name="llama3",
    display="Llama 3",
    markers=("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    role_marks=("<|start_header_id|>user", "<|start_header_id|>assistant"),
    stops=("<|eot_id|>", "<|start_header_id|>"),
    canonical=turns(
        "llama3",
        "<|start_header_id|>user<|end_header_id|>\n\n",
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|eot_id|>",
        system_open="<|start_header_id|>system<|end_header_id|>\n\n",
        system_close="<|eot_id|>",
    ),
    call='{"name": "@NAME", "parameters": @ARGS}',
)
