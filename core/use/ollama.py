"""Ollama: a Modelfile for an exported GGUF, so Ollama prompts the model as it was trained.

Ollama takes a GGUF's chat template only when it is nearly identical to one it knows; any other
model runs with the bare `{{ .Prompt }}` and no stop strings, so it never stops and prints the
next turn's markers. The Modelfile written here carries a TEMPLATE in Ollama's Go template
syntax that renders a conversation exactly as the model's Jinja chat template does
(add_generation_prompt=True; an assistant message last is continued, as transformers'
continue_final_message does), one PARAMETER stop per end-of-turn mark, and an optional SYSTEM.

Templates are told apart by their markers (template_kind): ChatML (Qwen, SmolLM2, SmolLM3),
Llama 3, Mistral [INST], Gemma, Phi, DeepSeek-R1 or none ("plain", a base model). Within a
kind, the pieces that vary between models (the text around each turn, a default system prompt,
Llama 3.1's date header, TrainDeck's EOS after each answer, Mistral's spacing and where it puts
the system prompt, the <think> block, the tools block) are read off the Jinja template by
rendering probe conversations, and the Go template built from them is checked against the
Jinja renders of several conversations: a template that does not fit is refused with a one-line
error rather than exported with a prompt format the model never saw.

Recent Ollama compares capabilities (server/images.go shouldPreferChatTemplate): where the GGUF's
own template has tools or thinking and the TEMPLATE has fewer, it renders with the GGUF's
template instead. So where the model's template takes tools or <think> blocks the TEMPLATE has
them too: .Tools, tool calls and tool results (.ToolCalls, role "tool") where the model's
template writes them, and .Thinking inside range .Messages between <think> tags, plus the
template's enable_thinking=False form for a request with think off.

What a Go template cannot do is listed by differences(): message text is written as given,
where Llama 3, Gemma and SmolLM3 strip whitespace from it; a date a template computes is
Ollama's currentDate, always YYYY-MM-DD; Ollama merges consecutive messages of one role and puts
the Modelfile's SYSTEM first when a conversation has no system message; tool JSON is Ollama's
compact JSON.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

from core.data.chat import TemplateError, render, special_tokens
from core.errors import UserError

KINDS = ("chatml", "llama3", "mistral", "gemma", "phi", "deepseek", "plain")
KIND_NAMES = {
    "chatml": "ChatML",
    "llama3": "Llama 3",
    "mistral": "Mistral [INST]",
    "gemma": "Gemma",
    "phi": "Phi",
    "deepseek": "DeepSeek-R1",
    "plain": "none",
}


class OllamaError(UserError):
    pass


# The markers that tell a kind (all of them must appear in the Jinja text).
_MARKERS = {
    "chatml": ("<|im_start|>", "<|im_end|>"),
    "llama3": ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    "mistral": ("[INST]", "[/INST]"),
    "gemma": ("<start_of_turn>", "<end_of_turn>"),
    "phi": ("<|assistant|>", "<|end|>"),  # Phi-4-mini writes '<|' + role + '|>'
    "deepseek": ("<｜User｜>", "<｜Assistant｜>"),
}
# Where a user turn and an answer begin, for the kinds laid out turn by turn.
_ROLE_MARKS = {
    "chatml": ("<|im_start|>user", "<|im_start|>assistant"),
    "llama3": ("<|start_header_id|>user", "<|start_header_id|>assistant"),
    "gemma": ("<start_of_turn>user", "<start_of_turn>model"),
    "phi": ("<|user|>", "<|assistant|>"),
    "deepseek": ("<｜User｜>", "<｜Assistant｜>"),
}
# Stop strings of a kind: its end-of-turn mark, then the next turn's start (as Ollama's own
# templates' parameters do), so a model that skips its end mark still stops.
_STOPS = {
    "chatml": ("<|im_end|>", "<|im_start|>"),
    "llama3": ("<|eot_id|>", "<|start_header_id|>"),
    "mistral": ("</s>", "[INST]"),
    "gemma": ("<end_of_turn>", "<start_of_turn>"),
    "phi": ("<|end|>", "<|user|>"),
    "deepseek": ("<｜end▁of▁sentence｜>", "<｜User｜>"),
    "plain": (),
}
_SPECIAL = re.compile(
    r"<\|[^|<>\s]{1,40}\|>|<<SYS>>|<[a-z_]{2,30}>|\[/?[A-Z_]{3,30}\]|<｜[^｜<>\s]{1,30}｜>"
)
_TURN_KINDS = tuple(_ROLE_MARKS)


@dataclass(frozen=True)
class Layout:
    """How a chat template lays out a conversation: the pieces its Go template is built from.

    lead: text before the first turn (a BOS that Ollama's tokenizer does not add itself).

    Turn kinds (chatml, llama3, gemma, phi, deepseek):
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
    tools: the template takes tools (the TEMPLATE names .Tools); tool_sep and the tools_*
        pieces: the same pieces with the tool list (_TOOLS) in them, None where the template
        writes no tools there; tool_calls: tool calls and results are written ("chatml",
        "llama3", "deepseek", "mistral": whose form); tool_as_user: the template writes a tool
        result as a user message (SmolLM3).
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
    tools: bool = False
    tool_sep: str = ""
    tools_default_turn: str | None = None
    tools_system_open: str | None = None
    tools_system_close: str | None = None
    tools_user_open: str | None = None
    tool_calls: str | None = None
    tool_as_user: bool = False
    dated: bool = False
    # Mistral
    answer_end: str = ""
    inst_open: str = "[INST] "
    inst_close: str = "[/INST]"
    answer_open: str = " "
    system_sep: str = "\n\n"
    system_at: str | None = "last"


# Each kind's common form, for go_template(kind): ChatML as Qwen2.5 without its default system
# and Ollama's chatml; Llama 3.0 with BOS added by Ollama's tokenizer; Mistral-7B-Instruct v0.3.
def _turns(kind: str, user: str, answer: str, close: str, **kw) -> Layout:
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


CANONICAL = {
    "chatml": _turns(
        "chatml",
        "<|im_start|>user\n",
        "<|im_start|>assistant\n",
        "<|im_end|>\n",
        system_open="<|im_start|>system\n",
        system_close="<|im_end|>\n",
    ),
    "llama3": _turns(
        "llama3",
        "<|start_header_id|>user<|end_header_id|>\n\n",
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|eot_id|>",
        system_open="<|start_header_id|>system<|end_header_id|>\n\n",
        system_close="<|eot_id|>",
    ),
    "mistral": Layout("mistral", answer_end="</s>"),
    "gemma": _turns(
        "gemma",
        "<start_of_turn>user\n",
        "<start_of_turn>model\n",
        "<end_of_turn>\n",
        system_join="\n\n",
        system_open="",
    ),
    "phi": _turns(
        "phi",
        "<|user|>\n",
        "<|assistant|>\n",
        "<|end|>\n",
        system_open="<|system|>\n",
        system_close="<|end|>\n",
    ),
    "deepseek": Layout(
        "deepseek",
        system_open="",
        user_open="<｜User｜>",
        answer_open="<｜Assistant｜>",
        answer_close="<｜end▁of▁sentence｜>",
        last_open="<｜Assistant｜>",
        gen="<｜Assistant｜><think>\n",
        think=("<think>\n", "\n</think>\n\n"),
    ),
    "plain": Layout("plain"),
}


def _markers(text: str) -> str:
    found = list(dict.fromkeys(_SPECIAL.findall(text)))[:5]
    return ", ".join(found) if found else "no turn markers"


def template_kind(jinja_template: str | None) -> str:
    """The template's kind: one of KINDS ("plain": no template, a base model fed the raw
    prompt). A template of another kind raises OllamaError naming the markers it uses: a
    Modelfile without the model's prompt format is the bug this module exists to avoid."""
    if not jinja_template or not jinja_template.strip():
        return "plain"
    kinds = [k for k, marks in _MARKERS.items() if all(m in jinja_template for m in marks)]
    if "<<SYS>>" in jinja_template:  # Llama 2: [INST] with its own system block
        kinds = [k for k in kinds if k != "mistral"]
    if len(kinds) == 1:
        return kinds[0]
    names = ", ".join(KIND_NAMES[k] for k in KINDS if k != "plain")
    raise OllamaError(
        f"ollama: the model's chat template is none TrainDeck can write for Ollama ({names}); "
        f"it uses {_markers(jinja_template)}. Export GGUF and write the Modelfile's TEMPLATE "
        "by hand"
    )


def has_thinking(jinja_template: str) -> bool:
    """Whether Ollama counts the model's own template as thinking (chatTemplateHasThinkingSupport
    in server/images.go)."""
    t = jinja_template
    if "<think>" in t and "</think>" in t:
        return True
    split = "content.split('</think>')" in t or 'content.split("</think>")' in t
    return split and "reasoning_content" not in t and "<SPECIAL_12>" not in t


def has_tools(jinja_template: str) -> bool:
    """Whether Ollama counts the model's own template as taking tools
    (chatTemplateHasToolSupport)."""
    return "tools" in jinja_template or "tool_call" in jinja_template


# -- Reading a layout off a Jinja template ------------------------------------------------

_S, _U1, _A1, _U2, _A2 = "ProbeSystem7", "ProbeUser1", "ProbeAnswer1", "ProbeUser2", "ProbeAnswer2"
_T = "ProbeThinking7"
_DATE = "ProbeDate7"  # what strftime_now gives while probing; currentDate in the TEMPLATE
_TOOLS = "ProbeToolList7"  # where the tool list goes in a piece
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"probe_tool_{n}",
            "description": "Probe.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    for n in (1, 2)
]


