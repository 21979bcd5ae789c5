"""One forward pass: outside core/models nothing reaches into the model's private parts (a
second copy of the forward drifts from the first, as GRPO's sampler did), nor hooks its
modules to take what its public forward does not return."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "core" / "models"
HOOKS = {"register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook"}


def private_names() -> set[str]:
    """Methods and attributes of core/models' classes that start with one underscore."""
    names = set()
    for path in MODELS.rglob("*.py"):
        for cls in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(cls, ast.ClassDef):
                continue
            for node in ast.walk(cls):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(node.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    names.add(node.attr)  # self._x = ...
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def reaches(path: Path, private: set[str]) -> list[str]:
    """Attribute uses of those names (not on self or cls) and module hooks in path."""
    found, name = [], path.relative_to(ROOT) if ROOT in path.parents else path
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Attribute):
            continue
        own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        if (node.attr in private and not own) or node.attr in HOOKS:
            found.append(f"{name}:{node.lineno}: .{node.attr}")
    return found


def test_no_module_outside_core_models_calls_the_models_private_parts():
    private = private_names()
    assert {"_qkv", "_attend", "_rope", "_embed", "_rope_cache"} <= private
    files = [
        p
        for folder in ("core", "gui", "benchmarks")
        for p in (ROOT / folder).rglob("*.py")
        if MODELS not in p.parents
    ]
    assert len(files) > 100
    found = [line for p in files for line in reaches(p, private)]
    assert not found, "\n".join(found)


def test_the_scan_finds_what_grpos_old_sampler_did(tmp_path):
    old = tmp_path / "old.py"
    old.write_text(
        "def f(model, block, x):\n"
        "    cos, sin = model._rope(0, 8, x.device)\n"
        "    q, k, v = block.attn._qkv(block.ln1(x), (cos, sin))\n"
        "    keep = model.ln_f.register_forward_hook(print)\n"
        "    return self._own\n"
    )
    lines = reaches(old, private_names())
    assert [line.split(": ")[-1] for line in lines] == [
        "._rope",
        "._qkv",
        ".register_forward_hook",
    ]
