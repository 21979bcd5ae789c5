"""Ollama: a Modelfile for an exported GGUF, so Ollama prompts the model as it was trained.

Ollama takes a GGUF's chat template only when it is nearly identical to one it knows; any other
model runs with the bare `{{ .Prompt }}` and no stop strings, so it never stops and prints the
next turn's markers. The Modelfile written here carries a TEMPLATE in Ollama's Go template
syntax that renders a conversation exactly as the model's Jinja chat template does
(add_generation_prompt=True; an assistant message last is continued, as transformers'
continue_final_message does), one PARAMETER stop per end-of-turn mark, and an optional SYSTEM.

Templates are told apart by their markers (template_kind): ChatML, Llama 3, Mistral [INST] or
none ("plain", a base model). Within a kind, the pieces that vary between models (a default
system prompt, Llama 3.1's date header, TrainDeck's EOS after each answer, Mistral's spacing and
where it puts the system prompt) are read off the Jinja template by rendering probe
conversations, and the Go template built from them is checked against the Jinja renders of
several conversations: a template that does not fit is refused with a one-line error rather
than exported with a prompt format the model never saw.

What a Go template cannot do: message text is written as given, where Llama 3 and Mistral v0.3
strip the whitespace around it (`| trim`); a date a template computes (Llama 3.2's
strftime_now) is fixed on the day of export; Ollama itself merges consecutive messages of one
role and puts the Modelfile's SYSTEM first when a conversation has no system message; tool
calls and tool results are not written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from core.data.chat import TemplateError, render, special_tokens
from core.errors import UserError

KINDS = ("chatml", "llama3", "mistral", "plain")
KIND_NAMES = {"chatml": "ChatML", "llama3": "Llama 3", "mistral": "Mistral [INST]", "plain": "none"}


class OllamaError(UserError):
    pass


# The markers that tell a kind (all of them must appear in the Jinja text).
_MARKERS = {
    "chatml": ("<|im_start|>", "<|im_end|>"),
    "llama3": ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    "mistral": ("[INST]", "[/INST]"),
}
# Turn layouts: (before the role, after the role, end of turn, after the end of turn).
_TURNS = {
    "chatml": ("<|im_start|>", "\n", "<|im_end|>", "\n"),
    "llama3": ("<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>", ""),
}
# Stop strings of a kind: its end-of-turn mark, then the next turn's start (as Ollama's own
# chatml and llama3 parameters do), so a model that skips its end mark still stops.
_STOPS = {
    "chatml": ("<|im_end|>", "<|im_start|>"),
    "llama3": ("<|eot_id|>", "<|start_header_id|>"),
    "mistral": ("</s>", "[INST]"),
    "plain": (),
}
_SPECIAL = re.compile(r"<\|[^|<>\s]{1,40}\|>|<<SYS>>|<[a-z_]{2,30}>|\[/?[A-Z_]{3,30}\]")


@dataclass(frozen=True)
class Layout:
    """How a chat template lays out a conversation: the pieces its Go template is built from.

    lead: text before the first turn (a BOS that Ollama's tokenizer does not add itself).
    default_system: chatml/llama3: the system turn's text when the conversation has no system
        message (Qwen's "You are Qwen...", Llama 3.1's date header), None for no system turn.
    system_prefix: chatml/llama3: text before a first system message's own (Llama 3.1).
    answer_end: chatml/llama3: text after an answer's end-of-turn mark (TrainDeck's default
        template puts the EOS there); mistral: text after an answer (the EOS).
    inst_open, inst_close, answer_open, system_sep: mistral's text around a user message, before
        an answer, and between the system prompt and the user message it joins.
    system_at: mistral: the user message the system prompt joins, "first" (v0.1/v0.2) or "last"
        (v0.3); None for a template that takes no system message.
    """

    kind: str
    lead: str = ""
    default_system: str | None = None
    system_prefix: str = ""
    answer_end: str = ""
    inst_open: str = "[INST] "
    inst_close: str = "[/INST]"
    answer_open: str = " "
    system_sep: str = "\n\n"
    system_at: str | None = "last"


# Each kind's common form: ChatML as Qwen2.5 (no default system) and Ollama's chatml; Llama 3.0
# with BOS added by Ollama's tokenizer; Mistral-7B-Instruct v0.3.
CANONICAL = {
    "chatml": Layout("chatml"),
    "llama3": Layout("llama3"),
    "mistral": Layout("mistral", answer_end="</s>"),
    "plain": Layout("plain"),
}


def _markers(text: str) -> str:
    found = list(dict.fromkeys(_SPECIAL.findall(text)))[:5]
    return ", ".join(found) if found else "no turn markers"


def template_kind(jinja_template: str | None) -> str:
    """The template's kind: "chatml", "llama3", "mistral" or "plain" (no template: a base
    model fed the raw prompt). A template of another kind raises OllamaError naming the
    markers it uses: a Modelfile without the model's prompt format is the bug this module
    exists to avoid."""
    if not jinja_template or not jinja_template.strip():
        return "plain"
    kinds = [k for k, marks in _MARKERS.items() if all(m in jinja_template for m in marks)]
    if "<<SYS>>" in jinja_template:  # Llama 2: [INST] with its own system block
        kinds = [k for k in kinds if k != "mistral"]
    if len(kinds) == 1:
        return kinds[0]
    raise OllamaError(
        "ollama: the model's chat template is none TrainDeck can write for Ollama (ChatML, "
        f"Llama 3, Mistral [INST]); it uses {_markers(jinja_template)}. Export GGUF and write "
        "the Modelfile's TEMPLATE by hand"
    )


# -- Reading a layout off a Jinja template ------------------------------------------------

_S, _U1, _A1, _U2, _A2 = "ProbeSystem7", "ProbeUser1", "ProbeAnswer1", "ProbeUser2", "ProbeAnswer2"


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


def _probe_turns(kind: str, jinja) -> Layout:
    pre, post, end, sep = _TURNS[kind]
    head = {role: pre + role + post for role in ("system", "user", "assistant")}
    one = jinja([_msg("user", _U1)])
    lead = one[: one.index(pre)]
    default = None
    if one.startswith(lead + head["system"]):
        default, _ = _cut(one, lead + head["system"], end)
    with_system = jinja([_msg("system", _S), _msg("user", _U1)])
    prefix, _ = _cut(with_system, lead + head["system"], _S)
    three = jinja([_msg("user", _U1), _msg("assistant", _A1), _msg("user", _U2)])
    answer_end, _ = _cut(three, _A1 + end, sep + head["user"])
    return Layout(kind, lead, default, prefix, answer_end)


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
        return Layout("mistral", lead, None, "", answer_end, inst_open, inst_close,
                      answer_open, "", None)  # fmt: skip
    if system.startswith(lead + inst_open + _S):
        at, (sep, _) = "first", _cut(system, _S, _U1)
    else:
        at, (sep, _) = "last", _cut(system, _S, _U2)
    return Layout(
        "mistral", lead, None, "", answer_end, inst_open, inst_close, answer_open, sep, at
    )


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

    def jinja(messages):
        return jinja_prompt(jinja_template, messages, **tokens)

    name = KIND_NAMES[kind]
    try:
        found = _probe_mistral(jinja, bos_token) if kind == "mistral" else _probe_turns(kind, jinja)
    except (ValueError, TemplateError) as e:
        detail = f" ({e})" if isinstance(e, TemplateError) else ""
        raise OllamaError(
            f"ollama: the chat template uses {name} markers but not in the {name} layout"
            f"{detail}; export GGUF and write the Modelfile's TEMPLATE by hand"
        ) from None
    added = ""
    if add_bos and bos_token and found.lead.startswith(bos_token):
        added, found = bos_token, replace(found, lead=found.lead[len(bos_token) :])
    for messages in _CHECKS:
        if found.system_at is None and any(m["role"] == "system" for m in messages):
            continue
        try:
            want = jinja(messages)
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
    SYSTEM is put first and same-role runs are merged): the Python twin of the Go template."""
    if lay.kind == "plain":  # Ollama runs {{ .Prompt }}{{ .Response }} turn by turn
        return "".join(m["content"] for m in messages if m["role"] in ("user", "assistant"))
    out = [lay.lead]
    n = len(messages)
    if lay.kind == "mistral":
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
    pre, post, end, sep = _TURNS[lay.kind]
    for i, m in enumerate(messages):
        last, role = i == n - 1, m["role"]
        if i == 0 and role != "system" and lay.default_system is not None:
            out += [pre, "system", post, lay.default_system, end, sep]
        out += [pre, role, post]
        if i == 0 and role == "system":
            out.append(lay.system_prefix)
        out.append(m["content"])
        if not (last and role == "assistant"):
            out += [end, lay.answer_end if role == "assistant" else "", sep]
        if last and role != "assistant":
            out += [pre, "assistant", post]
    return "".join(out)