def _msg(role: str, content: str) -> dict:
    return {"role": role, "content": content}


# Conversations a layout must render exactly as the Jinja template: generation prompts after a
# user turn, and a last assistant message continued.
_CHECKS = [
    [_msg("user", _U1)],
    [_msg("system", _S), _msg("user", _U1)],
    [_msg("user", _U1), _msg("assistant", _A1), _msg("user", _U2)],
    [_msg("system", _S), _msg("user", _U1), _msg("assistant", _A1), _msg("user", _U2)],
    [_msg("user", _U1), _msg("assistant", _A1)],
    [
        _msg("system", _S),
        _msg("user", _U1),
        _msg("assistant", _A1),
        _msg("user", _U2),
        _msg("assistant", _A2),
    ],
]


def jinja_prompt(jinja_template: str, messages: list[dict], **tokens) -> str:
    """The prompt the Jinja template gives a model asked to answer: the generation prompt after
    a user turn; with an assistant message last, the text up to the end of it (continued, as
    transformers' continue_final_message cuts it)."""
    last = messages[-1]
    if last["role"] != "assistant":
        return render(jinja_template, messages, True, **tokens)
    text = render(jinja_template, messages, False, **tokens)
    at = text.rfind(last["content"])
    if at < 0:
        raise OllamaError("ollama: the chat template drops the last assistant message")
    return text[: at + len(last["content"])]


