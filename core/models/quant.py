"""A frozen base in 4 or 8 bits under LoRA (QLoRA): each adapted layer's base weight becomes a
bitsandbytes module (NF4 with double quantization, or int8), while the adapters, norms,
embeddings and head stay as they are. bitsandbytes runs 4-bit on the CPU too, so the same
path is tested everywhere; it is imported only when a run asks for it.

A mixture of experts' stacked experts, where most of its weights are, go to NF4 too in a
4-bit base (bitsandbytes' Linear4bit has no 3-D form): each expert's matrix is quantized
apart, and dequantized per expert at each use, outside the grouped product (NF4Experts)."""

from __future__ import annotations

import warnings

import torch
import torch.nn as nn

from core.errors import ConfigError
from core.models.lora import LoRALinear, moe_blocks
from core.models.moe import expert_matmul


def bitsandbytes():
    try:
        import bitsandbytes as bnb

        # Its one-token kernel has no autograd entry; its gradients are right all the same
        # (tests/integration/test_qlora.py compares them with the dequantized weight's).
        warnings.filterwarnings("ignore", message="bitsandbytes::gemv_4bit")
        # int8 on the CPU computes through fp16 inputs, and says so on every call.
        warnings.filterwarnings("ignore", message="MatMul8bitLt: inputs will be cast")
    except Exception as e:  # ImportError, or a broken native library
        raise ConfigError(
            "base_bits: a 4- or 8-bit base needs the bitsandbytes package, which could not be "
            f"loaded ({type(e).__name__}: {e}); pip install bitsandbytes, or use base_bits 16/32",
            field="base_bits",
        ) from None
    return bnb


def _quantized(m: LoRALinear, weight, bits: int, compute_dtype: torch.dtype, device) -> nn.Module:
    bnb = bitsandbytes()
    weight = weight.detach().to(torch.float16 if device.type != "cpu" else torch.float32)
    if bits == 4:
        q = bnb.nn.Linear4bit(
            m.in_features,
            m.out_features,
            bias=False,
            compute_dtype=compute_dtype,
            quant_type="nf4",
            compress_statistics=True,
        )
        # module=q: the layer keeps the quantization state too, and bitsandbytes gives it back
        # to a weight that lost it, as a sharded weight gathered by FSDP2 has (--shard).
        q.weight = bnb.nn.Params4bit(
            weight, requires_grad=False, quant_type="nf4", compress_statistics=True, module=q
        )
        # bitsandbytes repacks the weight for a bf16 CPU kernel the first time it runs in eval
        # mode: after an evaluation training would compute differently, and a resumed run
        # (no evaluation before its first step) would not match an uninterrupted one.
        q.support_avx512bf16_for_cpu = False
    else:
        q = bnb.nn.Linear8bitLt(m.in_features, m.out_features, bias=False, has_fp16_weights=False)
        q.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
    return q.to(device)  # bitsandbytes quantizes when the weight is moved


def quantize_base(model: nn.Module, bits: int, compute_dtype: torch.dtype, device) -> int:
    """Each LoRA layer's base weight in `bits` (4 or 8), layer by layer, so the full-precision
    copy of only one layer exists at a time; returns the bytes the quantized bases hold."""
    held = 0
    sources = getattr(model, "weight_sources", {})  # a memory-mapped model's joined weights
    for name, m in list(model.named_modules()):
        if not isinstance(m, LoRALinear):
            continue
        source = sources.pop(f"{name}.weight", None)
        weight = source() if source is not None else m.weight
        try:
            m.base_quantized = _quantized(m, weight, bits, compute_dtype, device)
        except ConfigError:
            raise
        except Exception as e:
            raise ConfigError(
                f"base_bits: bitsandbytes cannot hold layer {name} ({m.out_features} x "
                f"{m.in_features}) in {bits} bits: {type(e).__name__}: {e}",
                field="base_bits",
            ) from None
        del m.weight  # the full-precision base is gone: only the quantized copy remains
        m.register_parameter("weight", None)
        held += quantized_bytes(m.base_quantized)
    if bits == 4:
        held += quantize_experts(model, sources, device)
    return held


def quantize_experts(model: nn.Module, sources: dict, device) -> int:
    """Every MoE block's gate_up and down in NF4, one layer at a time; the bytes they hold."""
    held = 0
    names = {id(m): n for n, m in model.named_modules()}
    for m in moe_blocks(model):
        for leaf in ("gate_up", "down"):
            source = sources.pop(f"{names[id(m)]}.{leaf}", None)
            weight = source() if source is not None else getattr(m, leaf)
            setattr(m, f"{leaf}_nf4", NF4Experts(weight, device))
            delattr(m, leaf)
            m.register_parameter(leaf, None)
            held += getattr(m, f"{leaf}_nf4").nbytes()
    return held


class NF4Experts(nn.Module):
    """A stacked expert projection [E, out, in] in NF4 with double quantization, each
    expert's matrix quantized apart. Used by core.models.moe.MoE in place of the tensor."""

    def __init__(self, weight: torch.Tensor, device):
        super().__init__()
        bnb = bitsandbytes()
        half = torch.float16 if device.type != "cpu" else torch.float32  # as _quantized's
        self.packed, self.states = [], []
        for w in weight.detach():
            q, state = bnb.functional.quantize_4bit(
                w.to(device, half).contiguous(), quant_type="nf4", compress_statistics=True
            )
            self.packed.append(q)
            self.states.append(state)

    def weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The experts dequantized, [E, out, in]: a transient tensor, one layer's worth."""
        dequantize = bitsandbytes().functional.dequantize_4bit
        return torch.stack(
            [dequantize(q, s).to(dtype) for q, s in zip(self.packed, self.states, strict=True)]
        )

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return _Dequantized.apply(x, counts, self)

    def nbytes(self) -> int:
        total = 0
        for q, state in zip(self.packed, self.states, strict=True):
            total += q.numel() * q.element_size()
            # the NF4 code book is one constant shared by all: not counted per expert
            for t in (state.absmax, state.state2.absmax if state.nested else None):
                total += t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0
        return total


class _Dequantized(torch.autograd.Function):
    """The grouped product with dequantized experts, which are made again for the backward
    rather than kept: the frozen base's memory stays 4-bit between forward and backward."""

    @staticmethod
    def forward(ctx, x, counts, experts: NF4Experts):
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        ctx.experts, ctx.dtype = experts, x.dtype
        ctx.save_for_backward(counts)
        return expert_matmul(x, experts.weight(dtype), counts)

    @staticmethod
    def backward(ctx, grad):
        (counts,) = ctx.saved_tensors
        w = ctx.experts.weight(grad.dtype).transpose(1, 2)  # [E, in, out]: x = grad w
        return expert_matmul(grad, w, counts).to(ctx.dtype), None, None


def quantized_bytes(module: nn.Module) -> int:
    """Bytes a quantized layer holds: packed weights plus its quantization constants."""
    total = sum(p.numel() * p.element_size() for p in module.parameters())
    state = getattr(module.weight, "quant_state", None)
    if state is not None:
        for t in (
            state.absmax,
            getattr(state.state2, "absmax", None) if state.nested else None,
            state.code,
        ):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def dequantized_weight(m: LoRALinear) -> torch.Tensor:
    """The base weight as the quantized layer computes with it (fp32)."""
    bnb = bitsandbytes()
    q = m.base_quantized
    if hasattr(q.weight, "quant_state"):
        return bnb.functional.dequantize_4bit(q.weight.data, q.weight.quant_state).float()
    return (q.weight.data.float() * q.weight.SCB.float()[:, None] / 127.0).float()
