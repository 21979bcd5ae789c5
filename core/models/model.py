"""A decoder-only transformer, in the spirit of nanoGPT's model.py, with the options that
GPT-2 and the Llama family (Llama 2/3, SmolLM, TinyLlama, Mistral, Qwen2/2.5, Qwen3) need:
LayerNorm or RMSNorm, learned or rotary positions, GELU or SwiGLU MLP, grouped-query
attention, a head size of its own, q/k/v biases, q/k norms, tied or separate output head.

The defaults are TrainDeck's own GPT-2-style model. A family is a set of these options plus a
weight-name table (core.weights.families), not a class of its own. q, k and v live in one fused
Linear (and SwiGLU's gate and up in another): one matrix product each, split on the way out.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from core.config.spec import TrainConfig, from_known
from core.models.fused import Remake, rms_norm, signed_sin, swiglu
from core.models.fused import rope as fused_rope
from core.models.loss import lm_loss, sequence_logps

VOCAB_SIZE = 256  # bytes: no tokenizer to download
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope")
MLPS = ("gelu", "gelu_tanh", "swiglu")


# A new model with arch llama: Llama's choices, as SmolLM2 makes them (tied embeddings).
LLAMA_OPTIONS = {"bias": False, "norm": "rmsnorm", "norm_eps": 1e-6, "positions": "rope",
                 "mlp": "swiglu"}  # fmt: skip


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
    tie_embeddings: bool = True
    # Hand-written backward passes and the fused loss (core.models.fused, LinearCrossEntropy):
    # equal within fp32 rounding, not bit for bit, so a fine-tune (from_train with a base)
    # uses them and a new model keeps the plain ops its older runs resume with exactly.
    fused: bool = False

    def __post_init__(self):
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
        }
        if base is not None:
            return dataclasses.replace(base, **run, fused=True)
        shape = {
            "hidden_dim": cfg.hidden_dim,
            "n_layers": cfg.n_layers,
            "n_heads": cfg.n_heads,
            "seq_len": cfg.seq_len,
            "vocab_size": cfg.model_vocab,
        }
        if cfg.arch == "llama":
            return cls(**shape, **LLAMA_OPTIONS, **run, ffn_dim=swiglu_width(cfg.hidden_dim),
                       n_kv_heads=cfg.n_kv_heads, qk_norm=cfg.qk_norm)  # fmt: skip
        return cls(**shape, bias=cfg.bias, **run)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> GPTConfig:
        return from_known(cls, d)


class RMSNorm(nn.Module):
    """As Llama's: normalise in fp32, scale in the input's type."""

    def __init__(self, dim: int, eps: float, fused: bool = False):
        super().__init__()
        self.eps, self.fused = eps, fused
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        if self.fused:
            return rms_norm(x, self.weight, self.eps)  # the same forward, fewer saved tensors
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def make_norm(c: GPTConfig, dim: int | None = None) -> nn.Module:
    if c.norm == "rmsnorm":
        return RMSNorm(dim or c.hidden_dim, c.norm_eps, c.fused)
    return nn.LayerNorm(dim or c.hidden_dim, eps=c.norm_eps, bias=c.bias)


def rope_frequencies(c: GPTConfig) -> torch.Tensor:
    """Inverse frequencies of rotary positions, with Llama 3's or linear scaling."""
    d = c.head_dim
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = c.rope_scaling or {}
    kind = s.get("rope_type", s.get("type", "default"))
    if kind == "linear":
        return inv / s["factor"]
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