def _cut(text: str, start: str, end: str, after: int = 0) -> tuple[str, int]:
    """The text between start (found from after) and the next end, and where end begins."""
    i = text.index(start, after) + len(start)
    j = text.index(end, i)
    return text[i:j], j


def _turn_pieces(kind: str, one: str, lead: str) -> tuple[str, str]:
    """(text before the user turn after lead, the user turn's opening) of a one-message render."""
    umark = _ROLE_MARKS[kind][0]
    u = one.rindex(umark, 0, one.index(_U1))
    return one[len(lead) : u], one[u : one.index(_U1)]


def _system_pieces(kind: str, text: str, lead: str) -> tuple:
    """(system_open, system_close, system_join) of a [system, user] render."""
    umark = _ROLE_MARKS[kind][0]
    s, u1 = text.index(_S), text.index(_U1)
    u = text.rindex(umark, 0, u1)
    if s > u:  # written inside the first user message (Gemma 3)
        return "", "", text[s + len(_S) : u1]
    seg = text[len(lead) : u]
    return seg[: seg.index(_S)], seg[seg.index(_S) + len(_S) :], None


def _probe_turns(kind: str, jinja, bos: str, takes_thinking: bool) -> Layout:
    umark, amark = _ROLE_MARKS[kind]
    one = jinja([_msg("user", _U1)])
    lead = bos if bos and one.startswith(bos) else ""
    default_turn, user_open = _turn_pieces(kind, one, lead)
    three = jinja([_msg("user", _U1), _msg("assistant", _A1), _msg("user", _U2)])
    after_u1 = three[three.index(_U1) + len(_U1) :]
    user_close = after_u1[: after_u1.index(amark)]
    answer_open = after_u1[len(user_close) : after_u1.index(_A1)]
    after_a1 = after_u1[after_u1.index(_A1) + len(_A1) :]
    answer_close = after_a1[: after_a1.rindex(umark, 0, after_a1.index(_U2))]
    rest = one[one.index(_U1) + len(_U1) :]
    if not rest.startswith(user_close):
        raise ValueError("the generation prompt does not follow the user turn's end")
    gen = rest[len(user_close) :]
    prefill = jinja([_msg("user", _U1), _msg("assistant", _A1)])
    last_open = prefill[prefill.index(_U1) + len(_U1) + len(user_close) : prefill.index(_A1)]
    think, always = None, False
    if takes_thinking:
        think = ("<think>\n", "\n</think>\n\n")
        reasoned = jinja(
            [_msg("user", _U1), {"role": "assistant", "content": _A1, "reasoning_content": _T}]
        )
        seg = reasoned[reasoned.index(_U1) + len(_U1) + len(user_close) : reasoned.index(_A1)]
        if _T in seg and "<think>" in seg[: seg.index(_T)]:  # the template writes reasoning
            t0 = seg.index("<think>")
            think = (seg[t0 : seg.index(_T)], seg[seg.index(_T) + len(_T) :])
            always = last_open == seg[:t0] + think[0] + think[1]
            last_open = seg[:t0]
    try:
        system = jinja([_msg("system", _S), _msg("user", _U1)])
    except TemplateError:  # Gemma 2: no system message at all
        system = ""
    if _S in system:
        system_open, system_close, join = _system_pieces(kind, system, lead)
    else:  # refused, or dropped (Phi-3-mini's first template)
        system_open, system_close, join = None, "", None
    return Layout(
        kind,
        lead,
        default_turn,
        system_open,
        system_close,
        join,
        user_open,
        user_close,
        answer_close,
        last_open,
        gen,
        think,
        always,
        answer_open=answer_open,
    )


def _tool_json(tool: dict, text: str) -> str | None:
    """How the template wrote a tool (tojson, or tojson(indent=4) as Llama 3.1), if at all."""
    for indent in (None, 4):
        j = json.dumps(tool, ensure_ascii=False, indent=indent)
        if j in text:
            return j
    return None


def _probe_tools(kind: str, lay: Layout, jinja, jinja_template: str) -> Layout:
    """The pieces that change when the request has tools (the tool list replaced by _TOOLS)."""
    tools = {"tools": _PROBE_TOOLS}
    round_trip = "tool_calls" in jinja_template  # the template writes earlier tool calls
    calls = kind if round_trip and kind in ("chatml", "llama3", "deepseek") else None
    one = jinja([_msg("user", _U1)], **tools)
    j1, j2 = (_tool_json(t, one) for t in _PROBE_TOOLS)
    as_user = calls is None and _tool_as_user(jinja)
    if not (j1 and j2):  # the template does not show the tools (DeepSeek-R1, SmolLM3)
        return replace(lay, tools=True, tool_calls=calls, tool_as_user=as_user)
    a, b = one.index(j1), one.index(j2)
    sep = one[a + len(j1) : b]

    def listed(text: str) -> str:
        i, k = text.find(j1), text.find(j2)
        return text if i < 0 else text[:i] + _TOOLS + text[k + len(j2) :]

    one = listed(one)
    default_turn, user_open = _turn_pieces(kind, one, lay.lead)
    t_open = t_close = None
    if lay.system_open is not None and lay.system_join is None:
        t_open, t_close, _ = _system_pieces(
            kind, listed(jinja([_msg("system", _S), _msg("user", _U1)], **tools)), lay.lead
        )
    return replace(
        lay,
        tools=True,
        tool_sep=sep,
        tools_default_turn=default_turn,
        tools_user_open=user_open,
        tools_system_open=t_open,
        tools_system_close=t_close,
        tool_calls=calls,
        tool_as_user=as_user,
    )


