"""A training method is named in its own modules only: its declaration (core/config/methods/)
and its objective (core/training/sft.py, dpo.py, grpo.py, objectives.py, and GRPO's rewards).
Everywhere else code asks the registry (core.config.methods) what a method trains on, shows or
checks, and never compares or looks up a method by its name. Prose may name methods: help
text, messages, log lines, comments and docstrings are not code that decides anything."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMES = {"sft", "dpo", "grpo"}
# The method's own rooms, each with its reason.
EXEMPT = {
    "core/config/methods": "the declarations: each names its method once, the registry lists them",
    "core/training/objectives.py": "the objectives' interface, beside the runtimes",
    "core/training/sft.py": "SFT's runtime",
    "core/training/dpo.py": "DPO's runtime",
    "core/training/grpo.py": "GRPO's runtime (and TRL's loss_type 'grpo', a loss's name)",
    "core/training/rewards.py": "GRPO's rewards",
}
LOOKUPS = {"get", "pop", "setdefault", "index", "count"}  # dict.get("grpo"), tuple.index(...)


def _names_in(node: ast.AST) -> set[str]:
    """Method names among the string constants of node: itself, the items of a literal
    tuple, list or set (as in `method in ("dpo", "grpo")`), either side of `a if c else b`."""
    if isinstance(node, ast.IfExp):
        return _names_in(node.body) | _names_in(node.orelse)
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return {
        n.value for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str)
    } & NAMES


def decisions_by_name(source: str) -> list[tuple[int, str]]:
    """(line, name) of each place the code decides by a method's name: a comparison (==, !=,
    in, not in, is) with it, a dict key, a subscript, a lookup call's argument, a match case,
    a method set by name (method=..., x.method = ...), or a literal collection of names (a
    hand-written list of methods)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        parts: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            parts = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.Subscript):
            parts = [node.slice]
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in LOOKUPS:
                parts = list(node.args)
        elif isinstance(node, ast.MatchValue) or (
            isinstance(node, ast.keyword) and node.arg == "method"
        ):
            parts = [node.value]
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(ast.unparse(t).split(".")[-1] == "method" for t in targets):
                parts = [node.value]
        elif isinstance(node, ast.Tuple | ast.List | ast.Set) and len(_names_in(node)) > 1:
            parts = [node]
        for part in parts:
            found += [(node.lineno, name) for name in sorted(_names_in(part))]
    return found


def _exempt(path: Path) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    return any(rel == e or rel.startswith(e + "/") for e in EXEMPT)


def test_no_code_outside_the_methods_own_modules_decides_by_a_method_name():
    found = []
    for folder in ("core", "gui"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if _exempt(path):
                continue
            for line, name in decisions_by_name(path.read_text(encoding="utf-8")):
                found.append(f"{path.relative_to(ROOT).as_posix()}:{line} decides by {name!r}")
    assert found == []


def test_every_exemption_is_a_file_or_folder_that_exists():
    for rel in EXEMPT:
        assert (ROOT / rel).exists(), rel


def test_the_check_catches_each_way_of_naming_a_method():
    caught = decisions_by_name(
        "if cfg.method == 'grpo': pass\n"
        "x = {'dpo': 2}.get(cfg.method, 1)\n"
        "y = cfg.method in ('sft', 'dpo')\n"
        "z = table['grpo']\n"
        "w = rows.get('dpo')\n"
        "CHOICES = ('sft', 'dpo', 'grpo')\n"
        "match cfg.method:\n"
        "    case 'grpo':\n"
        "        pass\n"
        "if m != ('dpo' if pairs else 'sft'): pass\n"
        "cfg = replace(cfg, method='dpo')\n"
        "cfg.method = 'grpo'\n"
    )
    assert {line for line, _ in caught} == {1, 2, 3, 4, 5, 6, 8, 10, 11, 12}


def test_prose_may_name_methods():
    prose = (
        '"""GRPO samples; dpo tunes pairs."""\n'
        'log(f"grpo: {n} completions")\n'
        'raise DataError("method: dpo learns from pairs; train with --method dpo")\n'
        'help = "sft: learn the text"\n'
        "# grpo: the reward\n"
    )
    assert decisions_by_name(prose) == []
