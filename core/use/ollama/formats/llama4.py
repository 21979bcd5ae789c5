"""Llama 4: <|header_start|>role<|header_end|> ... <|eot|>; tool calls after a
<|python_start|>...<|python_end|> block of the answer's text, results in an ipython turn."""

from __future__ import annotations

from core.use.ollama.formats.base import ChatFormat
from core.use.ollama.gotemplate import go_call, text
from core.use.ollama.layout import Layout, turns


class Llama4(ChatFormat):
    def go_calls(self, lay: Layout) -> str:
        head = text(lay.answer_open + "<|python_start|>") + "{{ .Content }}"
        calls = "{{ range .ToolCalls }}" + go_call(self.call) + "{{ end }}"
        return head + text("<|python_end|>") + calls + text(lay.answer_close)

    def go_result(self) -> str:
        # The template writes a text result as JSON (a string is iterable: tojson).
        return "<|header_start|>ipython<|header_end|>\n\n{{ json .Content }}<|eot|>"


FORMAT = Llama4(
    name="llama4",
    display="Llama 4",
    markers=("<|header_start|>", "<|header_end|>", "<|eot|>"),
    role_marks=("<|header_start|>user", "<|header_start|>assistant"),
    stops=("<|eot|>", "<|header_start|>"),
    canonical=turns(
        "llama4",
        "<|header_start|>user<|header_end|>\n\n",
        "<|header_start|>assistant<|header_end|>\n\n",
        "<|eot|>",
        system_open="<|header_start|>system<|header_end|>\n\n",
        system_close="<|eot|>",
    ),
    call='{"name": "@NAME", "parameters": @ARGS}',
)
