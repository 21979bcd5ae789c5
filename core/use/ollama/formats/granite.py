"""Granite 4.0: <|start_of_role|>role<|end_of_role|> ... <|end_of_text|>; tools listed in the
system turn, calls in <tool_call> tags after the answer's text, results in <tool_response>
tags of a user turn."""

from __future__ import annotations

from core.use.ollama.formats.base import ChatFormat
from core.use.ollama.gotemplate import go_call, text
from core.use.ollama.layout import Layout, turns

_END = "<|end_of_text|>\n"


class Granite(ChatFormat):
    def go_calls(self, lay: Layout) -> str:
        # A newline before every call but a first one that follows no text.
        calls = "{{ range $k, $_ := .ToolCalls }}{{ if or $k $text }}\n{{ end }}"
        calls += go_call(self.call) + "{{ end }}"
        head = "{{ $text := .Content }}" + text(lay.answer_open) + "{{ .Content }}"
        return head + calls + text(lay.answer_close)

    def go_result(self) -> str:
        return (
            '{{ if ne $prev "tool" }}<|start_of_role|>user<|end_of_role|>{{ end }}'
            "\n<tool_response>\n{{ .Content }}\n</tool_response>"
        )


FORMAT = Granite(
    name="granite",
    display="Granite",
    markers=("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>"),
    role_marks=("<|start_of_role|>user", "<|start_of_role|>assistant"),
    stops=("<|end_of_text|>", "<|start_of_role|>"),
    canonical=turns(
        "granite",
        "<|start_of_role|>user<|end_of_role|>",
        "<|start_of_role|>assistant<|end_of_role|>",
        _END,
        system_open="<|start_of_role|>system<|end_of_role|>",
        system_close=_END,
    ),
    call='<tool_call>\n{"name": "@NAME", "arguments": @ARGS}\n</tool_call>',
    run_end=_END,
)
