"""DeepSeek-R1 (its distills of Qwen and Llama): <｜User｜> ... <｜Assistant｜>, a <think> block
opening each answer; tool calls and outputs in their own fullwidth-bar markers."""

from __future__ import annotations

from core.use.ollama.formats.base import ChatFormat
from core.use.ollama.gotemplate import go_call, text
from core.use.ollama.layout import Layout

_EOS = "<｜end▁of▁sentence｜>"


class DeepSeek(ChatFormat):
    def go_calls(self, lay: Layout) -> str:
        # The template closes the calls only after a second or later call (and once per such
        # call): written as it does.
        end = text("<｜tool▁calls▁end｜>" + _EOS)
        return (
            text("<｜Assistant｜><｜tool▁calls▁begin｜>")
            + "{{ range $k, $_ := .ToolCalls }}"
            + "{{ if $k }}\n"
            + go_call(self.call)
            + end
            + "{{ else }}"
            + go_call(self.call)
            + "{{ end }}{{ end }}"
        )

    def go_result(self) -> str:
        return (
            '{{ if ne $prev "tool" }}<｜tool▁outputs▁begin｜>{{ else }}\n{{ end }}'
            "<｜tool▁output▁begin｜>{{ .Content }}<｜tool▁output▁end｜>"
        )


FORMAT = DeepSeek(
    name="deepseek",
    bare_answer_after_tool=True,  # an answer after tool results has no header of its own
    display="DeepSeek-R1",
    markers=("<｜User｜>", "<｜Assistant｜>"),
    role_marks=("<｜User｜>", "<｜Assistant｜>"),
    stops=(_EOS, "<｜User｜>"),
    canonical=Layout(
        "deepseek",
        system_open="",
        user_open="<｜User｜>",
        answer_open="<｜Assistant｜>",
        answer_close=_EOS,
        last_open="<｜Assistant｜>",
        gen="<｜Assistant｜><think>\n",
        think=("<think>\n", "\n</think>\n\n"),
    ),
    call="<｜tool▁call▁begin｜>function<｜tool▁sep｜>@NAME\n```json\n@ARGS\n```<｜tool▁call▁end｜>",
    run_end="<｜tool▁outputs▁end｜>",
    prompt_after_tool=False,  # R1 writes no generation prompt after tool results
    notes=(
        "DeepSeek-R1's template ties tool-call and tool-output openings to the first call of "
        "the whole conversation; the TEMPLATE opens them per message",
    ),
)