def _tool_as_user(jinja) -> bool:
    """Whether the template writes a tool result exactly as a user message."""
    start = [_msg("user", _U1), _msg("assistant", _A1)]
    try:
        as_tool = jinja([*start, _msg("tool", _U2)])
    except TemplateError:
        return False
    return as_tool == jinja([*start, _msg("user", _U2)])


def _probe_mistral(jinja, bos: str) -> Layout:
    one = jinja([_msg("user", _U1)])
    lead = bos if bos and one.startswith(bos) else ""
    inst_open, _ = _cut(one, lead, _U1)
    inst_close = one[one.index(_U1) + len(_U1) :]
    three = jinja([_msg("user", _U1), _msg("assistant", _A1), _msg("user", _U2)])
    answer_open, _ = _cut(three, _U1 + inst_close, _A1)
    answer_end, _ = _cut(three, _A1, inst_open + _U2)
    try:
        system = jinja(
            [_msg("system", _S), _msg("user", _U1), _msg("assistant", _A1), _msg("user", _U2)]
        )
    except TemplateError:  # v0.1's first template: no system message at all
        return Layout(
            "mistral",
            lead,
            answer_end=answer_end,
            inst_open=inst_open,
            inst_close=inst_close,
            answer_open=answer_open,
            system_sep="",
            system_at=None,
        )
    if system.startswith(lead + inst_open + _S):
        at, (sep, _) = "first", _cut(system, _S, _U1)
    else:
        at, (sep, _) = "last", _cut(system, _S, _U2)
    return Layout(
        "mistral",
        lead,
        answer_end=answer_end,
        inst_open=inst_open,
        inst_close=inst_close,
        answer_open=answer_open,
        system_sep=sep,
        system_at=at,
    )


def _probe(kind: str, jinja_template: str, tokens: dict) -> Layout:
    def jinja(messages, **extra):
        return jinja_prompt(
            jinja_template, messages, **tokens, **extra, strftime_now=lambda fmt: _DATE
        )

    if kind == "mistral":
        lay = _probe_mistral(jinja, tokens.get("bos_token", ""))
        if "[AVAILABLE_TOOLS]" in jinja_template and "[TOOL_CALLS]" in jinja_template:
            lay = replace(lay, tools=True, tool_calls="mistral")  # v0.3
        return lay
    lay = _probe_turns(kind, jinja, tokens.get("bos_token", ""), has_thinking(jinja_template))
    if has_tools(jinja_template):
        lay = _probe_tools(kind, lay, jinja, jinja_template)
    dated = any(_DATE in (p or "") for p in _pieces(lay))
    return replace(lay, dated=dated)


def _pieces(lay: Layout) -> list:
    return [
        lay.lead,
        lay.default_turn,
        lay.system_open,
        lay.system_close,
        lay.tools_default_turn,
        lay.tools_system_open,
        lay.tools_system_close,
        lay.tools_user_open,
    ]


def layout(
    jinja_template: str | None, *, bos_token: str = "", eos_token: str = "", add_bos: bool = False
) -> Layout:
    """The layout of a model's template. bos_token/eos_token: the texts the template gets (as
    core.data.chat.special_tokens gives them); add_bos: whether the tokenizer puts BOS first
    itself (the GGUF's add_bos_token), in which case the template's own leading BOS is left
    out, as Ollama's tokenizer adds it."""
    kind = template_kind(jinja_template)
    if kind == "plain":
        return CANONICAL["plain"]
    tokens = {"bos_token": bos_token, "eos_token": eos_token}
    found = _checked(kind, jinja_template, tokens, add_bos)
    if kind in _TURN_KINDS and _thinking_switch(jinja_template, tokens):
        off = _checked(kind, jinja_template, {**tokens, "enable_thinking": False}, add_bos)
        found = replace(found, think_off=replace(off, think_off=None))
    return found


def _thinking_switch(jinja_template: str, tokens: dict) -> bool:
    """Whether enable_thinking=False changes what the template renders (Qwen3, SmolLM3)."""
    try:
        return any(
            jinja_prompt(jinja_template, m, **tokens, strftime_now=lambda f: _DATE)
            != jinja_prompt(
                jinja_template, m, **tokens, enable_thinking=False, strftime_now=lambda f: _DATE
            )
            for m in _CHECKS
        )
    except TemplateError:
        return False


def _checked(kind: str, jinja_template: str, tokens: dict, add_bos: bool) -> Layout:
    name = KIND_NAMES[kind]
    try:
        found = _probe(kind, jinja_template, tokens)
    except (ValueError, TemplateError) as e:
        detail = f" ({e})" if isinstance(e, TemplateError) else ""
        raise OllamaError(
            f"ollama: the chat template uses {name} markers but not in the {name} layout"
            f"{detail}; export GGUF and write the Modelfile's TEMPLATE by hand"
        ) from None
    bos = tokens.get("bos_token", "")
    added = ""
    if add_bos and bos and found.lead.startswith(bos):
        added, found = bos, replace(found, lead=found.lead[len(bos) :])
    for messages in _CHECKS:
        takes_system = found.system_at if kind == "mistral" else found.system_open
        if takes_system is None and any(m["role"] == "system" for m in messages):
            continue
        try:
            want = jinja_prompt(jinja_template, messages, **tokens, strftime_now=lambda f: _DATE)
        except TemplateError as e:
            raise OllamaError(
                f"ollama: the chat template fails on a plain conversation: {e}"
            ) from None
        got = added + expected_prompt(found, messages)
        if got != want:
            roles = ", ".join(m["role"] for m in messages)
            raise OllamaError(
                f"ollama: the chat template looks like {name} but renders [{roles}] as "
                f"{_short(want)}, not {_short(got)} as an Ollama template would; export GGUF "
                "and write the Modelfile's TEMPLATE by hand"
            )
    return found


