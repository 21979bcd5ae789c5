"""The front of the three stages: a model's Jinja chat template -> its format (by markers),
its layout (probed, then checked against the template's renders), its Go template; what that
renders otherwise (differences) and its stop strings."""

from __future__ import annotations

import re
from dataclasses import replace

from core.data.chat import TemplateError
from core.use.ollama.formats import FORMATS, get
from core.use.ollama.layout import DATE, Layout, OllamaError
from core.use.ollama.probe import CHECKS, jinja_prompt

_DATE_FORMATS = re.compile(r"""strftime_now\(\s*["']([^"']*)["']""")
_SPECIAL = re.compile(
    r"<\|[^|<>\s]{1,40}\|>|<<SYS>>|<[a-z_]{2,30}>|\[/?[A-Z_]{3,30}\]|<｜[^｜<>\s]{1,30}｜>"
)


def _markers(text: str) -> str:
    found = list(dict.fromkeys(_SPECIAL.findall(text)))[:5]
    return ", ".join(found) if found else "no turn markers"


def _date(_format: str) -> str:
    """strftime_now while probing: DATE, which the Go template writes as currentDate."""
    return DATE


def template_kind(jinja_template: str | None) -> str:
    """The template's format (a name in core.use.ollama.formats; "plain": no template, a base
    model fed the raw prompt). A template of another format raises OllamaError naming the
    markers it uses: a Modelfile without the model's prompt format is the bug this package
    exists to avoid."""
    text = jinja_template or ""
    found = [f.name for f in FORMATS.values() if f.found_in(text)]
    if len(found) == 1:
        return found[0]
    names = ", ".join(f.display for f in FORMATS.values() if f.markers)
    raise OllamaError(
        f"ollama: the model's chat template is none TrainDeck can write for Ollama ({names}); "
        f"it uses {_markers(text)}. Export GGUF and write the Modelfile's TEMPLATE by hand"
    )


def layout(
    jinja_template: str | None, *, bos_token: str = "", eos_token: str = "", add_bos: bool = False
) -> Layout:
    """The layout of a model's template. bos_token/eos_token: the texts the template gets (as
    core.data.chat.special_tokens gives them); add_bos: whether the tokenizer puts BOS first
    itself (the GGUF's add_bos_token), in which case the template's own leading BOS is left
    out, as Ollama's tokenizer adds it."""
    fmt = get(template_kind(jinja_template))
    if not fmt.markers:  # plain
        return fmt.canonical
    tokens = {"bos_token": bos_token, "eos_token": eos_token}
    found = _checked(fmt, jinja_template, tokens, add_bos)
    if _thinking_switch(jinja_template, tokens, False):  # thinks unless told not to (Qwen3)
        off = _checked(fmt, jinja_template, {**tokens, "enable_thinking": False}, add_bos)
        found = replace(found, think_off=replace(off, think_off=None))
    elif _thinking_switch(jinja_template, tokens, True):  # thinks only when asked (Gemma 4)
        on = _checked(fmt, jinja_template, {**tokens, "enable_thinking": True}, add_bos)
        found = replace(on, think_off=found, think_asked=True)
    return found


def _thinking_switch(jinja_template: str, tokens: dict, value: bool) -> bool:
    """Whether enable_thinking=value changes what the template renders by default."""
    if "enable_thinking" not in jinja_template:
        return False
    try:
        return any(
            jinja_prompt(jinja_template, m, **tokens, strftime_now=_date)
            != jinja_prompt(jinja_template, m, **tokens, enable_thinking=value, strftime_now=_date)
            for m in CHECKS
        )
    except TemplateError:
        return False


def _probe(fmt, jinja_template: str, tokens: dict) -> Layout:
    def jinja(messages, **extra):
        return jinja_prompt(jinja_template, messages, **tokens, **extra, strftime_now=_date)

    return fmt.probe(jinja, jinja_template, tokens.get("bos_token", ""))


