"""The elementwise parts of a block with backward passes written out: autograd's own keep more
activations and make more passes over memory, which on a CPU costs as much as the matrix
products of a small model. Forwards compute exactly what the plain modules compute (the same
operations in the same order, so logits stay equal to transformers'); gradients equal the
plain ones within fp32 rounding (tests/core/test_fused.py)."""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F


class RMSNormFn(torch.autograd.Function):
    """weight * (x * rsqrt(mean(x^2) + eps)), normalised in fp32 as Llama's; keeps x and the
    per-position rsqrt only (autograd's keeps the fp32 copy, the normalised x and more)."""

    @staticmethod
    def forward(ctx, x, weight, eps: float):
        h = x.float()
        rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (h * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        n = x.float() * rstd
        d_weight = None
        if ctx.needs_input_grad[1]:
            d_weight = (dy * n.to(dy.dtype)).reshape(-1, n.shape[-1]).sum(0).to(weight.dtype)
        dn = (dy * weight).float()
        dx = (dn - n * (dn * n).mean(-1, keepdim=True)).mul_(rstd)
        return dx.to(x.dtype), d_weight, None


def rms_norm(x, weight, eps: float):
    return RMSNormFn.apply(x, weight, eps)


class SwiGLUFn(torch.autograd.Function):
    """silu(gate) * up of the fused gate/up output h = [gate | up]; keeps h only (autograd's
    keeps silu(gate) too) and writes both halves' gradients into one tensor (no cat)."""

    @staticmethod
    def forward(ctx, h):
        gate, up = h.chunk(2, dim=-1)
        ctx.save_for_backward(h)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, dy):
        (h,) = ctx.saved_tensors
        gate, up = h.chunk(2, dim=-1)
        dh = torch.empty_like(h)
        d_gate, d_up = dh.chunk(2, dim=-1)
        torch.mul(dy, F.silu(gate), out=d_up)
        torch.ops.aten.silu_backward.grad_input(dy * up, gate, grad_input=d_gate)
        return dh


def swiglu(h):
    return SwiGLUFn.apply(h)


class RopeFn(torch.autograd.Function):
    """x * cos + rotate_half(x) * sin in the half-split layout, with rotate_half's sign folded
    into a signed sin table (no negation, no concatenation); the forward's numbers are
    rotate()'s exactly. Saves only the tables: the
    backward is the same rotation by the opposite angle."""

    @staticmethod
    def forward(ctx, x, cos, sin_signed):
        ctx.save_for_backward(cos, sin_signed)
        return _rope(x, cos, sin_signed)

    @staticmethod
    def backward(ctx, dy):
        cos, sin_signed = ctx.saved_tensors
        # The transpose of y = x cos + swap(x) s is dx = dy cos + swap(dy s).
        return _rope_t(dy, cos, sin_signed), None, None


def _rope(x, cos, s):
    # Separate products and one sum, as rotate() computes them: the same bits (-a * b is
    # a * -b exactly), so a fine-tune's logits equal its base model's loaded plainly.
    half = x.shape[-1] // 2
    rotated = torch.empty_like(x)
    torch.mul(x[..., half:], s[..., :half], out=rotated[..., :half])
    torch.mul(x[..., :half], s[..., half:], out=rotated[..., half:])
    return (x * cos).add_(rotated)


def _rope_t(dy, cos, s):
    half = dy.shape[-1] // 2
    ds = dy * s
    dx = dy * cos
    dx[..., :half] += ds[..., half:]
    dx[..., half:] += ds[..., :half]
    return dx


def rope(x, cos, sin_signed):
    return RopeFn.apply(x, cos, sin_signed)


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin with rotate_half's minus sign on its first half: [-sin_a, sin_b]."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


class Remake:
    """Saved-tensor hooks that keep, for the tensors registered with it, how to make them
    again instead of the tensors: the LoRA adapters save their inputs (the norms' outputs,
    SwiGLU's output), which cheap elementwise work remakes from what the norm and SwiGLU keep
    anyway. The remade numbers are the forward's exactly (the same operations)."""

    def __init__(self):
        self.makers: dict[int, tuple] = {}

    def register(self, t: torch.Tensor, make) -> torch.Tensor:
        # Keyed by storage, as the adapters save a reshaped view; a weak reference, so a
        # freed tensor whose memory is reused never matches.
        self.makers[t.untyped_storage().data_ptr()] = (weakref.ref(t), t._version, make)
        return t

    def pack(self, t: torch.Tensor):
        entry = self.makers.get(t.untyped_storage().data_ptr())
        if entry is None or t.layout != torch.strided:
            return t
        source = entry[0]()
        if (
            source is not None
            and t._version == entry[1]  # views share the version counter
            and t.storage_offset() == source.storage_offset()
            and t.numel() == source.numel()
            and t.is_contiguous()
            and source.is_contiguous()
        ):
            return (entry[2], t.shape)
        return t

    @staticmethod
    def unpack(saved):
        if isinstance(saved, torch.Tensor):
            return saved
        make, shape = saved
        with torch.no_grad():
            return make().view(shape)

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