def _short(text: str, n: int = 120) -> str:
    return repr(text if len(text) <= n else text[: n - 3] + "...")


def expected_prompt(lay: Layout, messages: list[dict]) -> str:
    """What go_template(lay) renders for messages as Ollama passes them (after the Modelfile's
    SYSTEM is put first and same-role runs are merged), with no tools, no thinking and the
    date as _DATE: the Python twin of the Go template."""
    if lay.kind == "plain":  # Ollama runs {{ .Prompt }}{{ .Response }} turn by turn
        return "".join(m["content"] for m in messages if m["role"] in ("user", "assistant"))
    out = [lay.lead]
    n = len(messages)
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    if lay.kind == "mistral":
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


def differences(lay: Layout, jinja_template: str = "") -> list[str]:
    """What the TEMPLATE renders differently from the model's Jinja template, one line each
    (the export log and docs/use-and-export.md list them)."""
    notes = _template_notes(jinja_template) + [
        "Ollama merges consecutive messages of one role (joined by a blank line) and puts the "
        "Modelfile's SYSTEM first when a conversation has none"
    ]
    if not takes_system(lay):
        notes.append(
            "a system message in a request is left out; the model's template refuses one "
            "(Gemma 2) or drops it"
        )
    if lay.dated:
        notes.append(
            "today's date is Ollama's currentDate (YYYY-MM-DD); the model's template "
            "writes it as strftime_now does (e.g. '26 Jul 2024' or '26 July 2024')"
        )
    if lay.system_join is not None or lay.kind == "mistral":
        notes.append(
            "the system prompt joins the user message the template puts it in only "
            "when the conversation opens with it"
        )
    if lay.tools:
        notes.append(
            "tool definitions and call arguments are Ollama's compact JSON; the "
            "model's template writes Python's spaced JSON (tojson)"
        )
        if lay.tools_default_turn is None:
            notes.append(
                "the model's template shows no tool definitions when given tools; "
                "neither does the TEMPLATE (it names .Tools so Ollama keeps it)"
            )
        if lay.tool_calls is None:
            notes.append(
                "tool calls in earlier answers are not written (the model's template "
                "does not write them either)"
            )
    if lay.kind == "deepseek":
        notes.append(
            "DeepSeek-R1's template ties tool-call and tool-output openings to the "
            "first call of the whole conversation; the TEMPLATE opens them per message"
        )
    if lay.think:
        notes.append(
            "reasoning (.Thinking) is written only in a last, continued answer; "
            "earlier answers lose it, as the model's template drops it"
        )
    return notes


def _template_notes(jinja_template: str) -> list[str]:
    """Differences that come from text operations of a particular template."""
    notes = []
    if re.search(r"\|\s*trim|\.strip\(|\.lstrip\(|\.rstrip\(", jinja_template):
        notes.append(
            "message text is written as given; the model's template strips whitespace from "
            "it (| trim, .strip())"
        )
    if "/no_think" in jinja_template:  # SmolLM3
        notes.append(
            "a /think or /no_think flag in the system prompt is not read (set think in the "
            "request instead) and stays in the text; trailing whitespace of the system prompt "
            "and leading newlines of answers are kept"
        )
    if "message['role'] == 'system' and message['content']" in jinja_template:  # Phi-3.5
        notes.append("an empty system message is written as an empty turn")
    if "ns.system_prompt" in jinja_template:  # DeepSeek-R1: the last system message only
        notes.append(
            "several system messages are joined by a blank line; the model's template keeps "
            "only the last"
        )
    return notes


# -- The Go template ----------------------------------------------------------------------


def _text(s: str) -> str:
    """Literal template text: Go's text/template has no escape for its delimiter, so each "{"
    is written as an action printing it; a probed date becomes Ollama's currentDate."""
    return s.replace("{", '{{ "{" }}').replace(_DATE, "{{ currentDate }}")


def _tools_text(s: str, sep: str) -> str:
    """A piece with the tool list in it: each tool as Ollama's JSON, sep between them."""
    head, found, tail = s.partition(_TOOLS)
    if not found:
        return _text(s)
    listing = "{{ range $k, $_ := $.Tools }}{{ if $k }}" + _text(sep) + "{{ end }}{{ . }}{{ end }}"
    return _text(head) + listing + _text(tail)


class _Lines:
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

    def extend(self, other: _Lines) -> None:
        """Another template's lines, its first line joined to the current one."""
        first, *rest = other.lines
        self.add(first)
        for line in rest:
            self.line(line)

    def text(self) -> str:
        assert all(line.endswith("}}") for line in self.lines)
        return "\n".join(self.lines)


_RANGE = "{{ range $i, $_ := .Messages }}"
_LAST = "{{- $last := eq (len (slice $.Messages $i)) 1 }}"
_FIRST_USER = '(or (eq $i 0) (and (eq $i 1) (eq $prev "system")))'  # Llama 3.1's tools go there


