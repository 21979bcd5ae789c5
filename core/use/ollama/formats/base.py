"""What a chat format module gives: a ChatFormat, the data that tells its templates apart and
lays them out (markers, role marks, stops, its common form), and, as methods, what its Go
template writes that the shared writer does not (tool calls and results, or a layout of its
own: Mistral [INST], plain)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from core.use.ollama.gotemplate import go_call, text, turns_template
from core.use.ollama.layout import Layout, turns_prompt
from core.use.ollama.probe import dated, has_thinking, has_tools, probe_tools, probe_turns


@dataclass(frozen=True)
class ChatFormat:
    """A chat format laid out turn by turn: every turn opens with its role's mark."""

    name: str  # the registry's key, the Layout's kind
    display: str  # for people: "Llama 3"
    markers: tuple[str, ...]  # every one appears in a template of this format
    canonical: Layout  # its common form: go_template(name) writes it
    role_marks: tuple[str, str] = ("", "")  # where a user turn and an answer begin
    # Its end-of-turn mark, then the next turn's start (as Ollama's own templates' parameters
    # do), so a model that skips its end mark still stops.
    stops: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()  # a marker that rules it out (Llama 2's <<SYS>> for [INST])
    call: str = ""  # an earlier tool call as its templates write it (@NAME, @ARGS); "": none
    run_end: str = ""  # what ends a run of tool results
    prompt_after_tool: bool = True  # the generation prompt follows a last tool result
    bare_answer_after_tool: bool = False  # an answer after tool results opens no turn of its own
    notes: tuple[str, ...] = ()  # what every TEMPLATE of this format renders otherwise
    tools_unwritten: bool = False  # its templates show tools in a form not written (notes say)

    @property
    def writes_tool_calls(self) -> bool:
        return bool(self.call)

    def found_in(self, jinja_template: str) -> bool:
        """Whether a Jinja template is of this format, by its markers."""
        t = jinja_template
        return all(m in t for m in self.markers) and not any(m in t for m in self.excludes)

    # -- the three stages -----------------------------------------------------------------

    def probe(self, jinja, jinja_template: str, bos: str) -> Layout:
        """The layout read off a template of this format; jinja renders probe conversations."""
        lay = probe_turns(self, jinja, bos, has_thinking(jinja_template))
        if has_tools(jinja_template):
            lay = probe_tools(self, lay, jinja, jinja_template)
        return replace(lay, dated=dated(lay))

    def prompt(self, lay: Layout, messages: list[dict]) -> str:
        """What go_template(lay) renders for messages (its Python twin)."""
        return turns_prompt(lay, messages)

    def go_template(self, lay: Layout) -> str:
        return turns_template(self, lay)

    def renderer(self, lay: Layout) -> str:
        """Ollama's built-in renderer for this layout (the Modelfile's RENDERER, which Ollama
        then uses instead of the TEMPLATE); "": none, the TEMPLATE renders."""
        return ""

    def parser(self, lay: Layout) -> str:
        """Ollama's built-in output parser for this layout (the Modelfile's PARSER): it reads
        the model's reasoning and tool calls back out of what it writes; "": Ollama's generic
        one, which reads them by the TEMPLATE's tags and JSON."""
        return ""

    def takes_system(self, lay: Layout) -> bool:
        """Whether the layout has a place for a system prompt."""
        return lay.system_open is not None

    def joins_system(self, lay: Layout) -> bool:
        """Whether the system prompt is written inside a user message."""
        return lay.system_join is not None

    # -- tool calls and results, where the format writes them -------------------------------

    def go_answer_start(self, lay: Layout) -> str:
        """The start of an assistant message: its tool calls, else the last answer's branch."""
        start = "{{ if .ToolCalls }}"
        if self.bare_answer_after_tool:
            start = (
                '{{ if eq $prev "tool" }}{{ .Content }}'
                + text(lay.answer_close)
                + "{{ else if .ToolCalls }}"
            )
        return start + self.go_calls(lay) + "{{ else if $last }}"

    def go_head(self) -> str:
        """Variables its Go template declares before the messages (none)."""
        return ""

    def go_calls(self, lay: Layout) -> str:
        """An answer with tool calls: the calls in the answer's turn."""
        calls = "{{ range .ToolCalls }}" + go_call(self.call) + "{{ end }}"
        return text(lay.answer_open) + calls + text(lay.answer_close)

    def go_result(self) -> str:
        """A tool result (a message of role tool)."""
        raise NotImplementedError(f"{self.name} writes no tool results")
