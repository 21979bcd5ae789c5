"""LoRA's own autograd: y = x W^T + b + scale * (x A^T) B^T with the backward written out, in the
spirit of Unsloth's fast_lora.py (its LoRA_W; learnt from, not copied).

What autograd's own graph of LoRALinear.forward costs and this does not:
- the adapter's output scale * (x A^T) B^T is never a tensor of its own: it is accumulated into
  the base product's output by one addmm (no (tokens x out) delta, no scaling pass, no add);
- the backward's dx is the base's dy W with the adapter's d(xA) A added by addmm into it (no
  second (tokens x in) tensor and sum), and dy is never scaled over its full width: the scale
  goes on the rank-wide d(xA) and on dB;
- it saves x (which the CPU's Remake hooks make again from what the norm keeps) and the
  rank-wide x A^T only; the frozen W, A and B are parameters, held anyway.

Pure torch, so it runs (and is tested, tests/core/test_lora_autograd.py) on the CPU as on a GPU;
results equal the plain path's within rounding (the same products, summed in another order)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class LoRALinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, a, b, scale: float):
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        low = F.linear(rows.to(a.dtype), a)  # (N, r); under autocast in the compute type
        out = F.linear(rows, weight, bias)
        # The base output takes the adapter's product in place: a GEMM's epilogue adds it.
        out.addmm_(low.to(out.dtype), b.t().to(out.dtype), alpha=scale)
        ctx.save_for_backward(x, weight, a, b, low)
        ctx.scale = scale
        ctx.has_bias = bias is not None
        return out.view(*shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        x, weight, a, b, low = ctx.saved_tensors
        scale = ctx.scale
        need_x, need_w, need_bias, need_a, need_b = ctx.needs_input_grad[:5]
        dy = dy.reshape(-1, dy.shape[-1])
        rows = x.reshape(-1, x.shape[-1])
        t = dy.dtype
        d_low = torch.mm(dy, b.to(t)).mul_(scale)  # (N, r): the scale on the narrow side
        dx = dw = d_bias = da = db = None
        if need_x:
            dx = torch.mm(dy, weight.to(t))
            dx.addmm_(d_low, a.to(t))  # the adapter's share added into the base's
            dx = dx.view(x.shape).to(x.dtype)
        if need_w:  # a trained base (not LoRA's case): its plain gradient
            dw = torch.mm(dy.t(), rows.to(t)).to(weight.dtype)
        if need_bias and ctx.has_bias:
            d_bias = dy.sum(0).to(weight.dtype)
        if need_a:
            da = torch.mm(d_low.t(), rows.to(t)).to(a.dtype)
        if need_b:
            db = torch.mm(dy.t(), low.to(t)).mul_(scale).to(b.dtype)
        return dx, dw, d_bias, da, db, None


def lora_linear(x, weight, bias, a, b, scale: float):
    """x W^T + bias + scale * (x A^T) B^T, with LoRALinearFn's backward."""
    return LoRALinearFn.apply(x, weight, bias, a, b, scale)


def serves(layer) -> bool:
    """Whether a LoRALinear's forward can be this function: its adapters on, no dropout on
    the adapter's input (the function would need the dropped x kept too), a plain base
    (a bitsandbytes base keeps its own forward)."""
    return not layer.adapters_off and not layer.lora_dropout.p and layer.base_quantized is None