def rotate(x, cos, sin):
    """Rotary embedding in the half-split layout that Hugging Face checkpoints use."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class SelfAttention(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = c.n_heads, c.n_kv_heads, c.head_dim
        self.sizes = (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.n_kv_heads * c.head_dim)
        self.qkv = nn.Linear(c.hidden_dim, sum(self.sizes), bias=c.qkv_bias)
        self.proj = nn.Linear(c.n_heads * c.head_dim, c.hidden_dim, bias=c.out_bias)
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.norm_eps, c.fused)
            self.k_norm = RMSNorm(c.head_dim, c.norm_eps, c.fused)
        self.qk_norm, self.fused = c.qk_norm, c.fused
        self.dropout = c.dropout
        self.resid_drop = nn.Dropout(c.dropout)

    def _qkv(self, x, rope):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split(self.sizes, dim=2)
        q = q.view(b, t, self.n_heads, self.hd).transpose(1, 2)
        k = k.view(b, t, self.n_kv, self.hd).transpose(1, 2)
        v = v.view(b, t, self.n_kv, self.hd).transpose(1, 2)
        if self.fused and torch.is_grad_enabled():
            # SDPA keeps v for backward: a view would keep all of qkv's output alive, the
            # q and k parts of which RoPE has already copied.
            v = v.contiguous()
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            cos, sin = (r.to(q.dtype) for r in rope)
            if self.fused:
                sin = signed_sin(sin)
                q, k = fused_rope(q, cos, sin), fused_rope(k, cos, sin)
            else:
                q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        return q, k, v

    def _attend(self, q, k, v, causal: bool, mask=None):
        gqa = self.n_kv != self.n_heads
        if gqa and not self.fused:  # each k/v head serves several q heads
            k = k.repeat_interleave(self.n_heads // self.n_kv, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        drop = self.dropout if self.training else 0.0
        # SDPA picks the flash / memory-efficient kernel on CUDA; with packed examples the
        # mask (causal within each example) takes the place of is_causal. Grouped-query:
        # fused, SDPA serves each k/v head to its q heads (no repeated copies of k and v).
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=drop, is_causal=causal and mask is None,
            enable_gqa=gqa and self.fused,
        )  # fmt: skip
        b, _, t, _ = y.shape
        return self.proj(y.transpose(1, 2).reshape(b, t, self.n_heads * self.hd))

    def forward(self, x, rope=None, mask=None):
        q, k, v = self._qkv(x, rope)
        return self.resid_drop(self._attend(q, k, v, causal=True, mask=mask))

    def cached(self, x, past, rope=None):
        """forward() for generation: attends to past (k, v) too; returns (y, new (k, v)).
        With a past, x is one new token, which may see everything before it."""
        q, k, v = self._qkv(x, rope)
        if past is not None:
            k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
        return self._attend(q, k, v, causal=past is None), (k, v)


class MLP(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.kind, self.fused = c.mlp, c.fused
        width = 2 * c.ffn_dim if c.mlp == "swiglu" else c.ffn_dim  # gate and up, fused
        self.fc = nn.Linear(c.hidden_dim, width, bias=c.mlp_bias)
        self.proj = nn.Linear(c.ffn_dim, c.hidden_dim, bias=c.mlp_bias)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x, remake: Remake | None = None):
        h = self.fc(x)
        if self.kind == "swiglu" and self.fused:
            gate_up = h
            h = swiglu(gate_up)  # silu(gate) * up, keeping only h for the backward pass
            if remake is not None:
                remake.register(h, lambda: swiglu(gate_up))
        elif self.kind == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh" if self.kind == "gelu_tanh" else "none")
        return self.drop(self.proj(h))


class Block(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.ln1 = make_norm(c)
        self.attn = SelfAttention(c)
        self.ln2 = make_norm(c)
        self.mlp = MLP(c)

    def forward(self, x, rope=None, mask=None, remake: Remake | None = None):
        x = x + self.attn(self._norm(self.ln1, x, remake), rope, mask)
        return x + self.mlp(self._norm(self.ln2, x, remake), remake)

    @staticmethod
    def _norm(norm, x, remake: Remake | None):
        out = norm(x)
        return out if remake is None else remake.register(out, lambda: norm(x))

    def cached(self, x, past, rope=None):
        y, kv = self.attn.cached(self.ln1(x), past, rope)
        x = x + y
        return x + self.mlp(self.ln2(x)), kv


def packed(segments: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions restarting at each example, and the attention mask (B, 1, T, T) that is
    causal within an example and closed across examples."""
    t = segments.shape[1]
    index = torch.arange(t, device=segments.device).expand_as(segments)
    begins = torch.ones_like(segments, dtype=torch.bool)
    begins[:, 1:] = segments[:, 1:] != segments[:, :-1]
    first = torch.where(begins, index, torch.zeros_like(index)).cummax(dim=1).values
    causal = torch.ones(t, t, dtype=torch.bool, device=segments.device).tril()
    same = segments[:, :, None] == segments[:, None, :]
    return index - first, (same & causal).unsqueeze(1)


