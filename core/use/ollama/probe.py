"""The probing stage: a chat template rendered on probe conversations, and the pieces of a
turn-by-turn layout read off what it writes (the text around each turn, a default system
prompt, where the system prompt goes, the <think> block, the tools block)."""

from __future__ import annotations

import json
from dataclasses import replace

from core.data.chat import TemplateError, render
from core.use.ollama.layout import A1, A2, DATE, TOOLS, U1, U2, Layout, OllamaError, S
from core.use.ollama.layout import THINKING as _T


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


def msg(role: str, content: str) -> dict:
    return {"role": role, "content": content}


# Conversations a layout must render exactly as the Jinja template: generation prompts after a
# user turn, and a last assistant message continued.
CHECKS = [
    [msg("user", U1)],
    [msg("system", S), msg("user", U1)],
    [msg("user", U1), msg("assistant", A1), msg("user", U2)],
    [msg("system", S), msg("user", U1), msg("assistant", A1), msg("user", U2)],
    [msg("user", U1), msg("assistant", A1)],
    [
        msg("system", S),
        msg("user", U1),
        msg("assistant", A1),
        msg("user", U2),
        msg("assistant", A2),
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


def cut(text: str, start: str, end: str, after: int = 0) -> tuple[str, int]:
    """The text between start (found from after) and the next end, and where end begins."""
    i = text.index(start, after) + len(start)
    j = text.index(end, i)
    return text[i:j], j


def _turn_pieces(umark: str, one: str, lead: str) -> tuple[str, str]:
    """(text before the user turn after lead, the user turn's opening) of a one-message render."""
    u = one.rindex(umark, 0, one.index(U1))
    return one[len(lead) : u], one[u : one.index(U1)]


def _system_pieces(umark: str, text: str, lead: str) -> tuple:
    """(system_open, system_close, system_join) of a [system, user] render."""
    s, u1 = text.index(S), text.index(U1)
    u = text.rindex(umark, 0, u1)
    if s > u:  # written inside the first user message (Gemma 3)
        return "", "", text[s + len(S) : u1]
    seg = text[len(lead) : u]
    return seg[: seg.index(S)], seg[seg.index(S) + len(S) :], None


def probe_turns(fmt, jinja, bos: str, takes_thinking: bool) -> Layout:
    """The layout of a turn-by-turn template of format fmt (a ChatFormat: its role marks);
    jinja(messages, **extra) renders a conversation as jinja_prompt does."""
    umark, amark = fmt.role_marks
    one = jinja([msg("user", U1)])
    lead = bos if bos and one.startswith(bos) else ""
    default_turn, user_open = _turn_pieces(umark, one, lead)
    three = jinja([msg("user", U1), msg("assistant", A1), msg("user", U2)])
    after_u1 = three[three.index(U1) + len(U1) :]
    user_close = after_u1[: after_u1.index(amark)]
    answer_open = after_u1[len(user_close) : after_u1.index(A1)]
    after_a1 = after_u1[after_u1.index(A1) + len(A1) :]
    answer_close = after_a1[: after_a1.rindex(umark, 0, after_a1.index(U2))]
    rest = one[one.index(U1) + len(U1) :]
    if not rest.startswith(user_close):
        raise ValueError("the generation prompt does not follow the user turn's end")
    gen = rest[len(user_close) :]
    prefill = jinja([msg("user", U1), msg("assistant", A1)])
    last_open = prefill[prefill.index(U1) + len(U1) + len(user_close) : prefill.index(A1)]
    think, always = None, False
    if takes_thinking:
        think = ("<think>\n", "\n</think>\n\n")
        reasoned = jinja(
            [msg("user", U1), {"role": "assistant", "content": A1, "reasoning_content": _T}]
        )
        seg = reasoned[reasoned.index(U1) + len(U1) + len(user_close) : reasoned.index(A1)]
        if _T in seg and "<think>" in seg[: seg.index(_T)]:  # the template writes reasoning
            t0 = seg.index("<think>")
            think = (seg[t0 : seg.index(_T)], seg[seg.index(_T) + len(_T) :])
            always = last_open == seg[:t0] + think[0] + think[1]
            last_open = seg[:t0]
    try:
        system = jinja([msg("system", S), msg("user", U1)])
    except TemplateError:  # Gemma 2: no system message at all
        system = ""
    if S in system:
        system_open, system_close, join = _system_pieces(umark, system, lead)
    else:  # refused, or dropped (Phi-3-mini's first template)
        system_open, system_close, join = None, "", None
    return Layout(
        fmt.name,
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


def probe_tools(fmt, lay: Layout, jinja, jinja_template: str) -> Layout:
    """The pieces that change when the request has tools (the tool list replaced by TOOLS);
    tool calls and results where the template writes earlier calls and fmt has their form."""
    tools = {"tools": _PROBE_TOOLS}
    round_trip = "tool_calls" in jinja_template  # the template writes earlier tool calls
    calls = fmt.name if round_trip and fmt.writes_tool_calls else None
    one = jinja([msg("user", U1)], **tools)
    j1, j2 = (_tool_json(t, one) for t in _PROBE_TOOLS)
    as_user = calls is None and _tool_as_user(jinja)
    if not (j1 and j2):  # the template does not show the tools (DeepSeek-R1, SmolLM3)
        return replace(lay, tools=True, tool_calls=calls, tool_as_user=as_user)
    a, b = one.index(j1), one.index(j2)
    sep = one[a + len(j1) : b]

    def listed(text: str) -> str:
        i, k = text.find(j1), text.find(j2)
        return text if i < 0 else text[:i] + TOOLS + text[k + len(j2) :]

    one = listed(one)
    default_turn, user_open = _turn_pieces(fmt.role_marks[0], one, lay.lead)
    t_open = t_close = None
    if lay.system_open is not None and lay.system_join is None:
        t_open, t_close, _ = _system_pieces(
            fmt.role_marks[0],
            listed(jinja([msg("system", S), msg("user", U1)], **tools)),
            lay.lead,
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
    start = [msg("user", U1), msg("assistant", A1)]
    try:
        as_tool = jinja([*start, msg("tool", U2)])
    except TemplateError:
        return False
    return as_tool == jinja([*start, msg("user", U2)])


def dated(lay: Layout) -> bool:
    """Whether the template writes today's date in a piece (DATE)."""
    pieces = [
        lay.lead,
        lay.default_turn,
        lay.system_open,
        lay.system_close,
        lay.tools_default_turn,
        lay.tools_system_open,
        lay.tools_system_close,
        lay.tools_user_open,
    ]
    return any(DATE in (p or "") for p in pieces)
