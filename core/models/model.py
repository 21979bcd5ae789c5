"""A decoder-only transformer, in the spirit of nanoGPT's model.py, with the options that
GPT-2, the Llama family (Llama 2/3, SmolLM, TinyLlama, Mistral, Qwen2/2.5, Qwen3), Gemma 2/3,
Phi-3/Phi-4-mini and SmolLM3 need: LayerNorm or RMSNorm (with Gemma's 1 + w), learned or
rotary positions (linear, llama3, yarn and longrope scaling, partial rotary, local and global
bases, layers without positions), GELU, SwiGLU or GeGLU MLP, grouped-query attention, a head
size and attention scale of their own, q/k/v biases, q/k norms, post-norms, sliding-window
layers, soft-capped attention scores and logits, attention sinks (gpt-oss), scaled embeddings,
tied or separate head; and Gemma 4's per-layer options (core.models.per_layer: per-layer input
embeddings, full-attention layers' own head size, shared keys and values, k_eq_v).

The defaults are TrainDeck's own GPT-2-style model. A family is a set of these options plus a
weight-name table (core.weights.families), not a class of its own. q, k and v live in one fused
Linear (and SwiGLU's gate and up in another): one matrix product each, split on the way out.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from core.config.spec import TrainConfig, from_known
from core.models.cache import KVCache, masks_for, row_positions
from core.models.deltanet import GatedDeltaNet, in_sizes, state_bytes
from core.models.fused import Remake, rms_norm, signed_sin, swiglu
from core.models.fused import rope as fused_rope
from core.models.loss import lm_loss
from core.models.moe import LoadMeter, MoE, aux_loss, is_sparse, records
from core.models.offload import offloads, run_blocks, streams_for
from core.models.per_layer import (
    PerLayer,
    PerLayerGate,
    PerLayerInputs,
    Side,
    attn_sizes,
    folded,
    from_saved,
    kv_source,
    kv_sources,
    layer_shape,
    unit_rms,
)
from core.models.per_layer import of as per_layer_of
from core.models.tiling import (
    ATTN_CHUNK_QUERIES,
    MLP_TILE_TOKENS,
    Segments,
    chunked_causal,
    tiled,
    tiles,
)
from core.models.vision import both_ways, text_ids


def window_of(block) -> int | None:
    """A block's attention window (None: full attention)."""
    return block.attn.window


VOCAB_SIZE = 256  # bytes: no tokenizer to download
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope")
MLPS = ("gelu", "gelu_tanh", "swiglu", "geglu")
GATED = ("swiglu", "geglu")  # gate and up in one fused Linear
SLIDING = "sliding_attention"  # a layer type (config.json's names), the other "full_attention"
LINEAR = "linear_attention"  # Qwen3.5's Gated DeltaNet layers (core.models.deltanet)
LAYER_TYPES = ("full_attention", SLIDING, LINEAR)


# A new model with arch llama: Llama's choices, as SmolLM2 makes them (tied embeddings).
LLAMA_OPTIONS = {
    "bias": False,
    "norm": "rmsnorm",
    "norm_eps": 1e-6,
    "positions": "rope",
    "mlp": "swiglu",
}


