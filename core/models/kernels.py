"""Kernel sets: which implementation of a model's norms, rotary positions, loss, LoRA layers and
packed attention a run uses, chosen once where its device is chosen (`choose`) and put on the
model once (`KernelSet.install`); the model's forward has no branch on the device.

- The CPU's set is the torch path exactly as the model has it (core.models.fused's hand-written
  backward passes, LinearCrossEntropy): `install` changes nothing, so the CPU's tuned speed
  stays where it is. LoRA's own autograd (core.models.lora_autograd) joins the CPU's set only
  where `CPU_FAST_LORA` says measurement found it faster.
- A CUDA GPU's set takes Liger Kernel's Triton kernels where Liger has the variant (RMSNorm with
  Gemma's 1 + w, RoPE over q and k, fused linear cross-entropy), LoRA's own autograd, and
  flex_attention with a block mask for packed rows. Liger is imported here, lazily: a machine
  without it (or without Triton) trains on the torch path, said in one log line.
- Kernels inside the blocks (norms, RoPE) are put in only where the blocks run eager: a compiled
  block's elementwise work is fused by Inductor itself, and Triton launches inside a compiled
  region would cut its graph. The final norm and the loss run outside the blocks: always.

docs/performance.md says which kernel comes from where and why."""

from __future__ import annotations

import types

import torch
import torch.nn as nn

from core.models.tiling import Segments

# Measured with benchmarks/finetune.py --vs-peft (docs/performance.md): whether the CPU's
# LoRA layers use the own autograd.
CPU_FAST_LORA = False
LIGER = "liger-kernel"  # the pip package


class KernelSet:
    """The torch path: what the model does by itself."""

    name = "torch"

    def __init__(self, fast_lora: bool = False):
        self.fast_lora = fast_lora

    def install(self, model: nn.Module, blocks_eager: bool = True) -> nn.Module:
        """Put this set's kernels on model's modules (in place), once, before training."""
        set_fast_lora(model, self.fast_lora)
        return model

    def describe(self) -> str:
        extra = ", LoRA's own autograd" if self.fast_lora else ""
        return f"kernels: torch{extra}"


class CudaKernels(KernelSet):
    """Liger's RMSNorm, RoPE and fused linear cross-entropy, LoRA's own autograd, and
    flex_attention for packed rows. liger: the imported modules (see _import_liger)."""

    name = "liger"

    def __init__(self, liger: types.SimpleNamespace, flex: bool = True):
        super().__init__(fast_lora=True)
        self.liger, self.flex = liger, flex
        self.parts: list[str] = []

    def install(self, model: nn.Module, blocks_eager: bool = True) -> nn.Module:
        from core.models.model import RMSNorm, SelfAttention  # the model imports nothing here

        set_fast_lora(model, True)
        parts = ["LoRA's own autograd"]
        blocks = getattr(model, "blocks", None)
        inside = set() if blocks is None else {id(m) for m in blocks.modules()}
        for m in model.modules():
            in_block = id(m) in inside
            if isinstance(m, RMSNorm) and (blocks_eager or not in_block):
                m.forward = types.MethodType(self._rms_norm_forward, m)
            if isinstance(m, SelfAttention):
                if blocks_eager:
                    m._rotate_pair = types.MethodType(self._rope_pair, m)
                if self.flex:  # compiled: eager flex_attention would make the T x T scores
                    m._attend = types.MethodType(flex_attend(m._attend, compiled=True), m)
        parts.append("RMSNorm (Liger)" if blocks_eager else "the final RMSNorm (Liger)")
        if blocks_eager:
            parts.append("RoPE (Liger)")
        if self.flex:
            parts.append("flex_attention for packed rows")
        head = getattr(model, "head", None)
        if isinstance(head, nn.Linear):
            head.linear_cross_entropy = self.linear_cross_entropy
            parts.append("fused linear cross-entropy (Liger)")
        self.parts = parts
        return model

    def describe(self) -> str:
        return "kernels: " + ", ".join(self.parts or ["Liger"])

    def _rms_norm_forward(self, norm, x):
        # Gemma's 1 + w: Liger's offset with its "gemma" casting (all in fp32, then cast);
        # Llama's: rstd in fp32, the normalised x cast back before the scale. in_place False:
        # dy is the residual stream's gradient too.
        casting = "gemma" if norm.offset else "llama"
        fn = self.liger.rms_norm_fn
        return fn.apply(x, norm.weight, norm.eps, float(norm.offset), casting, False)

    def _rope_pair(self, attn, q, k, cos, sin):
        """q and k rotated in one launch (Liger rotates the pair; k None: a layer that reuses
        another's keys rotates q alone on the torch path)."""
        if k is None:
            return attn._rotate(q, cos, sin), None
        return self.rope(q, k, cos, sin)

    def rope(self, q, k, cos, sin):
        """Liger's RoPE of q (B, H, T, hd) and k (B, Hkv, T, hd): cos and sin (T, rd) or
        (B, 1, T, rd) for per-row positions; rd < hd is partial rotary (the rest untouched)."""
        return self.liger.rope_fn.apply(q, k, cos, sin)

    def linear_cross_entropy(self, hidden, weight, targets, mask):
        """Mean cross-entropy of hidden @ weight^T over the positions whose mask is non-zero
        (every data source's mask is 0/1), by Liger's fused kernel: no logits kept, and no
        head gradient at all where the head is frozen (weight.requires_grad False). No
        position is gathered, so nothing reads the device."""
        hidden = hidden.reshape(-1, hidden.shape[-1])
        targets = targets.reshape(-1)
        if mask is None:
            return self.liger.lce(hidden, weight, targets, reduction="mean")
        keep = mask.reshape(-1) != 0
        targets = targets.masked_fill(~keep, -100)
        total = self.liger.lce(hidden, weight, targets, ignore_index=-100, reduction="sum")
        return total / keep.sum().clamp(min=1)


