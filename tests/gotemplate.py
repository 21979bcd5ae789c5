"""Go's text/template for tests: real Go where the go tool is installed (go_prompts builds and
runs tests/gotemplate_go/main.go, which renders as Ollama's server does and reports the
template's variables and thinking tags), and a small Python renderer of the part of
text/template that Ollama TEMPLATEs use, which needs nothing installed.

The Python renderer supports: text; actions {{ pipeline }} with the trim markers "{{- " and
" -}}"; {{ if }}, {{ else if }}, {{ else }}, {{ end }}; {{ range PIPE }}, {{ range $v := PIPE }},
{{ range $i, $v := PIPE }} (with {{ else }}); {{ $x := PIPE }}, {{ $x = PIPE }}; operands .
.Field.Chain $ $.Field $x $x.Field "string" 123 true false nil and (parenthesised pipelines);
the functions eq, ne, and, or, not, len, slice and index. Anything else (pipes "|", with,
define, template, block, break, continue, comments, raw strings, other functions, missing
fields) raises GoTemplateError instead of being guessed at.

ollama_prompt runs a template the way Ollama's server does for a chat request (server/routes.go
and template/template.go): the Modelfile's SYSTEM first unless the conversation opens with a
system message, runs of same-role messages merged, then the template over .Messages or, for a
template that does not use .Messages, turn by turn over .System/.Prompt/.Response.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path


class GoTemplateError(Exception):
    pass


# -- Lexing -----------------------------------------------------------------------------------

_SPACE = " \t\r\n"
_TOKEN = re.compile(
    r"""(?P<space>[ \t\r\n]+)
    |(?P<string>"(?:[^"\\\n]|\\.)*")
    |(?P<declare>:=)
    |(?P<assign>=)
    |(?P<lparen>\()
    |(?P<rparen>\))
    |(?P<comma>,)
    |(?P<pipe>\|)
    |(?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
    |(?P<field>(?:\.[A-Za-z_][A-Za-z0-9_]*)+)
    |(?P<dot>\.)
    |(?P<number>-?[0-9]+)
    |(?P<name>[A-Za-z_][A-Za-z0-9_]*)""",
    re.X,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}


def _string(literal: str) -> str:
    out, i, body = [], 0, literal[1:-1]
    while i < len(body):
        if body[i] == "\\":
            if body[i + 1] not in _ESCAPES:
                raise GoTemplateError(f"unsupported escape in {literal}")
            out.append(_ESCAPES[body[i + 1]])
            i += 2
        else:
            out.append(body[i])
            i += 1
    return "".join(out)


def _lex(source: str) -> list:
    """[("text", str) | ("action", tokens)], trim markers applied."""
    items, pos = [], 0
    while True:
        start = source.find("{{", pos)
        if start < 0:
            items.append(("text", source[pos:]))
            return _trim(items)
        items.append(("text", source[pos:start]))
        p, trim_left = start + 2, False
        if source.startswith("/*", p) or source.startswith("- /*", p):
            raise GoTemplateError("comments are not supported")
        if source[p : p + 1] == "-" and source[p + 1 : p + 2] in tuple(_SPACE):
            trim_left, p = True, p + 2
        tokens, trim_right = [], False
        while True:
            if p >= len(source):
                raise GoTemplateError("unclosed action")
            if source.startswith("}}", p):
                p += 2
                break
            if source[p] in _SPACE and source.startswith("-}}", p + 1):
                trim_right, p = True, p + 4
                break
            m = _TOKEN.match(source, p)
            if not m:
                raise GoTemplateError(f"unsupported syntax at {source[p : p + 20]!r}")
            if m.lastgroup != "space":
                tokens.append((m.lastgroup, m.group()))
            p = m.end()
        if not tokens:
            raise GoTemplateError("empty action")
        items.append(("action", tokens, trim_left, trim_right))
        pos = p


def _trim(items):
    out = []
    for n, item in enumerate(items):
        if item[0] == "text":
            text = item[1]
            if n > 0 and items[n - 1][3]:
                text = text.lstrip(_SPACE)
            if n + 1 < len(items) and items[n + 1][2]:
                text = text.rstrip(_SPACE)
            out.append(("text", text))
        else:
            out.append(("action", item[1]))
    return out


# -- Parsing ----------------------------------------------------------------------------------


class _If:
    def __init__(self, cond, chained=False):
        self.cond, self.then, self.els, self.chained = cond, [], None, chained


class _Range:
    def __init__(self, key, value, expr):
        self.key, self.value, self.expr, self.body, self.els = key, value, expr, [], None


class _Declare:
    def __init__(self, name, expr):
        self.name, self.expr = name, expr


class _Print:
    def __init__(self, expr):
        self.expr = expr


class _Assign:
    def __init__(self, name, expr):
        self.name, self.expr = name, expr


_UNSUPPORTED = {"with", "define", "template", "block", "break", "continue"}


def _pipeline(tokens):
    """A pipeline without "|": one command, [args]; an arg is a token or ("paren", command)."""
    cmd, rest = _command(tokens, 0)
    if rest != len(tokens):
        raise GoTemplateError(f"unexpected {tokens[rest][1]!r}")
    if not cmd:
        raise GoTemplateError("missing value")
    return cmd


def _command(tokens, i):
    args = []
    while i < len(tokens):
        kind, text = tokens[i]
        if kind == "rparen":
            break
        if kind == "lparen":
            inner, i = _command(tokens, i + 1)
            if i >= len(tokens) or tokens[i][0] != "rparen":
                raise GoTemplateError("unclosed parenthesis")
            if not inner:
                raise GoTemplateError("empty parenthesis")
            args.append(("paren", inner))
            i += 1
            continue
        if kind in ("pipe", "assign", "declare", "comma"):
            raise GoTemplateError(f"unsupported {text!r} in a pipeline")
        args.append((kind, text))
        i += 1
    return args, i


def parse(source: str) -> list:
    root: list = []
    current, stack = root, []  # stack: (node, the list it sits in)
    for item in _lex(source):
        if item[0] == "text":
            if item[1]:
                current.append(item[1])
            continue
        tokens = item[1]
        kind, word = tokens[0]
        if kind == "name" and word in _UNSUPPORTED:
            raise GoTemplateError(f"{{{{ {word} }}}} is not supported")
        if kind == "name" and word == "if":
            node = _If(_pipeline(tokens[1:]))
            current.append(node)
            stack.append((node, current))
            current = node.then
        elif kind == "name" and word == "range":
            rest, key, value = tokens[1:], None, None
            if ("declare", ":=") in rest:
                at = rest.index(("declare", ":="))
                names = [t for t in rest[:at] if t[0] != "comma"]
                if not all(t[0] == "var" and "." not in t[1] for t in names) or len(names) > 2:
                    raise GoTemplateError("bad range declaration")
                if len(names) == 2:
                    key, value = names[0][1], names[1][1]
                else:
                    value = names[0][1]
                rest = rest[at + 1 :]
            node = _Range(key, value, _pipeline(rest))
            current.append(node)
            stack.append((node, current))
            current = node.body
        elif kind == "name" and word == "else":
            if not stack:
                raise GoTemplateError("{{ else }} outside if/range")
            node, _ = stack[-1]
            if node.els is not None:
                raise GoTemplateError("second {{ else }}")
            node.els = []
            if len(tokens) == 1:
                current = node.els
            elif tokens[1] == ("name", "if") and isinstance(node, _If):
                inner = _If(_pipeline(tokens[2:]), chained=True)
                node.els.append(inner)
                stack.append((inner, node.els))
                current = inner.then
            else:
                raise GoTemplateError(f"unsupported else {tokens[1][1]!r}")
        elif kind == "name" and word == "end":
            if len(tokens) != 1 or not stack:
                raise GoTemplateError("unexpected {{ end }}")
            node, current = stack.pop()
            while isinstance(node, _If) and node.chained:
                node, current = stack.pop()
        elif kind == "var" and len(tokens) > 1 and tokens[1][0] in ("declare", "assign"):
            if "." in word:
                raise GoTemplateError("only $x := and $x = are supported")
            node = _Declare if tokens[1][0] == "declare" else _Assign
            current.append(node(word, _pipeline(tokens[2:])))
        else:
            current.append(_Print(_pipeline(tokens)))
    if stack:
        raise GoTemplateError("missing {{ end }}")
    return root


# -- Executing --------------------------------------------------------------------------------


def _truth(value) -> bool:
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, str, list, tuple)):
        return len(value) > 0 if not isinstance(value, int) else value != 0
    if isinstance(value, dict):  # a struct (always true); maps are not used
        return True
    raise GoTemplateError(f"no truth value for {type(value).__name__}")


def _same_kind(a, b):
    kinds = (bool, int, str)
    ka = next((k for k in kinds if isinstance(a, k)), None)
    kb = next((k for k in kinds if isinstance(b, k)), None)
    if ka is None or ka is not kb:
        raise GoTemplateError(f"incompatible types for comparison: {a!r}, {b!r}")


def _eq(a, *others):
    if not others:
        raise GoTemplateError("eq needs two arguments")
    for b in others:
        _same_kind(a, b)
    return any(a == b for b in others)


def _ne(a, b):
    _same_kind(a, b)
    return a != b


def _len(x):
    if isinstance(x, str):
        return len(x.encode())
    if isinstance(x, (list, tuple, dict)):
        return len(x)
    raise GoTemplateError(f"len of {type(x).__name__}")


def _slice(x, *idx):
    if len(idx) > 2:
        raise GoTemplateError("only slice x i and slice x i j are supported")
    data = x.encode() if isinstance(x, str) else x
    if not isinstance(data, (bytes, list, tuple)):
        raise GoTemplateError(f"can't slice {type(x).__name__}")
    i = idx[0] if idx else 0
    j = idx[1] if len(idx) > 1 else len(data)
    if not all(isinstance(k, int) and not isinstance(k, bool) for k in (i, j)):
        raise GoTemplateError("slice indices must be integers")
    if not 0 <= i <= j <= len(data):
        raise GoTemplateError(f"slice index out of range: {i}:{j} of {len(data)}")
    part = data[i:j]
    return part.decode() if isinstance(x, str) else list(part)


def _index(x, *keys):
    for k in keys:
        if isinstance(x, (list, tuple)) and isinstance(k, int) and 0 <= k < len(x):
            x = x[k]
        else:
            raise GoTemplateError(f"index {k!r} out of range")
    return x


def _gt(a, b):
    _same_kind(a, b)
    return a > b


_FUNCS = {"eq": _eq, "ne": _ne, "gt": _gt, "len": _len, "slice": _slice, "index": _index}


def _format(value) -> str:
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, str)):
        return str(value)
    raise GoTemplateError(f"printing a {type(value).__name__} is not supported")


class _Run:
    def __init__(self, data):
        self.out = []
        self.scopes = [{"$": data}]

    def var(self, name):
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        raise GoTemplateError(f"undefined variable {name}")

    @staticmethod
    def field(value, name):
        if not isinstance(value, dict) or name not in value:
            raise GoTemplateError(f"can't evaluate field {name} in {value!r}")
        return value[name]

    def arg(self, arg, dot):
        kind, text = arg
        if kind == "paren":
            return self.command(text, dot)
        if kind == "string":
            return _string(text)
        if kind == "number":
            return int(text)
        if kind == "dot":
            return dot
        if kind == "field":
            value = dot
            for name in text[1:].split("."):
                value = self.field(value, name)
            return value
        if kind == "var":
            name, *fields = text.split(".")
            value = self.var(name)
            for f in fields:
                value = self.field(value, f)
            return value
        if kind == "name" and text in ("true", "false", "nil"):
            return {"true": True, "false": False, "nil": None}[text]
        raise GoTemplateError(f"unsupported operand {text!r}")

    def command(self, cmd, dot):
        kind, text = cmd[0]
        if kind == "name" and text not in ("true", "false", "nil"):
            args = cmd[1:]
            if text in ("and", "or"):
                if not args:
                    raise GoTemplateError(f"{text} needs arguments")
                for a in args:  # Go 1.18+: stops at the first value that decides
                    value = self.arg(a, dot)
                    if _truth(value) == (text == "or"):
                        return value
                return value
            if text == "not":
                if len(args) != 1:
                    raise GoTemplateError("not takes one argument")
                return not _truth(self.arg(args[0], dot))
            if text not in _FUNCS:
                raise GoTemplateError(f"function {text!r} is not supported")
            return _FUNCS[text](*(self.arg(a, dot) for a in args))
        if len(cmd) > 1:
            raise GoTemplateError(f"can't give arguments to {text!r}")
        return self.arg(cmd[0], dot)

    def nodes(self, nodes, dot):
        for node in nodes:
            if isinstance(node, str):
                self.out.append(node)
            elif isinstance(node, _Print):
                self.out.append(_format(self.command(node.expr, dot)))
            elif isinstance(node, _Declare):
                self.scopes[-1][node.name] = self.command(node.expr, dot)
            elif isinstance(node, _Assign):
                value = self.command(node.expr, dot)
                scope = next((sc for sc in reversed(self.scopes) if node.name in sc), None)
                if scope is None:
                    raise GoTemplateError(f"undefined variable {node.name}")
                scope[node.name] = value
            elif isinstance(node, _If):
                branch = node.then if _truth(self.command(node.cond, dot)) else node.els
                self.block(branch or [], dot, {})
            elif isinstance(node, _Range):
                items = self.command(node.expr, dot)
                if items is None:
                    items = []
                if not isinstance(items, (list, tuple)):
                    raise GoTemplateError("range over a non-list is not supported")
                for i, item in enumerate(items):
                    scope = {}
                    if node.key:
                        scope[node.key] = i
                    if node.value:
                        scope[node.value] = item
                    self.block(node.body, item, scope)
                if not items and node.els:
                    self.block(node.els, dot, {})

    def block(self, nodes, dot, scope):
        self.scopes.append(scope)
        try:
            self.nodes(nodes, dot)
        finally:
            self.scopes.pop()


def render(source: str, data: dict) -> str:
    """source executed with data (dicts stand for Go maps and structs)."""
    run = _Run(data)
    run.nodes(parse(source), data)
    return "".join(run.out)


# -- Ollama -----------------------------------------------------------------------------------


def identifiers(source: str) -> set[str]:
    """Lower-cased field and variable names the template mentions (Ollama's Template.Vars)."""
    names = set()
    for item in _lex(source):
        if item[0] != "action":
            continue
        for kind, text in item[1]:
            if kind in ("field", "var"):
                names.update(p.lower() for p in text.lstrip("$").split(".") if p)
    return names


def _collate(messages):
    system, out = [], []
    for m in messages:
        if m["role"] == "system":
            system.append(m["content"])
        if out and out[-1]["Role"] == m["role"] and m["role"] != "tool":
            out[-1]["Content"] += "\n\n" + m["content"]
        else:
            out.append(
                {
                    "Role": m["role"],
                    "Content": m["content"],
                    "Thinking": "",
                    "ToolCalls": [],
                    "ToolName": "",
                }
            )
    return "\n\n".join(system), out


def _cut_after_response(nodes, state):
    """Ollama's deleteNode for the last turn: keep nodes up to the first .Response field."""
    kept = []
    for node in nodes:
        if state["cut"]:
            continue
        if isinstance(node, (_Print, _Declare, _Assign)):
            if any(t[0] == "field" and "Response" in t[1].split(".") for t in _flat(node.expr)):
                state["cut"] = True
        elif isinstance(node, _If):
            node.then = _cut_after_response(node.then, state)
            if node.els is not None:
                node.els = _cut_after_response(node.els, state)
        elif isinstance(node, _Range):
            node.body = _cut_after_response(node.body, state)
            if node.els is not None:
                node.els = _cut_after_response(node.els, state)
        kept.append(node)
    return kept


def _flat(cmd):
    for arg in cmd:
        if arg[0] == "paren":
            yield from _flat(arg[1])
        else:
            yield arg


def ollama_prompt(template: str, messages: list[dict], system: str | None = None) -> str:
    """The prompt Ollama builds from a chat request's messages with this TEMPLATE (and the
    Modelfile's SYSTEM)."""
    messages = [dict(m) for m in messages]
    if system and (not messages or messages[0]["role"] != "system"):
        messages.insert(0, {"role": "system", "content": system})
    joined, collated = _collate(messages)
    names = identifiers(template)
    if "messages" in names:
        data = {
            "System": joined,
            "Messages": collated,
            "Tools": None,
            "Response": "",
            "Think": False,
            "IsThinkSet": False,
        }
        return render(template, data)
    # Legacy templates run once per finished turn, then for the last turn up to .Response.
    if "response" not in names:
        template += "{{ .Response }}"
    out, turn = [], {"System": "", "Prompt": "", "Response": ""}

    def execute():
        out.append(render(template, dict(turn)))
        turn.update(System="", Prompt="", Response="")

    for m in collated:
        if m["Role"] == "system":
            if turn["Prompt"] or turn["Response"]:
                execute()
            turn["System"] = m["Content"]
        elif m["Role"] == "user":
            if turn["Response"]:
                execute()
            turn["Prompt"] = m["Content"]
        elif m["Role"] == "assistant":
            turn["Response"] = m["Content"]
    run = _Run(dict(turn))
    run.nodes(_cut_after_response(parse(template), {"cut": False}), run.scopes[0]["$"])
    return "".join(out) + "".join(run.out)


# -- Real Go ----------------------------------------------------------------------------------

GO_SOURCE = Path(__file__).parent / "gotemplate_go" / "main.go"


@functools.lru_cache(maxsize=1)
def _go_binary() -> str | None:
    """tests/gotemplate_go built once per source version into the temp folder; None without
    the go tool (apt-get install golang-go)."""
    go = shutil.which("go")
    if go is None:
        return None
    source = GO_SOURCE.read_bytes()
    folder = (
        Path(tempfile.gettempdir())
        / f"traindeck-gotemplate-{hashlib.sha1(source).hexdigest()[:12]}"
    )
    binary = folder / "render"
    if not binary.exists():
        folder.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "GO111MODULE": "off",
            "GOCACHE": str(folder / "cache"),
            "GOPATH": str(folder / "gopath"),
            "GOFLAGS": "",
        }
        tmp = folder / f"render.{os.getpid()}"
        subprocess.run(
            [go, "build", "-o", str(tmp), str(GO_SOURCE)], check=True, env=env, capture_output=True
        )
        os.replace(tmp, binary)
    return str(binary)


def go_available() -> bool:
    return _go_binary() is not None


def go_prompts(cases: list[dict]) -> list[dict]:
    """Each case ({template, messages, tools, think, is_think_set, system}) rendered by Go's own
    text/template as Ollama renders a chat request: {prompt, error, vars, think_open,
    think_close} (vars: Ollama's Template.Vars; the think tags: what Ollama infers)."""
    binary = _go_binary()
    if binary is None:
        raise GoTemplateError("the go tool is not installed (apt-get install golang-go)")
    done = subprocess.run(
        [binary], input=json.dumps(cases), capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def go_prompt(template: str, messages: list[dict], system: str | None = None, **extra) -> str:
    """One conversation through go_prompts; a template error raises GoTemplateError."""
    case = {"template": template, "messages": messages, "system": system or "", **extra}
    (out,) = go_prompts([case])
    if out["error"]:
        raise GoTemplateError(out["error"])
    return out["prompt"]