def swiglu_width(hidden_dim: int) -> int:
    """SwiGLU's inner width: 8/3 of the model's, so its three matrices hold as many weights
    as GELU's two at 4x; rounded up to a multiple of 32 for fast matrix products."""
    return -(-8 * hidden_dim // 3 // 32) * 32


@dataclass(kw_only=True)
class GPTConfig:
    """The network's shape. A new model's defaults and ranges live in core.config.spec.TrainConfig
    (build it with `from_train`); a pretrained model's come from its config.json."""

    hidden_dim: int
    n_layers: int
    n_heads: int
    seq_len: int  # the longest sequence the model takes (learned positions: their count)
    dropout: float = 0.0
    vocab_size: int = VOCAB_SIZE
    grad_checkpointing: bool = False
    checkpoint_blocks: int | None = None  # with grad_checkpointing: the first k (None: all)
    offload_checkpoints: bool = False  # CUDA: checkpointed inputs wait in pinned RAM
    bias: bool = True  # the default for every bias below that is not set
    n_kv_heads: int | None = None  # grouped-query attention; None: n_heads
    head_dim: int | None = None  # None: hidden_dim // n_heads
    ffn_dim: int | None = None  # None: 4 * hidden_dim
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    positions: str = "learned"
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "llama3"|"linear", ...} as in config.json
    mlp: str = "gelu"
    qkv_bias: bool | None = None
    out_bias: bool | None = None  # attention output projection
    mlp_bias: bool | None = None
    qk_norm: bool = False  # RMSNorm over each head of q and k (Qwen3)
    qk_norm_whole: bool = False  # with qk_norm: over all of q's and k's heads at once (OLMoE)
    qkv_clip: float | None = None  # OLMoE's clip_qkv: q, k and v clamped to +-clip
    tie_embeddings: bool = True
    # Options of the newer families; each default leaves the model as it was.
    norm_offset: float = 0.0  # Gemma: RMSNorm scales by (1 + weight), in fp32
    post_norms: bool = False  # Gemma 2/3: a norm on each sub-layer's output before the add
    embed_scale: float | None = None  # Gemma: embeddings times sqrt(hidden_dim)
    attn_scale: float | None = None  # None: 1/sqrt(head_dim); Gemma: query_pre_attn_scalar**-0.5
    attn_softcap: float | None = None  # Gemma 2: scores -> cap * tanh(scores / cap)
    logit_softcap: float | None = None  # Gemma 2: the same on the output logits
    sliding_window: int | None = None  # keys a sliding layer sees, its own included
    layer_types: list | None = None  # per layer: one of LAYER_TYPES
    rope_local_theta: float | None = None  # Gemma 3: sliding layers' base, without scaling
    rope_dim: int | None = None  # rotary dimensions of a head (partial rotary); None: all
    nope_layers: list | None = None  # SmolLM3: layers without rotary positions
    attn_sinks: bool = False  # gpt-oss: a learned logit per head joins each softmax's sum
    attn_output_gate: bool = False  # Qwen3.5: q_proj twice as wide, sigmoid(gate) * output
    # Qwen3.5: the Gated DeltaNet's shape on "linear_attention" layers (deltanet.KEYS)
    linear_attn: dict | None = None
    # Mixture of experts (core.models.moe: its keys and defaults); None: dense.
    moe: dict | None = None
    # Hand-written backward passes and the fused loss (core.models.fused, LinearCrossEntropy):
    # equal within fp32 rounding, not bit for bit, so a fine-tune (from_train with a base)
    # uses them and a new model keeps the plain ops its older runs resume with exactly.
    fused: bool = False
    # Gemma 4's per-layer options (core.models.per_layer.PerLayer); None: none of them.
    per_layer: PerLayer | None = None

    def __post_init__(self):
        self.per_layer = from_saved(self.per_layer)  # a saved config holds it as a dict
        self.n_kv_heads = self.n_kv_heads or self.n_heads
        self.head_dim = self.head_dim or self.hidden_dim // self.n_heads
        self.ffn_dim = self.ffn_dim or 4 * self.hidden_dim
        for name in ("qkv_bias", "out_bias", "mlp_bias"):
            if getattr(self, name) is None:
                setattr(self, name, self.bias)

    @classmethod
    def from_train(
        cls, cfg: TrainConfig, training: bool = True, base: GPTConfig | None = None
    ) -> GPTConfig:
        """For training, or (training=False) for inference: no dropout or checkpointing.
        base: a pretrained model's shape, which the config only adds run settings to."""
        run = {
            "dropout": cfg.dropout if training else 0.0,
            "grad_checkpointing": cfg.grad_checkpointing and training,
            "checkpoint_blocks": cfg.checkpoint_blocks if training else None,
            "offload_checkpoints": cfg.offload_checkpoints and training,
        }
        if base is not None:
            moe = base.moe
            if moe and cfg.router_aux_loss is not None:
                moe = {**moe, "aux_coef": cfg.router_aux_loss}
            return dataclasses.replace(base, **run, moe=moe, fused=True)
        shape = {
            "hidden_dim": cfg.hidden_dim,
            "n_layers": cfg.n_layers,
            "n_heads": cfg.n_heads,
            "seq_len": cfg.seq_len,
            "vocab_size": cfg.model_vocab,
        }
        if cfg.arch == "llama":
            return cls(
                **shape,
                **LLAMA_OPTIONS,
                **run,
                ffn_dim=cfg.ffn_dim or swiglu_width(cfg.hidden_dim),
                n_kv_heads=cfg.n_kv_heads,
                qk_norm=cfg.qk_norm,
            )
        return cls(**shape, bias=cfg.bias, ffn_dim=cfg.ffn_dim, **run)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> GPTConfig:
        return from_known(cls, folded(d))  # older runs: Gemma 4's options as flat fields


class RMSNorm(nn.Module):
    """As Llama's: normalise in fp32, scale in the input's type."""

    def __init__(self, dim: int, eps: float, fused: bool = False, offset: float = 0.0):
        super().__init__()
        self.eps, self.fused, self.offset = eps, fused, offset
        self.weight = nn.Parameter(torch.full((dim,), 1.0 - offset))

    def forward(self, x):
        if self.offset:  # Gemma's: scaled by (1 + weight) in fp32, then cast
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return (h * (self.offset + self.weight.float())).to(x.dtype)
        if self.fused:
            return rms_norm(x, self.weight, self.eps)  # the same forward, fewer saved tensors
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def layer_types_problem(c: GPTConfig) -> str | None:
    """Why c's layer_types cannot be built (one line), or None."""
    types = list(c.layer_types or ())
    if types and len(types) != c.n_layers:
        return f"layer_types: {len(types)} entries for {c.n_layers} layers"
    for i, kind in enumerate(types):
        if kind not in LAYER_TYPES:
            return f"layer_types[{i}]: {kind!r} is not built; allowed: {', '.join(LAYER_TYPES)}"
        if kind == LINEAR and not c.linear_attn:
            return f"layer_types[{i}]: linear_attention needs the linear_attn options"
    return None


def make_norm(c: GPTConfig, dim: int | None = None) -> nn.Module:
    if c.norm == "rmsnorm":
        return RMSNorm(dim or c.hidden_dim, c.norm_eps, c.fused, c.norm_offset)
    return nn.LayerNorm(dim or c.hidden_dim, eps=c.norm_eps, bias=c.bias)


def rope_kind(c: GPTConfig) -> str:
    s = c.rope_scaling or {}
    return s.get("rope_type", s.get("type", "default"))


