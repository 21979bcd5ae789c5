"""gpt-oss's harmony format: <|start|>role<|message|> ... <|end|>, answers on a channel
(<|start|>assistant<|channel|>final<|message|>), a system block that opens every conversation
(identity, knowledge cutoff, today's date, reasoning effort, the valid channels) and the system
message as a developer turn ("# Instructions"). Generation ends at <|return|> or <|call|>,
never at <|end|>, which closes the analysis channel in the middle of an answer."""

from __future__ import annotations

from dataclasses import replace

from core.use.ollama.formats.base import ChatFormat
from core.use.ollama.gotemplate import go_call, text
from core.use.ollama.layout import DATE, Layout, turns

_END = "<|end|>"
_ANALYSIS = "<|start|>assistant<|channel|>analysis<|message|>"
# The template keeps an answer's text (or reasoning) beside its tool call on the analysis
# channel only while no later answer without tool calls follows.
_FINAL_LATER = (
    "{{ $final := false }}{{ range slice $.Messages $i }}"
    '{{ if and (eq .Role "assistant") (not .ToolCalls) }}{{ $final = true }}{{ end }}{{ end }}'
)


class Harmony(ChatFormat):
    def probe(self, jinja, jinja_template: str, bos: str) -> Layout:
        """The generic probe, with the system block moved into the lead: the template writes
        it before a system message too, which then is only the developer turn."""
        lay = super().probe(jinja, jinja_template, bos)
        block = lay.default_turn
        if not (lay.system_open or "").startswith(block):
            raise ValueError("the system block does not open a conversation with a system message")
        return replace(
            lay, lead=lay.lead + block, default_turn="", system_open=lay.system_open[len(block) :]
        )

    def go_head(self) -> str:
        return '{{- $call := "" }}'  # the last tool call's name: its result's turn names it

    def go_calls(self, lay: Layout) -> str:
        """The first tool call of an answer (the template writes one), after the answer's
        text or reasoning on the analysis channel."""
        analysis = "{{ if not $final }}{{ if .Content }}" + text(_ANALYSIS) + "{{ .Content }}"
        analysis += text(_END) + "{{ else if .Thinking }}" + text(_ANALYSIS) + "{{ .Thinking }}"
        analysis += text(_END) + "{{ end }}{{ end }}"
        call = "{{ range $k, $_ := .ToolCalls }}{{ if not $k }}" + go_call(self.call)
        return _FINAL_LATER + analysis + call + "{{ $call = .Function.Name }}{{ end }}{{ end }}"

    def go_result(self) -> str:
        # The result as a JSON string (tojson), in a turn of the tool's own name.
        return (
            "<|start|>functions.{{ $call }} to=assistant<|channel|>commentary<|message|>"
            "{{ json .Content }}<|end|>"
        )


FORMAT = Harmony(
    name="harmony",
    display="gpt-oss harmony",
    markers=("<|start|>", "<|channel|>", "<|message|>"),
    role_marks=("<|start|>user", "<|start|>assistant"),
    stops=("<|return|>", "<|call|>"),
    canonical=replace(
        turns(
            "harmony",
            "<|start|>user<|message|>",
            "<|start|>assistant<|channel|>final<|message|>",
            _END,
            system_open="<|start|>developer<|message|># Instructions\n\n",
            system_close="\n\n" + _END,
        ),
        gen="<|start|>assistant",
        lead="<|start|>system<|message|>You are ChatGPT, a large language model trained by "
        f"OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: {DATE}\n\nReasoning: medium\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every "
        "message." + _END,
        dated=True,
    ),
    call="<|start|>assistant to=functions.@NAME<|channel|>commentary json<|message|>@ARGS<|call|>",
    tools_unwritten=True,
    notes=(
        "the system block always says 'Reasoning: medium' (the template's default "
        "reasoning_effort); a request's think level does not change it",
        "tool definitions are not written (nor the system block's line on the 'functions' "
        "channel); the model's template writes them as a TypeScript namespace in the "
        "developer turn; tool calls and results are written as it writes them",
        "a continued answer's reasoning (.Thinking) is not written; the model's template "
        "writes it on the analysis channel before the final one",
        "a system message after the first is written as another developer turn; the model's "
        "template uses only a first one",
    ),
)
