"""Which tests compare floats, read from their source: what CI's second pass under other
kernels runs (`pytest --float-comparisons`, .ci/run). A rule no test can forget: a test is in
it because of what it does, not because someone marked it.

A test compares floats where it, or a function of the tests' own it calls (its module's, or
one it imports from tests/), compares with a tolerance or compares tensors: pytest.approx,
torch.testing.assert_close, allclose, isclose, torch.equal, a difference's .abs().max(), or
helpers.float32_rounding. Exact equality of two runs' records (a resume, determinism) holds on
any kernels by design, and a tolerance-free == between different computations is what the
project does not write (docs/architecture.md, Development)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from functools import cache
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CHECKS = {
    "approx",
    "assert_close",
    "allclose",
    "isclose",
    "equal",  # torch.equal
    "assert_allclose",
    "assert_array_almost_equal",
    "float32_rounding",
}


def compares_floats(function) -> bool:
    return _compares(function, frozenset())


def _compares(function, seen: frozenset) -> bool:
    tree = _tree(function)
    if tree is None:
        return False
    seen = seen | {function}
    scope = getattr(function, "__globals__", {})
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _called(node.func)
        if name in CHECKS or _abs_max(node):
            return True
        callee = scope.get(name) if isinstance(node.func, ast.Name) else None
        if _ours(callee) and callee not in seen and _compares(callee, seen):
            return True
    return False


@cache
def _tree(function):
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return None


def _called(func) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _abs_max(call: ast.Call) -> bool:
    """x.abs().max(): the largest difference of two float tensors."""
    f = call.func
    return (
        isinstance(f, ast.Attribute)
        and f.attr == "max"
        and isinstance(f.value, ast.Call)
        and _called(f.value.func) == "abs"
    )


def _ours(obj) -> bool:
    """A plain function defined in tests/ (a test module's helper, helpers.py's)."""
    if not inspect.isfunction(obj):
        return False
    try:
        return TESTS in Path(inspect.getfile(obj)).resolve().parents
    except TypeError:
        return False