# -- The Go template ----------------------------------------------------------------------


def _text(s: str) -> str:
    """Literal template text: Go's text/template has no escape for its delimiter, so each "{"
    is written as an action printing it."""
    return s.replace("{", '{{ "{" }}')


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

    def text(self) -> str:
        assert all(line.endswith("}}") for line in self.lines)
        return "\n".join(self.lines)


_RANGE = "{{ range $i, $_ := .Messages }}"
_LAST = "{{- $last := eq (len (slice $.Messages $i)) 1 }}"


def go_template(kind: str | Layout) -> str:
    """The Ollama TEMPLATE for a kind (its common form, CANONICAL) or for a model's layout.
    It uses .Messages, so Ollama passes the whole conversation (system messages included) and
    the template ends with the assistant's header, or inside a last assistant message."""
    lay = kind if isinstance(kind, Layout) else CANONICAL.get(kind)
    if lay is None:
        raise ValueError(f"ollama: unknown template kind {kind!r}; one of {', '.join(KINDS)}")
    if lay.kind == "plain":
        return "{{ .Prompt }}"
    t = _Lines(_text(lay.lead) + _RANGE)
    t.line(_LAST)
    if lay.kind == "mistral":
        t.line('{{- if eq .Role "user" }}' + _text(lay.inst_open))
        if lay.system_at is not None:
            where = "(eq $i 1)" if lay.system_at == "first" else "$last"
            t.add(f"{{{{ if and $.System {where} }}}}{{{{ $.System }}}}")
            t.add(_text(lay.system_sep) + "{{ end }}")
        t.add("{{ .Content }}" + _text(lay.inst_close) + "{{ end }}")
        t.line('{{- if eq .Role "assistant" }}' + _text(lay.answer_open) + "{{ .Content }}")
        t.add("{{ if not $last }}" + _text(lay.answer_end) + "{{ end }}{{ end }}")
        t.line("{{- end }}")
        return t.text()
    pre, post, end, sep = (_text(p) for p in _TURNS[lay.kind])
    if lay.default_system is not None:
        t.line('{{- if and (eq $i 0) (ne .Role "system") }}' + pre + "system" + post)
        t.add(_text(lay.default_system) + end + sep + "{{ end }}")
    t.add(pre + "{{ .Role }}" + post)
    if lay.system_prefix:
        t.add('{{ if and (eq $i 0) (eq .Role "system") }}' + _text(lay.system_prefix))
        t.add("{{ end }}")
    t.add("{{ .Content }}")
    t.line('{{- if not (and $last (eq .Role "assistant")) }}' + end)
    if lay.answer_end:
        t.add('{{ if eq .Role "assistant" }}' + _text(lay.answer_end) + "{{ end }}")
    t.add(sep + "{{ end }}")
    t.line('{{- if and $last (ne .Role "assistant") }}' + pre + "assistant" + post + "{{ end }}")
    t.line("{{- end }}")
    return t.text()


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
    if system and (lay.kind == "plain" or (lay.kind == "mistral" and lay.system_at is None)):
        raise OllamaError(
            "ollama: this model's chat template has no place for a system prompt (it has "
            + ("no chat template" if lay.kind == "plain" else "a Mistral template without one")
            + "); leave the system prompt empty"
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


def modelfile_of(tokenizer, gguf_name: str = "model.gguf", system: str | None = None) -> str:
    """The Modelfile for a GGUF export of a model with this core.data.tokenizer.Tokenizer: its
    own chat template (none: a base model, plain), special tokens, BOS handling and stops."""
    jinja_template = tokenizer.chat_template
    stops = stop_tokens(template_kind(jinja_template), tokenizer)
    return modelfile(
        gguf_name, jinja_template, stops, system, add_bos=tokenizer.add_bos,
        **special_tokens(tokenizer),
    )  # fmt: skip


def create_command(name: str, folder) -> list[str]:
    """The command that imports the exported folder into Ollama under name."""
    return ["ollama", "create", name, "-f", str(Path(folder) / "Modelfile")]
