"""Profiler ranges named after the model's parts, for core.training.memory_profile: every
block, attention and MLP call is a record_function range ("td:block", "td:attention",
"td:mlp"), recomputations included (a checkpointed block's, a tile's, a chunk's). Here, beside
the model, because nothing outside core/models hooks its modules."""

from __future__ import annotations

import contextlib

import torch

from core.models.model import MLP, Block, SelfAttention

LABEL = "td:"


@contextlib.contextmanager
def labelled(model):
    """While inside: record-function ranges around every block, attention and MLP call."""
    handles, patched = [], []
    kinds = ((Block, "block"), (SelfAttention, "attention"), (MLP, "mlp"))
    for m in model.modules():
        for cls, name in kinds:
            if isinstance(m, cls):
                handles += _range_hooks(m, LABEL + name)
        if isinstance(m, MLP):  # tiles call inner directly
            patched.append((m, "inner", m.inner))
            m.inner = _in_range(m.inner, LABEL + "mlp")
        if isinstance(m, SelfAttention):  # chunks call _scores directly
            patched.append((m, "_scores", m._scores))
            m._scores = _in_range(m._scores, LABEL + "attention")
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for m, name, _ in patched:
            delattr(m, name)


def _range_hooks(module, name: str):
    stack = []

    def enter(*_):
        rf = torch.autograd.profiler.record_function(name)
        rf.__enter__()
        stack.append(rf)

    def leave(*_):
        stack.pop().__exit__(None, None, None)

    return [
        module.register_forward_pre_hook(enter),
        module.register_forward_hook(leave, always_call=True),
    ]


def _in_range(fn, name: str):
    def run(*args, **kwargs):
        with torch.autograd.profiler.record_function(name):
            return fn(*args, **kwargs)

    return run
