"""A frozen base in 4 or 8 bits under LoRA (QLoRA): each adapted layer's base weight becomes a
bitsandbytes module (NF4 with double quantization, or int8), while the adapters, norms,
embeddings and head stay as they are. bitsandbytes runs 4-bit on the CPU too, so the same
path is tested everywhere; it is imported only when a run asks for it."""

from __future__ import annotations

import warnings

import torch
import torch.nn as nn

from core.errors import ConfigError
from core.models.lora import LoRALinear


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
        q.weight = bnb.nn.Params4bit(
            weight, requires_grad=False, quant_type="nf4", compress_statistics=True
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
    return held


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
