"""Mistral Small 3 (3.1, 3.2): [SYSTEM_PROMPT] ... [/SYSTEM_PROMPT] first (a default one, dated,
where the conversation has none), then [INST] user [/INST] answer</s> with no spaces; laid out
turn by turn, the [/INST] opening each answer. Its tool list goes before the last user
message, calls and results as Mistral v0.3's."""

from __future__ import annotations

from dataclasses import replace

from core.use.ollama.formats.base import ChatFormat
from core.use.ollama.formats.mistral import CALLS, RESULT
from core.use.ollama.gotemplate import text
from core.use.ollama.layout import TOOLS, Layout

_LIST = "[AVAILABLE_TOOLS] [" + TOOLS + "][/AVAILABLE_TOOLS]"


class MistralSmall(ChatFormat):
    def probe(self, jinja, jinja_template: str, bos: str) -> Layout:
        lay = super().probe(jinja, jinja_template, bos)
        if lay.tools_default_turn is None or _LIST not in lay.tools_default_turn:
            return lay
        # The shared probe finds the list before the first user message: it goes before the
        # last one.
        return replace(
            lay,
            tools_default_turn=lay.tools_default_turn.replace(_LIST, ""),
            tools_system_close=(lay.tools_system_close or "").replace(_LIST, "") or None,
            tools_user_open=_LIST + lay.user_open,
            tools_at_last_user=True,
        )

    def go_calls(self, lay: Layout) -> str:
        return text(lay.answer_open) + CALLS + text(lay.answer_close)

    def go_result(self) -> str:
        return RESULT


FORMAT = MistralSmall(
    name="mistral_small",
    bare_answer_after_tool=True,  # an answer after tool results has no [/INST] of its own
    display="Mistral Small 3",
    markers=("[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[INST]", "[/INST]"),
    role_marks=("[INST]", "[/INST]"),
    stops=("</s>", "[INST]"),
    canonical=Layout(
        "mistral_small",
        system_open="[SYSTEM_PROMPT]",
        system_close="[/SYSTEM_PROMPT]",
        user_open="[INST]",
        answer_open="[/INST]",
        answer_close="</s>",
        last_open="[/INST]",
        gen="[/INST]",
    ),
    call='{"name": "@NAME", "arguments": @ARGS, "id": "@ID"}',  # in a [TOOL_CALLS] list
    prompt_after_tool=False,  # a last tool result is followed by nothing
)