def rope_frequencies(c: GPTConfig, long: bool = False) -> torch.Tensor:
    """Inverse frequencies of rotary positions, with linear, Llama 3's, YaRN or LongRoPE
    scaling (long: LongRoPE's long factors, for sequences past its original context)."""
    d = c.rope_dim or c.head_dim
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = c.rope_scaling or {}
    kind = rope_kind(c)
    if kind == "proportional":  # Gemma 4: the first angles of each half turn, the rest not
        turning = int(s["partial_rotary_factor"] * d // 2)
        inv = torch.cat((inv[:turning], torch.zeros(d // 2 - turning)))
        return inv / s.get("factor", 1.0)
    if kind == "linear":
        return inv / s["factor"]
    if kind == "longrope":
        factors = torch.tensor(s["long_factor" if long else "short_factor"], dtype=torch.float32)
        shape = torch.arange(0, d, 2, dtype=torch.int64).float() / d
        return 1.0 / (factors * c.rope_theta**shape)
    if kind == "yarn":
        return _yarn(c, d, s)
    if kind == "llama3":
        factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old = s["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        return torch.where(medium, smoothed, scaled)
    return inv


def _yarn(c: GPTConfig, d: int, s: dict) -> torch.Tensor:
    """YaRN's frequencies, as transformers' _compute_yarn_parameters makes them."""
    base, factor = c.rope_theta, s["factor"]
    old = s.get("original_max_position_embeddings") or c.seq_len

    def dim_of(rotations):
        return (d * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = dim_of(s.get("beta_fast") or 32), dim_of(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos = base ** (torch.arange(0, d, 2).float() / d)
    extrapolate = 1 - ramp
    return (1.0 / (factor * pos)) * (1 - extrapolate) + (1.0 / pos) * extrapolate


def rope_attention_factor(c: GPTConfig) -> float:
    """What YaRN and LongRoPE multiply cos and sin by (1.0 for the other kinds)."""
    s, kind = c.rope_scaling or {}, rope_kind(c)
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])
    if kind == "yarn":

        def m(scale, k=1.0):
            return 1.0 if scale <= 1 else 0.1 * k * math.log(scale) + 1.0

        if s.get("mscale") and s.get("mscale_all_dim"):
            return m(s["factor"], s["mscale"]) / m(s["factor"], s["mscale_all_dim"])
        return m(s["factor"])
    if kind == "longrope":
        old = s["original_max_position_embeddings"]
        factor = s.get("factor") or c.seq_len / old
        return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(old))
    return 1.0


def rotate(x, cos, sin):
    """Rotary embedding in the half-split layout that Hugging Face checkpoints use."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class SelfAttention(nn.Module):
    def __init__(self, c: GPTConfig, layer: int = 0):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = c.n_heads, c.n_kv_heads, c.head_dim
        self.sizes = attn_sizes(c, layer)  # q alone, or q and k, where k and v come otherwise
        self.layer, self.source = layer, kv_source(c, layer)
        self.stores = layer in kv_sources(c)  # later layers reuse its keys and values
        self.v_norm, self.eps = per_layer_of(c).v_norm, c.norm_eps
        self.gated = c.attn_output_gate
        self.qkv = nn.Linear(c.hidden_dim, sum(self.sizes), bias=c.qkv_bias)
        self.proj = nn.Linear(c.n_heads * c.head_dim, c.hidden_dim, bias=c.out_bias)
        if c.qk_norm:
            q_dim, k_dim = self.sizes[:2] if c.qk_norm_whole else (c.head_dim, c.head_dim)
            self.q_norm = RMSNorm(q_dim, c.norm_eps, c.fused, c.norm_offset)
            if self.source is None:  # a layer reusing another's keys has no k_norm
                self.k_norm = RMSNorm(k_dim, c.norm_eps, c.fused, c.norm_offset)
        self.qk_norm, self.fused = c.qk_norm, c.fused
        self.norm_whole, self.clip = c.qk_norm and c.qk_norm_whole, c.qkv_clip
        self.dropout = c.dropout
        self.resid_drop = nn.Dropout(c.dropout)
        sliding = bool(c.layer_types) and c.layer_types[layer] == SLIDING
        self.window = c.sliding_window if sliding else None
        self.local_rope = sliding and c.rope_local_theta is not None  # Gemma 3's local base
        self.use_rope = layer not in (c.nope_layers or ())
        self.rope_dim = c.rope_dim if c.rope_dim and c.rope_dim < c.head_dim else None
        self.scale, self.softcap = c.attn_scale, c.attn_softcap
        # gpt-oss: set by its weights; zero adds exp(0) to each sum
        self.sinks = nn.Parameter(torch.zeros(c.n_heads)) if c.attn_sinks else None
        self.explicit = bool(c.attn_softcap or c.attn_sinks)  # scores SDPA cannot make

    def _qkv(self, x, rope):
        """q, k and v (B, heads, T, head); k and v None on a layer that reuses another's."""
        b, t, _ = x.shape
        q, *kv = self.qkv(x).split(self.sizes, dim=2)
        k, v = (kv[0], kv[-1]) if kv else (None, None)  # k_eq_v: the values are k's output
        gate = None
        if self.gated:  # each head's q, then its gate (Qwen3.5's q_proj)
            q, gate = q.view(b, t, self.n_heads, 2 * self.hd).chunk(2, dim=-1)
            q, gate = q.reshape(b, t, -1), gate.reshape(b, t, -1)
        if self.norm_whole:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.clip is not None:
            q, k, v = (t.clamp(-self.clip, self.clip) for t in (q, k, v))
        q = q.view(b, t, self.n_heads, self.hd).transpose(1, 2)
        if k is not None:
            k = k.view(b, t, self.n_kv, self.hd).transpose(1, 2)
            v = v.view(b, t, self.n_kv, self.hd).transpose(1, 2)
            if self.fused and torch.is_grad_enabled():
                # SDPA keeps v for backward: a view would keep all of qkv's output alive, the
                # q and k parts of which RoPE has already copied.
                v = v.contiguous()
        if self.qk_norm and not self.norm_whole:
            q = self.q_norm(q)
            k = k if k is None else self.k_norm(k)
        if self.v_norm and v is not None:
            v = unit_rms(v, self.eps)
        if rope is not None and self.use_rope:
            rope = rope[2:] if self.local_rope else rope[:2]
            cos, sin = (r.to(q.dtype) for r in rope)
            q, k = self._rotate_pair(q, k, cos, sin)
        return q, k, v, gate

    def _rotate_pair(self, q, k, cos, sin):
        """q and k rotated (k None: a layer that reuses another's keys); a GPU's kernel set
        (core.models.kernels) puts its own in, which rotates both in one launch."""
        return self._rotate(q, cos, sin), None if k is None else self._rotate(k, cos, sin)

    def _rotate(self, x, cos, sin):
        if self.rope_dim:  # partial rotary: the first rope_dim dimensions turn
            d = self.rope_dim
            return torch.cat((rotate(x[..., :d], cos, sin), x[..., d:]), dim=-1)
        if self.fused:
            return fused_rope(x, cos, signed_sin(sin))
        return rotate(x, cos, sin)

    def _shared(self, k, v, side):
        """k and v, or the earlier layer's that this one reuses; kept for later layers."""
        if self.source is not None:
            return side.kv[self.source]
        if self.stores:
            side.kv[self.layer] = (k, v)
        return k, v

    def _attend(self, q, k, v, causal: bool, mask=None, gate=None):
        gqa = self.n_kv != self.n_heads
        if gqa and (not self.fused or self.explicit):  # each k/v head serves several q heads
            k = k.repeat_interleave(self.n_heads // self.n_kv, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        drop = self.dropout if self.training else 0.0
        t = q.shape[2]
        window = self.window if causal and self.window is not None and t > self.window else None
        if causal and getattr(mask, "bidirectional", False):  # images (core.models.vision)
            y = self._scores(q, k, v, False, mask.whole(t, window, q.device), drop, gqa)
        elif causal and k.shape[2] == t and self._holds_scores(mask, window, drop, q.device):
            y = chunked_causal(
                lambda q, k, v, m: self._scores(q, k, v, False, m, drop, gqa),
                q,
                k,
                v,
                ATTN_CHUNK_QUERIES,
                window,
                mask,
            )
        else:
            if window is not None:
                mask = window_mask(t, window, q.device, mask)
            y = self._scores(q, k, v, causal and mask is None, mask, drop, gqa)
        b, _, t, _ = y.shape
        y = y.transpose(1, 2).reshape(b, t, self.n_heads * self.hd)
        return self.proj(y if gate is None else y * torch.sigmoid(gate))

    def _holds_scores(self, mask, window, drop: float, device) -> bool:
        """Whether attention would hold T x T numbers, and so runs in chunks of queries:
        explicit attention (soft-capped scores, sinks) always; SDPA with a mask (packed
        examples, a sliding window: the mask itself is T x T, and the CPU's kernel turns it
        into T x T floats) or with dropout on the CPU (its math kernel). Causal SDPA without
        them runs a flash kernel: O(T) memory."""
        if self.explicit or mask is not None or window is not None:
            return True
        return drop > 0 and device.type == "cpu"

    def _scores(self, q, k, v, causal: bool, mask, drop: float, gqa: bool):
        if self.explicit:  # soft-capped scores, or gpt-oss's sinks: a row's softmax at a time
            return explicit_attention(
                q, k, v, causal, mask, self.scale, self.softcap, self.sinks, drop
            )
        # SDPA picks the flash / memory-efficient kernel on CUDA; with packed examples the
        # mask (causal within each example) takes the place of is_causal. Grouped-query:
        # fused, SDPA serves each k/v head to its q heads (no repeated k and v).
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=drop,
            is_causal=causal,
            enable_gqa=gqa and self.fused,
            scale=self.scale,
        )

    def forward(self, x, rope=None, mask=None, side: Side | None = None):
        q, k, v, gate = self._qkv(x, rope)
        k, v = self._shared(k, v, side)
        return self.resid_drop(self._attend(q, k, v, causal=True, mask=mask, gate=gate))

    def cached(self, x, past, rope=None, mask=None, side: Side | None = None):
        """forward() for generation: attends to past (k, v) too; returns (y, new (k, v)).
        mask (B, 1, T, K): the keys each query sees (core.models.cache.masks_for); None:
        causal without a past, every key with one. A layer that reuses another's keys and
        values keeps that layer's (the same tensors, no copy)."""
        q, k, v, gate = self._qkv(x, rope)
        if past is not None and self.source is None:
            k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
        k, v = self._shared(k, v, side)
        return self._attend(q, k, v, causal=past is None and mask is None, mask=mask, gate=gate), (
            k,
            v,
        )


def fused_sizes(c: GPTConfig, layer: int) -> list[int]:
    """The parts of layer's fused input Linear (blocks.{layer}.attn.qkv): attention's q, k,
    v or a DeltaNet's q k v, z, b, a."""
    if is_linear(c, layer):
        return in_sizes(c.linear_attn)
    return list(attn_sizes(layer_shape(c, layer), layer))


def is_linear(c: GPTConfig, layer: int) -> bool:
    return bool(c.layer_types) and c.layer_types[layer] == LINEAR


def linear_layers(c: GPTConfig) -> int:
    """How many of c's layers are linear attention (Gated DeltaNet)."""
    return list(c.layer_types or ()).count(LINEAR)


def cache_width(c: GPTConfig) -> int:
    """Numbers a token keeps in the KV cache over all layers, keys and values: a layer that
    reuses another's keys and values keeps none of its own, a DeltaNet layer a state instead."""
    total = 0
    for i in range(c.n_layers):
        if kv_source(c, i) is None and not is_linear(c, i):
            s = layer_shape(c, i)
            total += 2 * s.n_kv_heads * s.head_dim
    return total


def cache_bytes(c: GPTConfig, rows: int, tokens: int, act_bytes: int) -> int:
    """What forward_cached holds for rows of tokens: the attention layers' keys and values,
    a DeltaNet layer's states (whatever the length)."""
    linear = linear_layers(c)
    kv = rows * tokens * cache_width(c) * act_bytes  # Gemma 4's shared layers: none
    return kv + (linear * rows * state_bytes(c.linear_attn, act_bytes) if linear else 0)


def window_mask(t: int, window: int, device, mask=None) -> torch.Tensor:
    """Causal attention to the window's last keys (the query's own included), within mask
    (packed examples) where one is given: (T, T) or mask's shape."""
    i = torch.arange(t, device=device)
    near = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < window)
    return near if mask is None else mask & near


def explicit_attention(q, k, v, causal: bool, mask, scale, cap, sinks, drop: float):
    """Attention with the scores made here, for what SDPA cannot do: Gemma 2's soft-capped
    scores (cap * tanh(scores / cap)) and gpt-oss's sinks, a logit per head (sinks (H,)) that
    joins the softmax and is then dropped, so a head may give its keys less than all."""
    scores = (q @ k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if cap:
        scores = torch.tanh(scores / cap) * cap
    if causal:
        t, s = q.shape[2], k.shape[2]
        mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        weights = F.softmax(scores, dim=-1, dtype=torch.float32)
    else:
        b, h, t, _ = scores.shape
        sink = sinks.to(scores.dtype).view(1, h, 1, 1).expand(b, h, t, 1)
        weights = F.softmax(torch.cat((scores, sink), dim=-1), dim=-1, dtype=torch.float32)
        weights = weights[..., :-1]
    return F.dropout(weights.to(q.dtype), drop) @ v


class MLP(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.kind, self.fused = c.mlp, c.fused
        width = 2 * c.ffn_dim if c.mlp in GATED else c.ffn_dim  # gate and up, fused
        self.fc = nn.Linear(c.hidden_dim, width, bias=c.mlp_bias)
        self.proj = nn.Linear(c.ffn_dim, c.hidden_dim, bias=c.mlp_bias)
        self.drop = nn.Dropout(c.dropout)
        self.tile = MLP_TILE_TOKENS  # tokens a tile (core.models.tiling); 0: never tiled

    def forward(self, x, remake: Remake | None = None):
        if tiles(x, self.tile):  # each tile kept as its input only, made again in backward
            return self.drop(tiled(self.inner, x, self.tile))
        return self.drop(self.inner(x, remake))

    def inner(self, x, remake: Remake | None = None):
        """proj(act(fc(x))), token by token: what tiling runs over tiles."""
        h = self.fc(x)
        if self.kind == "swiglu" and self.fused:
            gate_up = h
            h = swiglu(gate_up)  # silu(gate) * up, keeping only h for the backward pass
            if remake is not None:
                remake.register(h, lambda: swiglu(gate_up))
        elif self.kind == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        elif self.kind == "geglu":  # Gemma: GELU's tanh form on the gate
            gate, up = h.chunk(2, dim=-1)
            h = F.gelu(gate, approximate="tanh") * up
        else:
            h = F.gelu(h, approximate="tanh" if self.kind == "gelu_tanh" else "none")
        return self.proj(h)


class Block(nn.Module):
    def __init__(self, c: GPTConfig, layer: int = 0):
        super().__init__()
        c = layer_shape(c, layer)  # Gemma 4: a layer's own head size, kv heads, MLP width
        self.layer = layer
        self.ln1 = make_norm(c)
        self.linear = is_linear(c, layer)  # its mixer: a DeltaNet, mask: where examples start
        self.attn = GatedDeltaNet(c) if self.linear else SelfAttention(c, layer)
        self.ln2 = make_norm(c)
        self.mlp = MoE(c, MLP, make_norm) if is_sparse(c, layer) else MLP(c)
        self.routes_stream = is_sparse(c, layer) and self.mlp.options["parallel_dense"]
        # Gemma 2/3: each sub-layer's output normed before the add
        self.ln1_post = make_norm(c) if c.post_norms else None
        self.ln2_post = make_norm(c) if c.post_norms else None
        p = per_layer_of(c)  # Gemma 4: the layer's per-layer input, gated and added
        self.per_layer = PerLayerGate(c, make_norm) if p.input_dim else None
        # Gemma 4: each layer's output times a scalar, set by its weights
        self.register_buffer("scalar", torch.ones(1) if p.layer_scalar else None)

    def forward(self, x, rope=None, mask=None, remake: Remake | None = None, side=None):
        y = self.attn(self._norm(self.ln1, x, remake), rope, mask, side)
        return self._after(x, y, remake, side)

    def cached(self, x, past, rope=None, mask=None, side=None):
        """forward() for generation: the mixer attends to (or carries on from) past too;
        returns (output, the mixer's new cache entry)."""
        y, kv = self.attn.cached(self.ln1(x), past, rope, mask, side)
        return self._after(x, y, None, side), kv

    def _after(self, x, y, remake: Remake | None, side):
        """The layer after its mixer's output y: the residual adds (with Gemma 2/3's post-norms),
        the MLP, and Gemma 4's end: its per-layer input added, then the layer scalar."""
        x = x + (y if self.ln1_post is None else self.ln1_post(y))
        h = self._mlp(x, remake)
        x = x + (h if self.ln2_post is None else self.ln2_post(h))
        if self.per_layer is not None:
            x = self.per_layer(x, side.layer_input(self.layer))
        return x if self.scalar is None else x * self.scalar

    def _mlp(self, x, remake: Remake | None = None):
        h = self._norm(self.ln2, x, remake)
        if self.routes_stream:  # Gemma 4's experts: routed on the stream before ln2
            return self.mlp(h, remake, stream=x)
        return self.mlp(h, remake)

    @staticmethod
    def _norm(norm, x, remake: Remake | None):
        out = norm(x)
        return out if remake is None else remake.register(out, lambda: norm(x))


def packed(segments: torch.Tensor) -> tuple[torch.Tensor, Segments]:
    """Positions restarting at each example, and the examples for the attention mask, which
    is causal within an example and closed across examples: made a chunk of queries at a time
    (core.models.tiling.causal_rows), never T x T whole at long context."""
    t = segments.shape[1]
    index = torch.arange(t, device=segments.device).expand_as(segments)
    begins = torch.ones_like(segments, dtype=torch.bool)
    begins[:, 1:] = segments[:, 1:] != segments[:, :-1]
    first = torch.where(begins, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - first, Segments(segments)


def deepstack(x, layer: int, deep):
    """x with Qwen3-VL's DeepStack features of this language layer added at the image
    tokens (deep: (where (B, T), [features (N, D) of the first layers]); None: x)."""
    if deep is None or layer >= len(deep[1]):
        return x
    where, feats = deep
    where = where.to(x.device)  # a layer split (core.training.split): x on the layer's card
    added = x[where] + feats[layer].to(x.device, x.dtype)
    return x.masked_scatter(where.unsqueeze(-1), added)


def rope_delta(positions, valid):
    """Each row's furthest 3-D position + 1 minus its tokens (B,): what the positions of the
    tokens after a prompt with images add to their 1-D ones (transformers' rope_deltas)."""
    top = positions.masked_fill(~valid[None], -1).amax(dim=(0, 2))
    return top + 1 - valid.sum(1)


class SoftcappedHead:
    """head(x) soft-capped: cap * tanh(logits / cap). Not an nn.Linear, so the loss takes
    its checkpointed chunks (core.models.loss.fusable) rather than the fused kernel."""

    def __init__(self, head: nn.Linear, cap: float):
        self.head, self.cap, self.weight = head, cap, head.weight

    def __call__(self, x):
        return torch.tanh(self.head(x) / self.cap) * self.cap


class GPT(nn.Module):
    vision: Any  # an attached vision tower (core.models.vision.attach), where images come

    def __init__(self, c: GPTConfig):
        super().__init__()
        for name, value, allowed in (
            ("norm", c.norm, NORMS),
            ("positions", c.positions, POSITIONS),
            ("mlp", c.mlp, MLPS),
        ):
            if value not in allowed:
                raise ValueError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
        if (problem := layer_types_problem(c)) is not None:
            raise ValueError(problem)
        self.config = c
        self.tok_emb = nn.Embedding(c.vocab_size, c.hidden_dim)
        learned = c.positions == "learned"
        self.pos_emb = nn.Embedding(c.seq_len, c.hidden_dim) if learned else None
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c, i) for i in range(c.n_layers))
        # Gemma 4's per-layer inputs (core.models.per_layer)
        per_layer = per_layer_of(c).input_dim
        self.per_layer_inputs = PerLayerInputs(c, make_norm) if per_layer else None
        self.ln_f = make_norm(c)
        self.head = nn.Linear(c.hidden_dim, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.head.weight = self.tok_emb.weight
        self._rope_cache: dict[bool, tuple] = {}  # by LongRoPE's long or short factors
        self.moe_layers = [i for i in range(c.n_layers) if is_sparse(c, i)]
        self.moe_meter = LoadMeter()
        if self.tok_emb.weight.is_meta:
            return  # shapes only (the estimate builds hundreds): no values to draw
        self.apply(self._init_weights)
        # GPT-2: scale residual projections by depth so the residual stream stays O(1).
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layers))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def compile_blocks(self, options: dict | None) -> int:
        """torch.compile each block in place with options (None: eager again); how many.
        Regional compilation: blocks alike share one compiled graph (torch inlines their
        modules), so a first step compiles a block, not the whole model."""
        for block in self.blocks:
            if options is None:
                block._compiled_call_impl = None
            else:
                block.compile(**options)
        return len(self.blocks)

    @property
    def blocks_compiled(self) -> bool:
        return any(b._compiled_call_impl is not None for b in self.blocks)

    def _long(self, lengths):
        """Whether sequences of these lengths (a number, or a tensor of them) use LongRoPE's
        long factors: past its original context, as transformers chooses them by the
        furthest position of a forward pass."""
        s = self.config.rope_scaling or {}
        longrope = rope_kind(self.config) == "longrope"
        return lengths > (s["original_max_position_embeddings"] if longrope else math.inf)

    def _rope_rows(self, end: int, device, long: bool) -> tuple:
        """The cos and sin table (and Gemma 3's local pair) of at least positions 0..end-1,
        grown on demand: a model with a 128k context should not hold rows it never uses."""
        c = self.config
        table = self._rope_cache.get(long)
        if table is None or table[0].shape[0] < end or table[0].device != device:
            n = max(end, 256)
            own = per_layer_of(c).full_head_dim  # Gemma 4: full-attention layers' head size
            full = dataclasses.replace(c, head_dim=own) if own else c
            inv = rope_frequencies(full, long).to(device)
            table = self._rope_table(inv, n, device, rope_attention_factor(c))
            if c.rope_local_theta is not None:  # sliding layers' own base, no scaling
                local = dataclasses.replace(c, rope_theta=c.rope_local_theta, rope_scaling=None)
                table += self._rope_table(rope_frequencies(local).to(device), n, device)
            self._rope_cache[long] = table
        return table

    @staticmethod
    def _rope_table(inv, n: int, device, factor: float = 1.0) -> tuple:
        freqs = torch.outer(torch.arange(n, device=device, dtype=torch.float32), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        if factor != 1.0:
            return (emb.cos() * factor, emb.sin() * factor)
        return (emb.cos(), emb.sin())

    def _tokens(self, idx):
        x = self.tok_emb(idx)
        if self.config.embed_scale is not None:  # Gemma: in the embedding's dtype
            x = x * torch.tensor(self.config.embed_scale, dtype=x.dtype)
        return x

    def _embed(self, idx, positions=None, long=None):
        """The tokens' embeddings, and their positions': learned ones added, or RoPE's cos and
        sin. positions: None: 0..T-1, cos and sin (T, head); (B, T): each row's own (packed
        examples from 0, forward_cached's rows after their cache), (B, 1, T, head). long
        (B,): the rows on LongRoPE's long factors (forward_cached); None: all or none, by
        the furthest position, as transformers chooses them for a forward pass."""
        t = idx.shape[1]
        if positions is None:
            positions = torch.arange(t, device=idx.device)
        end = t if long is None else int(positions.max()) + 1
        if end > self.config.seq_len:
            raise ValueError(f"position {end} is past seq_len {self.config.seq_len}")
        x = self._tokens(idx)
        if self.config.positions == "learned":
            return x + self.pos_emb(positions), None
        if long is None:
            furthest = t
            if positions.dim() == 2 and rope_kind(self.config) == "longrope":
                furthest = int(positions.max()) + 1  # each packed example counts from 0
            long = bool(self._long(furthest))
        return x, self._rope(positions, end, long)

    def _rope(self, positions, end: int, long) -> tuple:
        """cos and sin at positions ((T,): (T, head); (B, T): (B, 1, T, head)), of a table of
        end rows; long: LongRoPE's long factors for every row (a bool) or per row ((B,))."""
        each = torch.is_tensor(long)
        table = self._rope_rows(end, positions.device, False if each else long)
        rope = tuple(r[positions] for r in table)
        if each and bool(long.any()):
            longer = self._rope_rows(end, positions.device, True)
            row = long[:, None, None]
            rope = tuple(
                torch.where(row, b[positions], a) for a, b in zip(rope, longer, strict=True)
            )
        return rope if positions.dim() == 1 else tuple(r.unsqueeze(1) for r in rope)

    def _mrope(self, positions):
        """cos and sin (B, 1, T, rotary) of 3-D positions (3, B, T) (Qwen's M-RoPE,
        interleaved: rotary pair j turns by the row's position where j % 3 == 1 within the
        height section, the column's where j % 3 == 2 within the width one, else time)."""
        c = self.config
        inv = rope_frequencies(c).to(positions.device)
        section = self.vision.options.mrope_section
        axis = torch.zeros(inv.shape[0], dtype=torch.long, device=positions.device)
        for a in (1, 2):
            axis[a : section[a] * 3 : 3] = a
        freqs = positions[..., None].float() * inv  # (3, B, T, pairs)
        picked = freqs.gather(0, axis.expand_as(freqs[:1])).squeeze(0)
        emb = torch.cat((picked, picked), dim=-1).unsqueeze(1)
        return emb.cos(), emb.sin()

    def forward(self, idx, targets=None, loss_mask=None, segments=None, real=None, images=None):
        """As nanoGPT's. Without targets: (hidden, penalty): the final normed stream (B, T,
        hidden_dim), which output_head() turns into logits and core.models.loss's
        sequence_logps and token_logps take (the objectives that want more than the mean
        loss), and the MoE load-balancing penalty to add to a training loss (aux_penalty;
        None: none). With targets: (None, loss): the mean cross-entropy over targets where
        loss_mask is non-zero, the penalty included, computed in chunks (core.models.loss)
        so the whole vocabulary's logits never exist at once. segments (B, T): packed
        examples (chat data) numbered; each attends only to itself and counts positions
        from 0, as it would alone. real (B, T): 1 where a token is not padding, for the MoE
        routing statistics and aux loss (None: every token). images (N, 3, H, W): the pixel
        values of the images whose tokens idx holds, in order, for the attached vision tower
        (core.models.vision)."""
        self._mark_real(real)
        positions, mask = packed(segments) if segments is not None else (None, None)
        starts = None if positions is None else positions == 0
        masks = [starts if b.linear else mask for b in self.blocks]  # a DeltaNet: its starts
        x, rope = self._embed(idx, positions)
        deep = None
        if images is not None:  # the tower's embeddings at the image tokens
            plain = mask
            x, mask, mrope, deep = self.vision.see(idx, x, images, mask, starts)
            o = self.vision.options  # Gemma 4: an image's tokens see each other in sliding
            masks = [  # layers only
                starts if b.linear else mask if both_ways(o, window_of(b)) else plain
                for b in self.blocks
            ]
            if mrope is not None:  # Qwen: 3-D positions where a row holds an image
                rope = self._mrope(mrope)
        # what the per-layer inputs read (Gemma 4: the pad token at an image's tokens)
        side = self._side(idx if images is None else text_ids(self.vision.options, idx), x)
        x = self.drop(x)
        streams = None if deep is not None else self._offload_streams(x)
        if streams is not None:
            x = run_blocks(self.blocks, x, [(rope, m) for m in masks], streams)
        elif self.config.grad_checkpointing and self.training:
            k = self.config.checkpoint_blocks  # the first k: as few as memory needs
            for i, (block, m) in enumerate(zip(self.blocks, masks, strict=True)):
                if k is None or i < k:
                    x = checkpoint(block, x, rope, m, None, side, use_reentrant=False)
                else:
                    x = block(x, rope, m, None, side)
                x = deepstack(x, i, deep)
        elif self._remakes():
            remake = Remake()  # the adapters' inputs are remade in backward, not kept
            with remake.hooks():
                for i, (block, m) in enumerate(zip(self.blocks, masks, strict=True)):
                    x = deepstack(block(x, rope, m, remake, side), i, deep)
        else:
            for i, (block, m) in enumerate(zip(self.blocks, masks, strict=True)):
                x = deepstack(block(x, rope, m, None, side), i, deep)
        aux = self.router_aux_loss()
        if aux is not None and self.training and torch.is_grad_enabled():
            self.moe_meter.add([self.blocks[i].mlp for i in self.moe_layers], aux)
        hidden, penalty = self.ln_f(x), self.aux_penalty()
        if targets is None:
            return hidden, penalty
        loss = lm_loss(self.output_head(), hidden, targets, loss_mask, fused=self.config.fused)
        return None, loss if penalty is None else loss + penalty

    def logits(self, idx, segments=None, images=None):
        """The logits of idx (B, T, vocab): the head over forward's hidden states."""
        hidden, _ = self(idx, segments=segments, images=images)
        return self.output_head()(hidden)

    def _mark_real(self, real) -> None:
        for i in self.moe_layers:
            self.blocks[i].mlp.real = None if real is None else real.reshape(-1).float()

    def aux_penalty(self):
        """coefficient x the last forward's load-balancing loss, which every objective adds
        to its loss in training (None: off, a dense model, or evaluating: the validation
        loss stays comparable)."""
        coef = self.config.moe.get("aux_coef", 0.0) if self.moe_layers else 0.0
        if not (coef and self.training):
            return None
        return coef * self.router_aux_loss()

    def _side(self, idx, x) -> Side:
        """What the blocks take beside the stream (Gemma 4's per-layer inputs, from the ids
        and their scaled embeddings x, and its shared keys and values)."""
        make = self.per_layer_inputs
        return Side(None if make is None else make(idx, x))

    def router_aux_loss(self):
        """The load-balancing loss of the last forward, unscaled, pooled over the MoE
        layers as transformers pools it (None: a dense model)."""
        if not self.moe_layers:
            return None
        layers = [self.blocks[i].mlp for i in self.moe_layers]
        return aux_loss([m.last_route for m in layers], layers[0].n_experts)

    def moe_step(self) -> tuple | None:
        """The routing statistics of the training forwards since the last call, still on the
        device (None: a dense model, or none ran): a step keeps them for moe_records."""
        return self.moe_meter.take()

    def moe_records(self, sums: tuple | None) -> dict:
        """metrics.jsonl's MoE fields ("moe/aux_loss", "moe/router_entropy",
        "moe/expert_load", "moe/layers") of a step's moe_step(); {} for None."""
        return records(sums, self.moe_layers)

    def output_head(self):
        """The head, or (Gemma 2) the head with its logits soft-capped."""
        cap = self.config.logit_softcap
        return self.head if not cap else SoftcappedHead(self.head, cap)

    def _offload_streams(self, x):
        """The side stream that offloads checkpoints (core.models.offload), where they are
        on and this forward can use it: a CUDA training forward with gradients, eager."""
        on = offloads(self.config) and self.training  # the shape's answer (offload.py)
        if not on or not torch.is_grad_enabled() or torch.compiler.is_compiling():
            return None
        return streams_for(x.device)

    def _remakes(self) -> bool:
        """A fine-tune's training forward, eager: under torch.compile (of the model or of its
        blocks) the compiler chooses what to keep and what to recompute itself."""
        return (
            self.config.fused
            and self.training
            and torch.is_grad_enabled()
            and not torch.compiler.is_compiling()
            and not self.blocks_compiled
        )

    @torch.no_grad()
    def forward_cached(
        self, idx, cache: KVCache | None = None, valid=None, last: bool = False, images=None
    ):
        """Logits of idx (B, T) after the tokens in cache (None: none before), and the cache
        with idx added: generating n tokens costs O(n) forward work instead of O(n^2).
        valid (B, T): False over padding, on either side of a row (default: all tokens);
        each row's tokens follow its own cached ones. last: only each row's last token's
        logits (B, V). The same network as forward: embedding scale, RoPE kinds, sliding
        windows, post-norms and soft-caps; images: as forward's, for the image tokens of
        idx."""
        if valid is None:
            valid = torch.ones_like(idx, dtype=torch.bool)
        if cache is not None and self._rope_switches(cache, valid):
            # LongRoPE's factors change for a row: every key is made again with the new
            # ones, as transformers drops its cache there
            idx, valid = torch.cat((cache.ids, idx), 1), torch.cat((cache.valid, valid), 1)
            cache = None
        positions = row_positions(valid, None if cache is None else cache.lengths())
        if cache is not None:
            k_pos = torch.cat((cache.positions, positions), 1)
            k_valid = torch.cat((cache.valid, valid), 1)
            ids = torch.cat((cache.ids, idx), 1)
        else:
            k_pos, k_valid, ids = positions, valid, idx
        long = self._long(k_valid.sum(1))
        self._mark_real(valid)  # sampling's routing statistics leave its padding out too
        delta = None if cache is None else cache.rope_delta
        shifted = positions if delta is None else positions + delta[:, None]
        x, rope = self._embed(idx, shifted, long)
        deep = None
        if images is not None:  # the tower's embeddings at the image tokens
            if cache is not None and self.vision.options.mrope_section is not None:
                raise ValueError("images: Qwen's images come in the first pass (no cache)")
            x, _, mrope, deep = self.vision.see(idx, x, images, valid=valid)
            if mrope is not None:  # Qwen: 3-D positions; the tokens after go on from the top
                rope = self._mrope(mrope)
                delta = rope_delta(mrope, valid)
        side = self._side(idx if images is None else text_ids(self.vision.options, idx), x)
        windows = {block.attn.window for block in self.blocks if not block.linear}
        masks = masks_for(windows, positions, k_pos, k_valid, first=cache is None)
        if images is not None:  # an image's tokens see each other (Gemma 3)
            masks = self.vision.cached_masks(masks, positions, k_pos, k_valid, ids)
        layers = []
        for i, block in enumerate(self.blocks):
            past = None if cache is None else cache.layers[i]
            mask = valid if block.linear else masks[block.attn.window]  # a DeltaNet: its state
            x, kv = block.cached(x, past, rope, mask, side)
            x = deepstack(x, i, deep)
            layers.append(kv)
        if last:  # each row's last token
            end = valid.shape[1] - 1 - valid.flip(1).long().argmax(1)
            x = x[torch.arange(x.shape[0], device=x.device), end]
        logits = self.output_head()(self.ln_f(x))
        return logits, KVCache(layers, k_pos, k_valid, ids, long, delta)

    def _rope_switches(self, cache: KVCache, valid) -> bool:
        """Whether adding valid's tokens takes a row past LongRoPE's original context."""
        return bool((self._long(cache.lengths() + valid.sum(1)) != cache.long).any())

    @torch.no_grad()
    def generate(
        self, idx, n_new: int, generator: torch.Generator, temperature: float = 0.8, images=None
    ):
        """Sample n_new tokens after idx with its own generator, so training RNG is untouched
        (images: the pixel values of idx's images)."""
        context = min(self.config.seq_len, 4096)  # bounds a sample's cost for long contexts
        for _ in range(n_new):
            logits = self.logits(idx[:, -context:], images=images)
            probs = F.softmax(logits[:, -1, :].float() / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat((idx, nxt), dim=1)
        return idx