def set_fast_lora(model: nn.Module, on: bool) -> None:
    from core.models.lora import LoRALinear

    for m in model.modules():
        if isinstance(m, LoRALinear):
            m.fast = on


def flex_attend(plain, compiled: bool = False):
    """SelfAttention._attend with packed rows (a Segments mask) by flex_attention over a block
    mask made from the segment ids: no T x T mask, and blocks that cross examples are skipped.
    Everything else (no mask, soft-capped scores, sinks, dropout, a cache) goes to plain."""

    def attend(attn, q, k, v, causal: bool, mask=None, gate=None):
        packed_rows = isinstance(mask, Segments) and causal and k.shape[2] == q.shape[2]
        drop = attn.dropout if attn.training else 0.0
        if not packed_rows or attn.explicit or drop:
            return plain(q, k, v, causal, mask, gate)
        window = attn.window if attn.window is not None and q.shape[2] > attn.window else None
        y = packed_attention(q, k, v, mask, window, attn.scale, compiled)
        b, _, t, _ = y.shape
        y = y.transpose(1, 2).reshape(b, t, attn.n_heads * attn.hd)
        return attn.proj(y if gate is None else y * torch.sigmoid(gate))

    return attend


def packed_attention(q, k, v, segments: Segments, window, scale=None, compiled: bool = False):
    """Causal attention within each packed example (and within the window, where given), by
    flex_attention (compiled: its fused kernel; inside a compiled block it is inlined); k and
    v may have fewer heads (grouped-query)."""
    flex_attention = _flex(compiled)
    block_mask = segment_block_mask(segments, q.shape[2], window, q.device)
    gqa = k.shape[1] != q.shape[1]
    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa)


_COMPILED_FLEX: list = []


def _flex(compiled: bool):
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    if not _COMPILED_FLEX:
        _COMPILED_FLEX.append(torch.compile(flex_attention, dynamic=False))
    return _COMPILED_FLEX[0]


@torch.compiler.disable
def segment_block_mask(segments: Segments, t: int, window: int | None, device):
    """The block mask of packed examples (B, T) ids: a query sees the earlier keys of its
    own example. Made once a forward per window, on the Segments every layer shares."""
    from torch.nn.attention.flex_attention import create_block_mask

    cache = segments.__dict__.setdefault("block_masks", {})
    if window in cache:
        return cache[window]
    ids = segments.ids

    def same_example(b, h, q_idx, kv_idx):
        seen = (ids[b, q_idx] == ids[b, kv_idx]) & (q_idx >= kv_idx)
        return seen if window is None else seen & (q_idx - kv_idx < window)

    cache[window] = create_block_mask(same_example, ids.shape[0], None, t, t, device=device)
    return cache[window]


def _import_liger() -> types.SimpleNamespace:
    """Liger's functions this set uses; ImportError where Liger or Triton is missing."""
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.ops.rope import LigerRopeFunction
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    return types.SimpleNamespace(
        rms_norm_fn=LigerRMSNormFunction,
        rope_fn=LigerRopeFunction,
        lce=liger_fused_linear_cross_entropy,
    )


def choose(device: torch.device, log=None, importer=_import_liger) -> KernelSet:
    """The kernel set for device: the torch path on the CPU (and any device but CUDA); on a
    CUDA GPU Liger's where it imports, else the torch path with LoRA's own autograd and one
    log line naming the package."""
    if device.type != "cuda":
        return KernelSet(fast_lora=CPU_FAST_LORA)
    try:
        liger = importer()
    except Exception as e:  # ImportError, or a Triton that imports but is broken
        if log is not None:
            log(
                f"kernels: Liger Kernel does not import ({type(e).__name__}: {e}); the torch "
                f"path runs (pip install {LIGER} for its fused kernels)"
            )
        return KernelSet(fast_lora=True)
    return CudaKernels(liger)