class GPT(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        for name, value, allowed in (
            ("norm", c.norm, NORMS), ("positions", c.positions, POSITIONS), ("mlp", c.mlp, MLPS)
        ):  # fmt: skip
            if value not in allowed:
                raise ValueError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
        self.config = c
        self.tok_emb = nn.Embedding(c.vocab_size, c.hidden_dim)
        if c.positions == "learned":
            self.pos_emb = nn.Embedding(c.seq_len, c.hidden_dim)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.ln_f = make_norm(c)
        self.head = nn.Linear(c.hidden_dim, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.head.weight = self.tok_emb.weight
        self._rope_cache: tuple | None = None
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

    def _rope(self, start: int, end: int, device):
        """cos and sin for positions start..end-1, from a table grown on demand (a model
        with a 128k context should not hold 128k rows it never uses)."""
        if self.config.positions != "rope":
            return None
        cache = self._rope_cache
        if cache is None or cache[0].shape[0] < end or cache[0].device != device:
            n = max(end, 256)
            inv = rope_frequencies(self.config).to(device)
            freqs = torch.outer(torch.arange(n, device=device, dtype=torch.float32), inv)
            emb = torch.cat((freqs, freqs), dim=-1)
            cache = self._rope_cache = (emb.cos(), emb.sin())
        return cache[0][start:end], cache[1][start:end]

    def _embed(self, idx, pos: int, positions=None):
        t = idx.shape[1]
        if pos + t > self.config.seq_len:
            raise ValueError(f"position {pos + t} is past seq_len {self.config.seq_len}")
        x = self.tok_emb(idx)
        if positions is None:
            positions = torch.arange(pos, pos + t, device=idx.device)
        if self.config.positions == "learned":
            return x + self.pos_emb(positions), None
        cos, sin = self._rope(0, pos + t, idx.device)
        if positions.dim() == 2:  # each packed example from position 0: (B, 1, T, head)
            return x, (cos[positions].unsqueeze(1), sin[positions].unsqueeze(1))
        return x, (cos[positions], sin[positions])

    def forward(self, idx, targets=None, loss_mask=None, segments=None, per_sequence=False):
        """(logits, None) without targets; (None, loss) with them: the mean cross-entropy
        over targets where loss_mask is non-zero, computed in chunks (core.models.loss) so
        the whole vocabulary's logits never exist at once. segments (B, T): packed examples
        (chat data) numbered; each attends only to itself and counts positions from 0, as
        it would alone. per_sequence: (None, each sequence's summed log-probability of
        its masked targets) instead of the mean loss (preference tuning)."""
        positions, mask = packed(segments) if segments is not None else (None, None)
        x, rope = self._embed(idx, 0, positions)
        x = self.drop(x)
        if self.config.grad_checkpointing and self.training:
            for block in self.blocks:
                x = checkpoint(block, x, rope, mask, use_reentrant=False)
        elif self._remakes():
            remake = Remake()  # the adapters' inputs are remade in backward, not kept
            with remake.hooks():
                for block in self.blocks:
                    x = block(x, rope, mask, remake)
        else:
            for block in self.blocks:
                x = block(x, rope, mask)
        if targets is None:
            return self.head(self.ln_f(x)), None
        if per_sequence:
            return None, sequence_logps(self.head, self.ln_f(x), targets, loss_mask)
        return None, lm_loss(self.head, self.ln_f(x), targets, loss_mask, fused=self.config.fused)

    def _remakes(self) -> bool:
        """A fine-tune's training forward, eager: under torch.compile the compiler chooses
        what to keep and what to recompute itself."""
        return (
            self.config.fused
            and self.training
            and torch.is_grad_enabled()
            and not torch.compiler.is_compiling()
        )

    @torch.no_grad()
    def forward_cached(self, idx, cache: list | None, pos: int = 0):
        """Logits for idx placed at positions pos.. given the keys/values of the tokens before
        (cache, one (k, v) per block, or None). Returns (logits, new cache). Generating n
        tokens this way costs O(n) forward work instead of O(n^2)."""
        x, rope = self._embed(idx, pos)
        new_cache = []
        for i, block in enumerate(self.blocks):
            x, kv = block.cached(x, None if cache is None else cache[i], rope)
            new_cache.append(kv)
        return self.head(self.ln_f(x)), new_cache

    @torch.no_grad()
    def generate(self, idx, n_new: int, generator: torch.Generator, temperature: float = 0.8):
        """Sample n_new tokens after idx with its own generator, so training RNG is untouched."""
        context = min(self.config.seq_len, 4096)  # bounds a sample's cost for long contexts
        for _ in range(n_new):
            logits, _ = self(idx[:, -context:])
            probs = F.softmax(logits[:, -1, :].float() / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat((idx, nxt), dim=1)
        return idx