def _checked(fmt, jinja_template: str, tokens: dict, add_bos: bool) -> Layout:
    name = fmt.display
    try:
        found = _probe(fmt, jinja_template, tokens)
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
    for messages in CHECKS:
        if not fmt.takes_system(found) and any(m["role"] == "system" for m in messages):
            continue
        try:
            want = jinja_prompt(jinja_template, messages, **tokens, strftime_now=_date)
        except TemplateError as e:
            raise OllamaError(
                f"ollama: the chat template fails on a plain conversation: {e}"
            ) from None
        got = added + fmt.prompt(found, messages)
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
    date as DATE: the Python twin of the Go template."""
    return get(lay.kind).prompt(lay, messages)


def go_template(kind: str | Layout) -> str:
    """The Ollama TEMPLATE for a format (its common form) or for a model's layout. It uses
    .Messages, so Ollama passes the whole conversation (system messages included) and the
    template ends with the assistant's header, or inside a last assistant message."""
    lay = kind if isinstance(kind, Layout) else get(kind).canonical
    return get(lay.kind).go_template(lay)


def takes_system(lay: Layout) -> bool:
    """Whether the template has a place for a system prompt (Gemma 2 and Mistral v0.1 do not)."""
    return get(lay.kind).takes_system(lay)


def capabilities(lay: Layout) -> list[str]:
    """What Ollama sees the TEMPLATE take (its capability check): tools, thinking."""
    return [c for c, yes in (("tools", lay.tools), ("thinking", lay.think)) if yes]


def differences(lay: Layout, jinja_template: str = "") -> list[str]:
    """What the TEMPLATE renders differently from the model's Jinja template, one line each
    (the export log and docs/use-and-export.md list them)."""
    fmt = get(lay.kind)
    if not fmt.markers:  # plain: Ollama feeds the prompt as it is
        return []
    notes = _template_notes(jinja_template) + [
        "Ollama merges consecutive messages of one role (joined by a blank line) and puts the "
        "Modelfile's SYSTEM first when a conversation has none"
    ]
    if not takes_system(lay):
        notes.append(
            "a system message in a request is left out; the model's template refuses one "
            "(Gemma 2) or drops it"
        )
    if lay.dated and set(_DATE_FORMATS.findall(jinja_template)) != {"%Y-%m-%d"}:
        notes.append(
            "today's date is Ollama's currentDate (YYYY-MM-DD); the model's template "
            "writes it as strftime_now does (e.g. '26 Jul 2024' or '26 July 2024')"
        )
    if fmt.joins_system(lay):
        notes.append(
            "the system prompt joins the user message the template puts it in only "
            "when the conversation opens with it"
        )
    unwritten = fmt.tools_unwritten and lay.tool_calls is None  # its notes say what is lost
    if lay.tools and not unwritten:
        notes.append(
            "tool definitions and call arguments are Ollama's compact JSON; the "
            "model's template writes Python's spaced JSON (tojson)"
        )
        if lay.tools_default_turn is None and not fmt.tools_unwritten:
            notes.append(
                "the model's template shows no tool definitions when given tools; "
                "neither does the TEMPLATE (it names .Tools so Ollama keeps it)"
            )
        if lay.tool_calls is None and not unwritten:
            notes.append(
                "tool calls in earlier answers are not written (the model's template "
                "does not write them either)"
            )
    notes += fmt.notes
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


def stop_tokens(kind: str, tokenizer=None, extra=()) -> list[str]:
    """The Modelfile's stop strings: the format's end-of-turn mark and the next turn's start,
    then, given a core.data.tokenizer.Tokenizer, the texts of its EOS and every stop id (Llama
    3.1: <|end_of_text|>, <|eom_id|>, <|eot_id|>; Qwen: <|im_end|>, <|endoftext|>) and its stop
    strings (a byte tokenizer's <|im_end|>), then extra; no empty or repeated string."""
    stops = list(get(kind).stops)
    if tokenizer is not None:
        ids = [tokenizer.eos_id] if tokenizer.eos_id is not None else []
        ids += [i for i in tokenizer.stop_ids if i is not None]
        stops += [tokenizer.decode([i]) for i in ids]
        stops += tokenizer.stop_strings
    stops += list(extra)
    return list(dict.fromkeys(s for s in stops if s))
