"""Qwen3.5: ChatML turns (<|im_start|>role ... <|im_end|>) with a <think> block that opens
every generation prompt (<think>\\n\\n</think>\\n\\n with thinking off), and tool calls as XML
(<tool_call><function=NAME><parameter=KEY>value</parameter></function></tool_call>), results in
<tool_response> tags of a user turn as ChatML's. A template of this form without thinking
(Qwen3-Coder's calls) gets Ollama's qwen3-coder parser instead of its qwen3.5 one."""

from __future__ import annotations

from dataclasses import replace

from core.use.ollama.formats.chatml import FORMAT as CHATML
from core.use.ollama.formats.chatml import ChatML
from core.use.ollama.gotemplate import LAST_USER, text
from core.use.ollama.layout import Layout

_END = "<|im_end|>\n"
_PARAMS = (
    "{{ range $key, $value := .Function.Arguments }}<parameter={{ $key }}>\n{{ $value }}"
    "\n</parameter>\n{{ end }}"
)


class Qwen35(ChatML):
    def go_head(self) -> str:
        return LAST_USER  # an answer after the last user message keeps its <think> block

    def go_calls(self, lay: Layout) -> str:
        head = text("<|im_start|>assistant\n")
        if lay.think:  # the template writes the block (empty or not) after the last query
            head += "{{ if gt $i $lastUser }}" + text(lay.think[0]) + "{{ .Thinking }}"
            head += text(lay.think[1]) + "{{ end }}"
        head += "{{ if .Content }}{{ .Content }}\n\n{{ end }}"
        calls = "{{ range $k, $_ := .ToolCalls }}{{ if $k }}\n{{ end }}"
        calls += "<tool_call>\n<function={{ .Function.Name }}>\n" + _PARAMS
        calls += "</function>\n</tool_call>{{ end }}"
        return head + calls + text(_END)

    def parser(self, lay: Layout) -> str:
        return "qwen3.5" if lay.think else "qwen3-coder"


FORMAT = Qwen35(
    **{
        **CHATML.__dict__,
        "name": "qwen3_5",
        "display": "Qwen3.5",
        "markers": ("<|im_start|>", "<|im_end|>", "<function="),
        "excludes": (),
        "canonical": replace(CHATML.canonical, kind="qwen3_5"),
        "call": "<tool_call>\n<function=@NAME>\n@ARGS</function>\n</tool_call>",
        "notes": (
            "a tool call's arguments are written one <parameter=...> each in key order, "
            "values as Go prints them (true, 21); the model's template keeps the call's own "
            "order and writes Python's True and tojson for lists and objects",
        ),
    }
)
