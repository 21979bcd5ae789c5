"""The Modelfile: FROM the GGUF, the TEMPLATE, Ollama's RENDERER and PARSER where the format
has them, one PARAMETER stop per stop string and an optional SYSTEM, each quoted so that
Ollama's parser reads it back unchanged."""

from __future__ import annotations

from pathlib import Path

from core.data.chat import special_tokens
from core.use.ollama.formats import get
from core.use.ollama.layout import Layout, OllamaError
from core.use.ollama.template import go_template, layout, stop_tokens, takes_system, template_kind


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
        fmt = get(lay.kind)
        what = f"a {fmt.display} template" if fmt.markers else "no chat template"
        raise OllamaError(
            f"ollama: this model's chat template has no place for a system prompt (it has {what} "
            "that refuses one); leave the system prompt empty"
        )
    source = gguf_name if ("/" in gguf_name or "\\" in gguf_name) else f"./{gguf_name}"
    lines = [
        f"FROM {_quote(source, 'GGUF file name', 'bdt')}",
        f"TEMPLATE {_quote(go_template(lay), 'chat template', 'td')}",
    ]
    fmt = get(lay.kind)
    # Ollama's own renderer and parser where it has them for the format: the TEMPLATE gives
    # way to a RENDERER; a PARSER reads the reasoning and tool calls out of the replies.
    if fmt.renderer(lay):
        lines.append(f"RENDERER {fmt.renderer(lay)}")
    if fmt.parser(lay):
        lines.append(f"PARSER {fmt.parser(lay)}")
    lines += [f"PARAMETER stop {_quote(s, 'stop string', 'dt')}" for s in stops]
    if system:
        lines.append(f"SYSTEM {_quote(system, 'system prompt', 'td')}")
    return "\n".join(lines) + "\n"


def layout_of(tokenizer) -> Layout:
    """The layout of the template a core.data.tokenizer.Tokenizer's model chats with."""
    return layout(tokenizer.chat_template, add_bos=tokenizer.add_bos, **special_tokens(tokenizer))


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