def go_template(kind: str | Layout) -> str:
    """The Ollama TEMPLATE for a kind (its common form, CANONICAL) or for a model's layout.
    It uses .Messages, so Ollama passes the whole conversation (system messages included) and
    the template ends with the assistant's header, or inside a last assistant message."""
    lay = kind if isinstance(kind, Layout) else CANONICAL.get(kind)
    if lay is None:
        raise ValueError(f"ollama: unknown template kind {kind!r}; one of {', '.join(KINDS)}")
    if lay.kind == "plain":
        return "{{ .Prompt }}"
    if lay.kind == "mistral":
        return _go_mistral(lay)
    if lay.think_off is None:
        return _go_turns(lay).text()
    # The template's enable_thinking=False form, for a request with think set to false.
    t = _Lines("{{- if and $.IsThinkSet (not $.Think) }}")
    t.extend(_go_turns(lay.think_off))
    t.line("{{- else }}")
    t.extend(_go_turns(lay))
    t.line("{{- end }}")
    return t.text()


# Mistral v0.3's tool list (before the last user message), calls and results.
_MISTRAL_TOOLS = (
    '[AVAILABLE_TOOLS] [{{ range $k, $_ := $.Tools }}{{ if $k }}, {{ end }}{{ "{" }}"type": '
    '"function", "function": {{ "{" }}"name": "{{ .Function.Name }}", "description": '
    '"{{ .Function.Description }}", "parameters": {{ json .Function.Parameters }}}}'
    "{{ end }}][/AVAILABLE_TOOLS]"
)
_MISTRAL_CALLS = (
    "[TOOL_CALLS] [{{ range $k, $_ := .ToolCalls }}{{ if $k }}, {{ end }}"
    '{{ "{" }}"name": "{{ .Function.Name }}", "arguments": {{ .Function.Arguments }}, '
    '"id": "{{ .ID }}"}{{ end }}]'
)
_MISTRAL_RESULT = (
    '[TOOL_RESULTS] {{ "{" }}"content": {{ .Content }}, "call_id": "{{ .ToolCallID }}"}'
    "[/TOOL_RESULTS]"
)


def _go_mistral(lay: Layout) -> str:
    tools = lay.tool_calls is not None  # v0.3: [AVAILABLE_TOOLS], [TOOL_CALLS]
    first = "{{- $lastUser := -1 }}" if tools else ""
    if tools:  # the tool list goes before the last user message
        first += '{{- range $k, $_ := .Messages }}{{ if eq .Role "user" }}'
        first += "{{ $lastUser = $k }}{{ end }}{{ end }}"
    t = _Lines(first + _text(lay.lead) + _RANGE)
    t.line(_LAST)
    t.line('{{- if eq .Role "user" }}')
    if tools:
        t.add("{{ if and $.Tools (eq $i $lastUser) }}" + _MISTRAL_TOOLS + "{{ end }}")
    t.add(_text(lay.inst_open))
    if lay.system_at is not None:
        where = "(eq $i 1)" if lay.system_at == "first" else "$last"
        t.add(f"{{{{ if and $.System {where} }}}}{{{{ $.System }}}}")
        t.add(_text(lay.system_sep) + "{{ end }}")
    t.add("{{ .Content }}" + _text(lay.inst_close) + "{{ end }}")
    t.line('{{- if eq .Role "assistant" }}')
    if tools:
        t.add("{{ if .ToolCalls }}" + _MISTRAL_CALLS + _text(lay.answer_end) + "{{ else }}")
    t.add(_text(lay.answer_open) + "{{ .Content }}")
    t.add("{{ if not $last }}" + _text(lay.answer_end) + "{{ end }}{{ end }}")
    if tools:
        t.add("{{ end }}")
        t.line('{{- if eq .Role "tool" }}' + _MISTRAL_RESULT + "{{ end }}")
    t.line("{{- end }}")
    return t.text()


def _either(lay: Layout, tools: str | None, plain: str, when: str = "$.Tools") -> str:
    """A piece that differs with tools: both, chosen by when."""
    if tools is None or tools == plain:
        return _text(plain)
    return (
        f"{{{{ if {when} }}}}"
        + _tools_text(tools, lay.tool_sep)
        + "{{ else }}"
        + _text(plain)
        + "{{ end }}"
    )


# Tool calls in an answer, tool results, and what ends a run of tool results, per form.
_CALL = {
    "chatml": '\n<tool_call>\n{"name": "@NAME", "arguments": @ARGS}\n</tool_call>',
    "llama3": '{"name": "@NAME", "parameters": @ARGS}',
    "deepseek": (
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>@NAME\n```json\n@ARGS\n```<｜tool▁call▁end｜>"
    ),
}
_RUN_END = {"chatml": "<|im_end|>\n", "llama3": "", "deepseek": "<｜tool▁outputs▁end｜>"}


def _go_call(form: str) -> str:
    return (
        _text(_CALL[form])
        .replace("@NAME", "{{ .Function.Name }}")
        .replace("@ARGS", "{{ .Function.Arguments }}")
    )


