"""Liger's kernels that Triton's interpreter runs on CPU tensors (TRITON_INTERPRET=1): the fused
linear cross-entropy and RoPE, forward and backward, against the torch path. Skipped where
Triton and Liger do not import (the test extra leaves Triton out: 285 MB). Liger's RMSNorm,
SwiGLU and GeGLU do not run in the interpreter; their selection is tested with fakes
(tests/core/test_kernels.py) and their equality recorded by the GPU check."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

if importlib.util.find_spec("liger_kernel") is None or importlib.util.find_spec("triton") is None:
    pytest.skip("Triton and Liger Kernel are not installed", allow_module_level=True)
if not torch.cuda.is_available():  # read when Liger's kernels are defined: set before import
    os.environ["TRITON_INTERPRET"] = "1"

from core.models import kernels  # noqa: E402
from core.models.loss import lm_loss  # noqa: E402
from core.models.model import rotate  # noqa: E402

try:
    LIGER = kernels.CudaKernels(kernels._import_liger())
except Exception as e:  # a Triton that imports but is broken
    pytest.skip(f"Liger Kernel does not import: {e}", allow_module_level=True)


def torch_rope(x, cos, sin, rd):
    return torch.cat((rotate(x[..., :rd], cos, sin), x[..., rd:]), dim=-1)


@pytest.mark.parametrize("rd", [16, 8])  # all of a 16-wide head, and partial rotary
@pytest.mark.parametrize("per_row", [False, True])  # packed rows: each row its own positions
def test_rope_equals_the_torch_path_forward_and_backward(rd, per_row):
    torch.manual_seed(0)
    b, t, hd = 2, 6, 16
    q = torch.randn(b, 4, t, hd, requires_grad=True)
    k = torch.randn(b, 2, t, hd, requires_grad=True)
    inv = 1.0 / (10000 ** (torch.arange(0, rd, 2).float() / rd))
    positions = torch.tensor([[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 4, 5]])
    angles = positions[..., None].float() * inv if per_row else torch.arange(t)[:, None] * inv
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if per_row:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, rd), as the model's packed rows
    gq, gk = torch.randn(b, 4, t, hd), torch.randn(b, 2, t, hd)
    want = (torch_rope(q, cos, sin, rd), torch_rope(k, cos, sin, rd))
    want_grads = torch.autograd.grad((want[0] * gq).sum() + (want[1] * gk).sum(), (q, k))
    got = LIGER.rope(q.clone(), k.clone(), cos, sin)
    got_grads = torch.autograd.grad((got[0] * gq).sum() + (got[1] * gk).sum(), (q, k))
    for a, w in zip((*got, *got_grads), (*want, *want_grads), strict=True):
        torch.testing.assert_close(a, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("frozen", [False, True])
def test_the_fused_loss_equals_the_torch_path_and_a_frozen_head_gets_no_gradient(frozen):
    torch.manual_seed(1)
    head = torch.nn.Linear(16, 50, bias=False).requires_grad_(not frozen)
    hidden = torch.randn(2, 9, 16, requires_grad=True)
    targets = torch.randint(0, 50, (2, 9))
    mask = (torch.rand(2, 9) > 0.3).float()
    want = lm_loss(head, hidden, targets, mask)
    want_grads = torch.autograd.grad(want, [hidden] + ([] if frozen else [head.weight]))
    head.linear_cross_entropy = LIGER.linear_cross_entropy
    got = lm_loss(head, hidden, targets, mask)
    got.backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(hidden.grad, want_grads[0], rtol=1e-4, atol=1e-6)
    if frozen:
        assert head.weight.grad is None
    else:
        torch.testing.assert_close(head.weight.grad, want_grads[1], rtol=1e-4, atol=1e-6)
