"""ChatML: <|im_start|>role ... <|im_end|> (Qwen2, Qwen3, SmolLM2, SmolLM3, TrainDeck's own
chat models); tool calls in <tool_call> tags, results in <tool_response> tags of a user turn."""

from __future__ import annotations

from core.use.ollama.formats.base import ChatFormat
from core.use.ollama.gotemplate import go_call, text
from core.use.ollama.layout import Layout, turns

_END = "<|im_end|>\n"


class ChatML(ChatFormat):
    def go_calls(self, lay: Layout) -> str:
        head = text("<|im_start|>assistant") + "{{ if .Content }}\n{{ .Content }}{{ end }}"
        return head + "{{ range .ToolCalls }}" + go_call(self.call) + "{{ end }}" + text(_END)

    def go_result(self) -> str:
        return (
            '{{ if ne $prev "tool" }}<|im_start|>user{{ end }}\n<tool_response>\n'
            "{{ .Content }}\n</tool_response>"
        )


# As Qwen2.5 without its default system, and Ollama's chatml.
FORMAT = ChatML(
    name="chatml",
    display="ChatML",
    markers=("<|im_start|>", "<|im_end|>"),
    role_marks=("<|im_start|>user", "<|im_start|>assistant"),
    stops=("<|im_end|>", "<|im_start|>"),
    excludes=("<function=",),  # Qwen3.5's XML tool calls
    canonical=turns(
        "chatml",
        "<|im_start|>user\n",
        "<|im_start|>assistant\n",
        _END,
        system_open="<|im_start|>system\n",
        system_close=_END,
    ),
    call='\n<tool_call>\n{"name": "@NAME", "arguments": @ARGS}\n</tool_call>',
    run_end=_END,
)