def _go_calls(lay: Layout) -> str:
    """An answer with tool calls, as the model's template writes it."""
    form = lay.tool_calls
    if form == "chatml":
        head = _text("<|im_start|>assistant") + "{{ if .Content }}\n{{ .Content }}{{ end }}"
        calls = "{{ range .ToolCalls }}" + _go_call(form) + "{{ end }}"
        return head + calls + _text("<|im_end|>\n")
    if form == "llama3":
        return (
            _text(lay.answer_open)
            + "{{ range .ToolCalls }}"
            + _go_call(form)
            + "{{ end }}"
            + _text(lay.answer_close)
        )
    # DeepSeek-R1's template closes the calls only after a second or later call (and once per
    # such call): written as it does.
    end = _text("<｜tool▁calls▁end｜><｜end▁of▁sentence｜>")
    return (
        _text("<｜Assistant｜><｜tool▁calls▁begin｜>")
        + "{{ range $k, $_ := .ToolCalls }}"
        + "{{ if $k }}\n"
        + _go_call(form)
        + end
        + "{{ else }}"
        + _go_call(form)
        + "{{ end }}{{ end }}"
    )


def _go_result(form: str) -> str:
    if form == "chatml":
        return (
            '{{ if ne $prev "tool" }}<|im_start|>user{{ end }}\n<tool_response>\n'
            "{{ .Content }}\n</tool_response>"
        )
    if form == "llama3":  # Llama 3.1's template writes a text result as JSON (tojson)
        return "<|start_header_id|>ipython<|end_header_id|>\n\n{{ json .Content }}<|eot_id|>"
    return (
        '{{ if ne $prev "tool" }}<｜tool▁outputs▁begin｜>{{ else }}\n{{ end }}'
        "<｜tool▁output▁begin｜>{{ .Content }}<｜tool▁output▁end｜>"
    )


def _go_turns(lay: Layout) -> _Lines:
    form = lay.tool_calls
    head = '{{- $prev := "" }}' if lay.tools else ""
    if lay.tools and lay.tools_default_turn is None:  # Ollama counts tools by .Tools
        head += "{{- if $.Tools }}{{ end }}"
    t = _Lines(head + _text(lay.lead) + _RANGE)
    t.line(_LAST)
    if form and _RUN_END[form]:
        t.line('{{- if and (eq $prev "tool") (ne .Role "tool") }}' + _text(_RUN_END[form]))
        t.add("{{ end }}")
    if lay.default_turn or lay.tools_default_turn:
        t.line('{{- if and (eq $i 0) (ne .Role "system") }}')
        t.add(_either(lay, lay.tools_default_turn, lay.default_turn) + "{{ end }}")
    if lay.system_open is not None and lay.system_join is None:
        t.line('{{- if eq .Role "system" }}')
        if lay.tools_system_open is None:
            t.add(_text(lay.system_open) + "{{ .Content }}" + _text(lay.system_close))
        else:
            t.add(
                "{{ if and $.Tools (eq $i 0) }}" + _tools_text(lay.tools_system_open, lay.tool_sep)
            )
            t.add("{{ .Content }}" + _tools_text(lay.tools_system_close, lay.tool_sep))
            t.add("{{ else }}" + _text(lay.system_open) + "{{ .Content }}")
            t.add(_text(lay.system_close) + "{{ end }}")
        t.add("{{ end }}")
    user = '(or (eq .Role "user") (eq .Role "tool"))' if lay.tool_as_user else 'eq .Role "user"'
    t.line(f"{{{{- if {user} }}}}")
    t.add(_either(lay, lay.tools_user_open, lay.user_open, f"and $.Tools {_FIRST_USER}"))
    if lay.system_join is not None:
        t.add(
            "{{ if and $.System (eq $i 1) }}{{ $.System }}" + _text(lay.system_join) + "{{ end }}"
        )
    t.add("{{ .Content }}" + _text(lay.user_close) + "{{ end }}")
    t.line('{{- if eq .Role "assistant" }}')
    if form == "deepseek":  # an answer after tool results: no header of its own
        t.add(
            '{{ if eq $prev "tool" }}{{ .Content }}'
            + _text(lay.answer_close)
            + "{{ else if .ToolCalls }}"
        )
        t.add(_go_calls(lay) + "{{ else if $last }}")
    elif form:
        t.add("{{ if .ToolCalls }}" + _go_calls(lay) + "{{ else if $last }}")
    else:
        t.add("{{ if $last }}")
    t.add(_text(lay.last_open))
    if lay.think:
        when = "$last" if lay.think_always else ".Thinking"
        t.add(f"{{{{ if {when} }}}}" + _text(lay.think[0]) + "{{ .Thinking }}")
        t.add(_text(lay.think[1]) + "{{ end }}")
    t.add("{{ .Content }}{{ else }}" + _text(lay.answer_open) + "{{ .Content }}")
    t.add(_text(lay.answer_close) + "{{ end }}{{ end }}")
    if form:
        t.line('{{- if eq .Role "tool" }}' + _go_result(form) + "{{ end }}")
    t.line("{{- if $last }}")
    if form:
        t.add('{{ if eq .Role "tool" }}' + _text(_RUN_END[form]) + "{{ end }}")
    after = '(and (ne .Role "assistant") (ne .Role "tool"))' if form == "deepseek" else ""
    after = after or '(ne .Role "assistant")'  # DeepSeek-R1 writes none after tool results
    t.add(f"{{{{ if {after} }}}}" + _text(lay.gen) + "{{ end }}{{ end }}")
    if lay.tools:
        t.line("{{- $prev = .Role }}")
    t.line("{{- end }}")
    return t


# -- Stops, the Modelfile, the command ----------------------------------------------------


