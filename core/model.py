"""A decoder-only GPT over bytes, in the spirit of nanoGPT's model.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .config import TrainConfig

VOCAB_SIZE = 256  # bytes: no tokenizer to download


@dataclass(kw_only=True)
class GPTConfig:
    """The network's shape. Its defaults and ranges live in core.config.TrainConfig:
    build it with `from_train` (tests may build small ones by hand)."""

    hidden_dim: int
    n_layers: int
    n_heads: int
    seq_len: int
    dropout: float = 0.0
    vocab_size: int = VOCAB_SIZE
    grad_checkpointing: bool = False
    bias: bool = True

    @classmethod
    def from_train(cls, cfg: TrainConfig, training: bool = True) -> GPTConfig:
        """For training, or (training=False) for inference: no dropout or checkpointing."""
        return cls(
            hidden_dim=cfg.hidden_dim,
            n_layers=cfg.n_layers,
            n_heads=cfg.n_heads,
            seq_len=cfg.seq_len,
            dropout=cfg.dropout if training else 0.0,
            vocab_size=cfg.model_vocab,
            grad_checkpointing=cfg.grad_checkpointing and training,
            bias=cfg.bias,
        )


class SelfAttention(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.n_heads = c.n_heads
        self.qkv = nn.Linear(c.hidden_dim, 3 * c.hidden_dim, bias=c.bias)
        self.proj = nn.Linear(c.hidden_dim, c.hidden_dim, bias=c.bias)
        self.dropout = c.dropout
        self.resid_drop = nn.Dropout(c.dropout)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        # SDPA picks the flash / memory-efficient kernel on CUDA.
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(b, t, d)
        return self.resid_drop(self.proj(y))

    def cached(self, x, past):
        """forward() for generation: attends to past (k, v) too; returns (y, new (k, v)).
        With a past, x is one new token, which may see everything before it."""
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        if past is not None:
            k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=past is None)
        y = y.transpose(1, 2).contiguous().view(b, t, d)
        return self.proj(y), (k, v)


class MLP(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(c.hidden_dim, 4 * c.hidden_dim, bias=c.bias)
        self.proj = nn.Linear(4 * c.hidden_dim, c.hidden_dim, bias=c.bias)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x):
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(c.hidden_dim, bias=c.bias)
        self.attn = SelfAttention(c)
        self.ln2 = nn.LayerNorm(c.hidden_dim, bias=c.bias)
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

    def cached(self, x, past):
        y, kv = self.attn.cached(self.ln1(x), past)
        x = x + y
        return x + self.mlp(self.ln2(x)), kv


class GPT(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.config = c
        self.tok_emb = nn.Embedding(c.vocab_size, c.hidden_dim)
        self.pos_emb = nn.Embedding(c.seq_len, c.hidden_dim)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.ln_f = nn.LayerNorm(c.hidden_dim, bias=c.bias)
        self.head = nn.Linear(c.hidden_dim, c.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # tied output head
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

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        if t > self.config.seq_len:
            raise ValueError(f"sequence of {t} tokens is longer than seq_len {self.config.seq_len}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            if self.config.grad_checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))
        return logits, loss

    @torch.no_grad()
    def forward_cached(self, idx, cache: list | None, pos: int = 0):
        """Logits for idx placed at positions pos.. given the keys/values of the tokens before
        (cache, one (k, v) per block, or None). Returns (logits, new cache). Generating n
        tokens this way costs O(n) forward work instead of O(n^2)."""
        t = idx.shape[1]
        if pos + t > self.config.seq_len:
            raise ValueError(f"position {pos + t} is past seq_len {self.config.seq_len}")
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(pos, pos + t, device=idx.device))
        new_cache = []
        for i, block in enumerate(self.blocks):
            x, kv = block.cached(x, None if cache is None else cache[i])
            new_cache.append(kv)
        return self.head(self.ln_f(x)), new_cache

    @torch.no_grad()
    def generate(self, idx, n_new: int, generator: torch.Generator, temperature: float = 0.8):
        """Sample n_new bytes after idx with its own generator, so training RNG is untouched."""
        for _ in range(n_new):
            context = idx[:, -self.config.seq_len :]
            logits, _ = self(context)
            probs = F.softmax(logits[:, -1, :].float() / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat((idx, nxt), dim=1)
        return idx
