"""The writing stage: Ollama's Go template for a layout. The pieces every format shares are
here (literal text, the template built line by line, the turn-by-turn writer); what differs
between formats (tool calls, results, a layout of their own) is the format class's
(core.use.ollama.formats)."""

from __future__ import annotations

from core.use.ollama.layout import DATE, TOOLS, Layout

RANGE = "{{ range $i, $_ := .Messages }}"
LAST = "{{- $last := eq (len (slice $.Messages $i)) 1 }}"
_FIRST_USER = '(or (eq $i 0) (and (eq $i 1) (eq $prev "system")))'  # Llama 3.1's tools go there
# $lastUser: the index of the last user message (Mistral's tool list goes before it).
LAST_USER = (
    '{{- $lastUser := -1 }}{{- range $k, $_ := .Messages }}{{ if eq .Role "user" }}'
    "{{ $lastUser = $k }}{{ end }}{{ end }}"
)


def text(s: str) -> str:
    """Literal template text: Go's text/template has no escape for its delimiter, so each "{"
    is written as an action printing it; a probed date becomes Ollama's currentDate."""
    return s.replace("{", '{{ "{" }}').replace(DATE, "{{ currentDate }}")


def tools_text(s: str, sep: str) -> str:
    """A piece with the tool list in it: each tool as Ollama's JSON, sep between them."""
    head, found, tail = s.partition(TOOLS)
    if not found:
        return text(s)
    listing = "{{ range $k, $_ := $.Tools }}{{ if $k }}" + text(sep) + "{{ end }}{{ . }}{{ end }}"
    return text(head) + listing + text(tail)


def go_call(call: str) -> str:
    """One tool call as the template writes it (@NAME and @ARGS in call), in Go."""
    return (
        text(call)
        .replace("@NAME", "{{ .Function.Name }}")
        .replace("@ARGS", "{{ .Function.Arguments }}")
    )


class Lines:
    """A Go template built line by line: every line after the first starts with "{{-", which
    trims the newline before it, and ends with "}}", so literal text never touches a trimmed
    newline and the template renders the same as if written on one line."""

    def __init__(self, first: str):
        self.lines = [first]

    def line(self, action: str) -> None:
        assert action.startswith("{{-"), action
        self.lines.append(action)

    def add(self, part: str) -> None:
        self.lines[-1] += part

    def extend(self, other: Lines) -> None:
        """Another template's lines, its first line joined to the current one."""
        first, *rest = other.lines
        self.add(first)
        for line in rest:
            self.line(line)

    def text(self) -> str:
        assert all(line.endswith("}}") for line in self.lines)
        return "\n".join(self.lines)


def _either(lay: Layout, tools: str | None, plain: str, when: str = "$.Tools") -> str:
    """A piece that differs with tools: both, chosen by when."""
    if tools is None or tools == plain:
        return text(plain)
    return (
        f"{{{{ if {when} }}}}"
        + tools_text(tools, lay.tool_sep)
        + "{{ else }}"
        + text(plain)
        + "{{ end }}"
    )


def turns_template(fmt, lay: Layout) -> str:
    """The Go template of a turn-by-turn layout of format fmt; with the template's
    enable_thinking=False form (think_off), that one for a request with think set to false
    (or, for a template that thinks only when asked, not set to true)."""
    if lay.think_off is None:
        return _turns(fmt, lay).text()
    off = "(not $.Think)" if lay.think_asked else "(and $.IsThinkSet (not $.Think))"
    t = Lines(f"{{{{- if {off} }}}}")
    t.extend(_turns(fmt, lay.think_off))
    t.line("{{- else }}")
    t.extend(_turns(fmt, lay))
    t.line("{{- end }}")
    return t.text()


def _system(t: Lines, lay: Layout) -> None:
    t.line('{{- if eq .Role "system" }}')
    if lay.tools_system_open is None:
        t.add(text(lay.system_open) + "{{ .Content }}" + text(lay.system_close))
    else:
        t.add("{{ if and $.Tools (eq $i 0) }}" + tools_text(lay.tools_system_open, lay.tool_sep))
        t.add("{{ .Content }}" + tools_text(lay.tools_system_close, lay.tool_sep))
        t.add("{{ else }}" + text(lay.system_open) + "{{ .Content }}")
        t.add(text(lay.system_close) + "{{ end }}")
    t.add("{{ end }}")


def _assistant(t: Lines, fmt, lay: Layout, calls: bool) -> None:
    t.line('{{- if eq .Role "assistant" }}')
    t.add(fmt.go_answer_start(lay) if calls else "{{ if $last }}")
    t.add(text(lay.last_open))
    if lay.think:
        when = "$last" if lay.think_always else ".Thinking"
        t.add(f"{{{{ if {when} }}}}" + text(lay.think[0]) + "{{ .Thinking }}")
        t.add(text(lay.think[1]) + "{{ end }}")
    t.add("{{ .Content }}{{ else }}" + text(lay.answer_open) + "{{ .Content }}")
    t.add(text(lay.answer_close) + "{{ end }}{{ end }}")


def _turns(fmt, lay: Layout) -> Lines:
    calls = lay.tool_calls is not None  # written in fmt's form
    head = '{{- $prev := "" }}' + fmt.go_head() if lay.tools else ""
    if lay.tools and lay.tools_default_turn is None:  # Ollama counts tools by .Tools
        head += "{{- if $.Tools }}{{ end }}"
    tools_user = "(eq $i $lastUser)" if lay.tools_at_last_user else _FIRST_USER
    if lay.tools_at_last_user:
        head += LAST_USER
    t = Lines(head + text(lay.lead) + RANGE)
    t.line(LAST)
    if calls and fmt.run_end:
        t.line('{{- if and (eq $prev "tool") (ne .Role "tool") }}' + text(fmt.run_end))
        t.add("{{ end }}")
    if lay.default_turn or lay.tools_default_turn:
        t.line('{{- if and (eq $i 0) (ne .Role "system") }}')
        t.add(_either(lay, lay.tools_default_turn, lay.default_turn) + "{{ end }}")
    if lay.system_open is not None and lay.system_join is None:
        _system(t, lay)
    user = '(or (eq .Role "user") (eq .Role "tool"))' if lay.tool_as_user else 'eq .Role "user"'
    t.line(f"{{{{- if {user} }}}}")
    t.add(_either(lay, lay.tools_user_open, lay.user_open, f"and $.Tools {tools_user}"))
    if lay.system_join is not None:
        t.add("{{ if and $.System (eq $i 1) }}{{ $.System }}" + text(lay.system_join) + "{{ end }}")
    t.add("{{ .Content }}" + text(lay.user_close) + "{{ end }}")
    _assistant(t, fmt, lay, calls)
    if calls:
        t.line('{{- if eq .Role "tool" }}' + fmt.go_result() + "{{ end }}")
    t.line("{{- if $last }}")
    if calls:
        t.add('{{ if eq .Role "tool" }}' + text(fmt.run_end) + "{{ end }}")
    after = '(ne .Role "assistant")'
    if calls and not fmt.prompt_after_tool:
        after = '(and (ne .Role "assistant") (ne .Role "tool"))'
    t.add(f"{{{{ if {after} }}}}" + text(lay.gen) + "{{ end }}{{ end }}")
    if lay.tools:
        t.line("{{- $prev = .Role }}")
    t.line("{{- end }}")
    return t