def stop_tokens(kind: str, tokenizer=None, extra=()) -> list[str]:
    """The Modelfile's stop strings: the kind's end-of-turn mark and the next turn's start,
    then, given a core.data.tokenizer.Tokenizer, the texts of its EOS and every stop id (Llama
    3.1: <|end_of_text|>, <|eom_id|>, <|eot_id|>; Qwen: <|im_end|>, <|endoftext|>) and its stop
    strings (a byte tokenizer's <|im_end|>), then extra; no empty or repeated string."""
    if kind not in KINDS:
        raise ValueError(f"ollama: unknown template kind {kind!r}; one of {', '.join(KINDS)}")
    stops = list(_STOPS[kind])
    if tokenizer is not None:
        ids = [tokenizer.eos_id] if tokenizer.eos_id is not None else []
        ids += [i for i in tokenizer.stop_ids if i is not None]
        stops += [tokenizer.decode([i]) for i in ids]
        stops += tokenizer.stop_strings
    stops += list(extra)
    return list(dict.fromkeys(s for s in stops if s))


def _reads(text: str) -> str | None:
    """The value Ollama's Modelfile parser takes from text (what follows a command and its
    space) and a newline, or None where the value would end early or run past that newline.
    As parser.ParseFile: a value ends at a newline once it unquotes ("..." or \"\"\"...\"\"\",
    after trimming spaces), and characters that are not printable are dropped."""
    buf = []
    for i, ch in enumerate(text + "\n"):
        if ch in "\r\n \t":
            value = _unquote("".join(buf).strip())
            if value is not None and ch in "\r\n":
                return value if i == len(text) else None
            buf.append(ch)
        elif ch.isprintable():
            buf.append(ch)
    return None


def _unquote(s: str) -> str | None:
    if s.startswith('"""'):
        return s[3:-3] if len(s) >= 6 and s.endswith('"""') else None
    if s.startswith('"'):
        return s[1:-1] if len(s) >= 2 and s.endswith('"') else None
    return s


def _quote(value: str, what: str, forms: str = "dt") -> str:
    """value as a Modelfile argument that Ollama reads back unchanged, in the first of forms
    that does: b bare, d "...", t \"\"\"...\"\"\". None fits a value with characters Ollama
    drops, or (in triple quotes) a line ending in three quotes."""
    wrap = {"b": "{}", "d": '"{}"', "t": '"""{}"""'}
    for form in forms:
        quoted = wrap[form].format(value)
        if _reads(quoted) == value:
            return quoted
    bad = [c for c in value if not (c.isprintable() or c in "\r\n\t")]
    why = f"has the unprintable character {bad[0]!r}" if bad else "cannot be quoted"
    raise OllamaError(f"ollama: the {what} {why}, which a Modelfile cannot carry")


def modelfile(
    gguf_name: str,
    jinja_template: str | None,
    stops: list[str],
    system: str | None = None,
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_bos: bool = False,
) -> str:
    """The Modelfile text: FROM ./gguf_name (a file next to the Modelfile, or a path as
    given), TEMPLATE, one PARAMETER stop per stop string, SYSTEM when given. The keyword
    arguments are layout's (the tokenizer's special token texts and whether it adds BOS);
    modelfile_of fills them in from a tokenizer."""
    lay = layout(jinja_template, bos_token=bos_token, eos_token=eos_token, add_bos=add_bos)
    if system and not takes_system(lay):
        what = "no chat template" if lay.kind == "plain" else f"a {KIND_NAMES[lay.kind]} template"
        raise OllamaError(
            f"ollama: this model's chat template has no place for a system prompt (it has {what} "
            "that refuses one); leave the system prompt empty"
        )
    source = gguf_name if ("/" in gguf_name or "\\" in gguf_name) else f"./{gguf_name}"
    lines = [
        f"FROM {_quote(source, 'GGUF file name', 'bdt')}",
        f"TEMPLATE {_quote(go_template(lay), 'chat template', 'td')}",
    ]
    lines += [f"PARAMETER stop {_quote(s, 'stop string', 'dt')}" for s in stops]
    if system:
        lines.append(f"SYSTEM {_quote(system, 'system prompt', 'td')}")
    return "\n".join(lines) + "\n"


def takes_system(lay: Layout) -> bool:
    """Whether the template has a place for a system prompt (Gemma 2 and Mistral v0.1 do not)."""
    if lay.kind == "plain":
        return False
    return (lay.system_at if lay.kind == "mistral" else lay.system_open) is not None


def layout_of(tokenizer) -> Layout:
    """The layout of the template a core.data.tokenizer.Tokenizer's model chats with."""
    return layout(tokenizer.chat_template, add_bos=tokenizer.add_bos, **special_tokens(tokenizer))


def capabilities(lay: Layout) -> list[str]:
    """What Ollama sees the TEMPLATE take (its capability check): tools, thinking."""
    return [c for c, yes in (("tools", lay.tools), ("thinking", lay.think)) if yes]


def modelfile_of(tokenizer, gguf_name: str = "model.gguf", system: str | None = None) -> str:
    """The Modelfile for a GGUF export of a model with this core.data.tokenizer.Tokenizer: its
    own chat template (none: a base model, plain), special tokens, BOS handling and stops."""
    jinja_template = tokenizer.chat_template
    stops = stop_tokens(template_kind(jinja_template), tokenizer)
    return modelfile(
        gguf_name,
        jinja_template,
        stops,
        system,
        add_bos=tokenizer.add_bos,
        **special_tokens(tokenizer),
    )


def create_command(name: str, folder) -> list[str]:
    """The command that imports the exported folder into Ollama under name."""
    return ["ollama", "create", name, "-f", str(Path(folder) / "Modelfile")]
