"""The layout stage: what a chat template's Go twin is built from (Layout), and the prompt
that Go template renders, in Python (expected_prompt), against which the probed layout is
checked. A format's own layout (Mistral [INST], plain) is its format class's."""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import UserError

# Probe texts: what the probe conversations hold, found again in the rendered prompts.
S, U1, A1, U2, A2 = "ProbeSystem7", "ProbeUser1", "ProbeAnswer1", "ProbeUser2", "ProbeAnswer2"
THINKING = "ProbeThinking7"
DATE = "ProbeDate7"  # what strftime_now gives while probing; currentDate in the TEMPLATE
TOOLS = "ProbeToolList7"  # where the tool list goes in a piece


class OllamaError(UserError):
    pass


@dataclass(frozen=True)
class Layout:
    """How a chat template lays out a conversation: the pieces its Go template is built from.

    lead: text before the first turn (a BOS that Ollama's tokenizer does not add itself).

    Formats laid out turn by turn (all but Mistral [INST] and plain):
    default_turn: the text before a first message that is not a system message (Qwen's "You are
        Qwen..." turn, Llama 3.1's date header, SmolLM3's metadata block), "" for none.
    system_open, system_close: around a system message's text; system_open None: the template
        takes no system message (Gemma 2).
    system_join: Gemma 3: the system prompt is written at the start of the first user message,
        followed by this text (None: the system message is a turn of its own).
    user_open, user_close, answer_open, answer_close: around a user message and an answer.
    last_open: before an answer that is the last message (continued); gen: the generation
        prompt after a last user message.
    think: (open, close) around .Thinking in a last answer; think_always: the template writes
        the block even without reasoning (Qwen3).
    think_off: the layout the template has with enable_thinking=False, where it differs.
    think_asked: the template thinks only when asked (enable_thinking=True; Gemma 4), so
        think_off is its default, the TEMPLATE's when a request's think is not true.
    tools: the template takes tools (the TEMPLATE names .Tools); tool_sep and the tools_*
        pieces: the same pieces with the tool list (_TOOLS) in them, None where the template
        writes no tools there; tool_calls: tool calls and results are written (in the form of
        the format named); tool_as_user: the template writes a tool result as a user message
        (SmolLM3); tools_at_last_user: tools_user_open opens the last user message, not the
        first (Mistral Small 3).
    dated: the template writes today's date (_DATE in the pieces; Ollama's currentDate).

    Mistral: answer_end: text after an answer (the EOS). inst_open, inst_close, answer_open,
    system_sep: text around a user message, before an answer, and between the system prompt
    and the user message it joins; system_at: "first" (v0.1/v0.2) or "last" (v0.3), None for
    a template that takes no system message.
    """

    kind: str
    lead: str = ""
    default_turn: str = ""
    system_open: str | None = None
    system_close: str = ""
    system_join: str | None = None
    user_open: str = ""
    user_close: str = ""
    answer_close: str = ""
    last_open: str = ""
    gen: str = ""
    think: tuple | None = None
    think_always: bool = False
    think_off: Layout | None = None
    think_asked: bool = False
    tools: bool = False
    tool_sep: str = ""
    tools_default_turn: str | None = None
    tools_system_open: str | None = None
    tools_system_close: str | None = None
    tools_user_open: str | None = None
    tool_calls: str | None = None
    tool_as_user: bool = False
    tools_at_last_user: bool = False
    dated: bool = False
    # Mistral
    answer_end: str = ""
    inst_open: str = "[INST] "
    inst_close: str = "[/INST]"
    answer_open: str = " "
    system_sep: str = "\n\n"
    system_at: str | None = "last"


def turns(kind: str, user: str, answer: str, close: str, **kw) -> Layout:
    """A format's common form laid out turn by turn: each turn opens with its role's mark and
    ends with close; the generation prompt is the answer's opening."""
    return Layout(
        kind,
        system_open=kw.pop("system_open", None),
        user_open=user,
        user_close=close,
        answer_open=answer,
        answer_close=close,
        last_open=answer,
        gen=answer,
        **kw,
    )


def turns_prompt(lay: Layout, messages: list[dict]) -> str:
    """What the Go template of a turn-by-turn layout renders for messages as Ollama passes them
    (after the Modelfile's SYSTEM is put first and same-role runs are merged), with no tools,
    no thinking and the date as DATE."""
    out = [lay.lead]
    n = len(messages)
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    for i, m in enumerate(messages):
        last, role = i == n - 1, m["role"]
        if i == 0 and role != "system":
            out.append(lay.default_turn)
        if role == "system" and lay.system_open is not None and lay.system_join is None:
            out += [lay.system_open, m["content"], lay.system_close]
        elif role == "user":
            out.append(lay.user_open)
            if lay.system_join is not None and i == 1 and system:
                out += [system, lay.system_join]
            out += [m["content"], lay.user_close]
        elif role == "assistant" and last:
            out.append(lay.last_open)
            if lay.think_always:
                out += list(lay.think)
            out.append(m["content"])
        elif role == "assistant":
            out += [lay.answer_open, m["content"], lay.answer_close]
        if last and role != "assistant":
            out.append(lay.gen)
    return "".join(out)
