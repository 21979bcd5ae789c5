"""Mistral [INST] (Mistral 7B v0.1 to v0.3): [INST] user [/INST] answer</s>, the system prompt
joined to the first (v0.1, v0.2) or last (v0.3) user message; v0.3's tools before the last
user message. Not laid out turn by turn: its own probe, prompt and Go template."""

from __future__ import annotations

from dataclasses import replace

from core.data.chat import TemplateError
from core.use.ollama.formats.base import ChatFormat
from core.use.ollama.gotemplate import LAST, LAST_USER, RANGE, Lines, text
from core.use.ollama.layout import A1, U1, U2, Layout, S
from core.use.ollama.probe import cut, msg

# v0.3's tool list (before the last user message), calls and results.
_TOOLS = (
    '[AVAILABLE_TOOLS] [{{ range $k, $_ := $.Tools }}{{ if $k }}, {{ end }}{{ "{" }}"type": '
    '"function", "function": {{ "{" }}"name": "{{ .Function.Name }}", "description": '
    '"{{ .Function.Description }}", "parameters": {{ json .Function.Parameters }}}}'
    "{{ end }}][/AVAILABLE_TOOLS]"
)
CALLS = (
    "[TOOL_CALLS] [{{ range $k, $_ := .ToolCalls }}{{ if $k }}, {{ end }}"
    '{{ "{" }}"name": "{{ .Function.Name }}", "arguments": {{ .Function.Arguments }}, '
    '"id": "{{ .ID }}"}{{ end }}]'
)
RESULT = (
    '[TOOL_RESULTS] {{ "{" }}"content": {{ .Content }}, "call_id": "{{ .ToolCallID }}"}'
    "[/TOOL_RESULTS]"
)


class Inst(ChatFormat):
    def probe(self, jinja, jinja_template: str, bos: str) -> Layout:
        lay = _probe(jinja, bos)
        if "[AVAILABLE_TOOLS]" in jinja_template and "[TOOL_CALLS]" in jinja_template:
            lay = replace(lay, tools=True, tool_calls=self.name)  # v0.3
        return lay

    def prompt(self, lay: Layout, messages: list[dict]) -> str:
        out, n = [lay.lead], len(messages)
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        for i, m in enumerate(messages):
            last = i == n - 1
            if m["role"] == "user":
                out.append(lay.inst_open)
                where = {"first": i == 1, "last": last}.get(lay.system_at, False)
                if system and where:
                    out += [system, lay.system_sep]
                out += [m["content"], lay.inst_close]
            elif m["role"] == "assistant":
                out += [lay.answer_open, m["content"]]
                if not last:
                    out.append(lay.answer_end)
        return "".join(out)

    def go_template(self, lay: Layout) -> str:
        tools = lay.tool_calls is not None  # v0.3: [AVAILABLE_TOOLS], [TOOL_CALLS]
        first = LAST_USER if tools else ""  # the tool list goes before the last user message
        t = Lines(first + text(lay.lead) + RANGE)
        t.line(LAST)
        t.line('{{- if eq .Role "user" }}')
        if tools:
            t.add("{{ if and $.Tools (eq $i $lastUser) }}" + _TOOLS + "{{ end }}")
        t.add(text(lay.inst_open))
        if lay.system_at is not None:
            where = "(eq $i 1)" if lay.system_at == "first" else "$last"
            t.add(f"{{{{ if and $.System {where} }}}}{{{{ $.System }}}}")
            t.add(text(lay.system_sep) + "{{ end }}")
        t.add("{{ .Content }}" + text(lay.inst_close) + "{{ end }}")
        t.line('{{- if eq .Role "assistant" }}')
        if tools:
            t.add("{{ if .ToolCalls }}" + CALLS + text(lay.answer_end) + "{{ else }}")
        t.add(text(lay.answer_open) + "{{ .Content }}")
        t.add("{{ if not $last }}" + text(lay.answer_end) + "{{ end }}{{ end }}")
        if tools:
            t.add("{{ end }}")
            t.line('{{- if eq .Role "tool" }}' + RESULT + "{{ end }}")
        t.line("{{- end }}")
        return t.text()

    def takes_system(self, lay: Layout) -> bool:
        return lay.system_at is not None

    def joins_system(self, lay: Layout) -> bool:
        return True


def _probe(jinja, bos: str) -> Layout:
    one = jinja([msg("user", U1)])
    lead = bos if bos and one.startswith(bos) else ""
    inst_open, _ = cut(one, lead, U1)
    inst_close = one[one.index(U1) + len(U1) :]
    three = jinja([msg("user", U1), msg("assistant", A1), msg("user", U2)])
    answer_open, _ = cut(three, U1 + inst_close, A1)
    answer_end, _ = cut(three, A1, inst_open + U2)
    lay = Layout(
        "mistral",
        lead,
        answer_end=answer_end,
        inst_open=inst_open,
        inst_close=inst_close,
        answer_open=answer_open,
    )
    try:
        system = jinja([msg("system", S), msg("user", U1), msg("assistant", A1), msg("user", U2)])
    except TemplateError:  # v0.1's first template: no system message at all
        return replace(lay, system_sep="", system_at=None)
    if system.startswith(lead + inst_open + S):
        return replace(lay, system_at="first", system_sep=cut(system, S, U1)[0])
    return replace(lay, system_at="last", system_sep=cut(system, S, U2)[0])


# Mistral-7B-Instruct v0.3.
FORMAT = Inst(
    name="mistral",
    display="Mistral [INST]",
    markers=("[INST]", "[/INST]"),
    excludes=("<<SYS>>", "[SYSTEM_PROMPT]"),  # Llama 2; Mistral Small 3's own format
    stops=("</s>", "[INST]"),
    canonical=Layout("mistral", answer_end="</s>"),
)
