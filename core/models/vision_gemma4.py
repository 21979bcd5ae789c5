"""Gemma 4's vision encoder and its projector (embed_vision), as transformers'
modeling_gemma4.py has them, with its module names so the base's tensors load as they are.

An image arrives as its processor makes it (core.data.images, Gemma 4's kind): P patches of
3 x p x p pixels in [0, 1] (padded to max_soft_tokens x k x k patches) and each patch's (x, y)
in the patch grid, -1 for padding. forward takes the two as one float tensor (N, P, 3p^2 + 2)
(joined): the pixels, then x and y, so every caller passes `images=` as one tensor. The tower
embeds each patch (a matrix and learned x and y position tables), runs pre/post-normed layers
with 2-D rotary positions (x on the first half of a head, y on the second) over the image's
real patches, average-pools k x k patches into one soft token, scales by sqrt(width) and
(standardize) shifts and scales; embed_vision norms (no weight) and projects each soft token.
An image gives (H / p) x (W / p) / k^2 tokens: their count varies with its aspect ratio.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

# Gemma4VisionConfig's defaults: what a config.json that leaves a field out means
DEFAULTS = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 16,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
    "head_dim": 64,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "pooling_kernel_size": 3,
    "patch_size": 16,
    "position_embedding_size": 10 * 1024,
    "use_clipped_linears": False,
    "standardize": False,
}


def settings(v: dict) -> dict:
    """The vision config with Gemma4VisionConfig's defaults where it leaves a field out."""
    return {**DEFAULTS, **{k: x for k, x in v.items() if x is not None}}


def joined(pixel_values: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """transformers' pixel_values (N, P, 3p^2) and image_position_ids (N, P, 2) as the one
    tensor the tower takes (positions are small integers: exact in fp32)."""
    return torch.cat((pixel_values.float(), position_ids.float()), dim=-1)


def split(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """joined's inverse: (pixels (N, P, 3p^2), positions (N, P, 2) long)."""
    return images[..., :-2], images[..., -2:].round().long()


class ClippableLinear(nn.Module):
    """A bias-free linear whose input and output are clamped to stored bounds where the
    checkpoint has them (use_clipped_linears)."""

    input_min: torch.Tensor
    input_max: torch.Tensor
    output_min: torch.Tensor
    output_max: torch.Tensor

    def __init__(self, v: dict, d_in: int, d_out: int):
        super().__init__()
        self.clipped = bool(v.get("use_clipped_linears", False))
        self.linear = nn.Linear(d_in, d_out, bias=False)
        if self.clipped:
            for name in ("input_min", "output_min"):
                self.register_buffer(name, torch.tensor(-float("inf")))
            for name in ("input_max", "output_max"):
                self.register_buffer(name, torch.tensor(float("inf")))

    def forward(self, x):
        if self.clipped:
            x = torch.clamp(x, self.input_min, self.input_max)
        x = self.linear(x)
        if self.clipped:
            x = torch.clamp(x, self.output_min, self.output_max)
        return x


class RMSNorm(nn.Module):
    """Gemma 4's norm: in fp32, a plain weight (or none), x * (mean(x^2) + eps)^-0.5."""

    def __init__(self, dim: int, eps: float, scale: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if scale else None

    def forward(self, x):
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if self.weight is not None:
            h = h * self.weight.float()
        return h.type_as(x)


def rotate(x, cos, sin):
    """x (B, T, H, D) turned by angles (B, T, D) over each of its two halves: the first
    half by the x positions' angles, the second by the y positions' (rotate_half within)."""
    out = []
    for xs, c, s in zip(x.chunk(2, -1), cos.chunk(2, -1), sin.chunk(2, -1), strict=True):
        c, s = c.unsqueeze(2), s.unsqueeze(2)
        a, b = xs.chunk(2, -1)
        out.append(xs * c + torch.cat((-b, a), -1) * s)
    return torch.cat(out, -1)


class Gemma4VisionAttention(nn.Module):
    def __init__(self, v: dict):
        super().__init__()
        width, eps = v["hidden_size"], v.get("rms_norm_eps", 1e-6)
        self.heads = v["num_attention_heads"]
        self.kv_heads = v.get("num_key_value_heads") or self.heads
        self.head_dim = v.get("head_dim") or width // self.heads
        self.q_proj = ClippableLinear(v, width, self.heads * self.head_dim)
        self.k_proj = ClippableLinear(v, width, self.kv_heads * self.head_dim)
        self.v_proj = ClippableLinear(v, width, self.kv_heads * self.head_dim)
        self.o_proj = ClippableLinear(v, self.heads * self.head_dim, width)
        self.q_norm = RMSNorm(self.head_dim, eps)
        self.k_norm = RMSNorm(self.head_dim, eps)
        self.v_norm = RMSNorm(self.head_dim, eps, scale=False)

    def forward(self, x, cos, sin, keys):
        b, t, _ = x.shape
        q = rotate(self.q_norm(self.q_proj(x).view(b, t, -1, self.head_dim)), cos, sin)
        k = rotate(self.k_norm(self.k_proj(x).view(b, t, -1, self.head_dim)), cos, sin)
        val = self.v_norm(self.v_proj(x).view(b, t, -1, self.head_dim))
        q, k, val = (y.transpose(1, 2) for y in (q, k, val))
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            val = val.repeat_interleave(self.heads // self.kv_heads, dim=1)
        # every real patch sees every real patch; scaled by 1 (the q/k norms set the scale)
        y = F.scaled_dot_product_attention(q, k, val, attn_mask=keys[:, None, None, :], scale=1.0)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class Gemma4VisionMLP(nn.Module):
    def __init__(self, v: dict):
        super().__init__()
        width, inner = v["hidden_size"], v["intermediate_size"]
        self.gate_proj = ClippableLinear(v, width, inner)
        self.up_proj = ClippableLinear(v, width, inner)
        self.down_proj = ClippableLinear(v, inner, width)
        act = v.get("hidden_activation", "gelu_pytorch_tanh")
        self.approximate = "tanh" if "tanh" in act else "none"

    def forward(self, x):
        gate = F.gelu(self.gate_proj(x), approximate=self.approximate)
        return self.down_proj(gate * self.up_proj(x))


class Gemma4VisionLayer(nn.Module):
    def __init__(self, v: dict):
        super().__init__()
        width, eps = v["hidden_size"], v.get("rms_norm_eps", 1e-6)
        self.self_attn = Gemma4VisionAttention(v)
        self.mlp = Gemma4VisionMLP(v)
        self.input_layernorm = RMSNorm(width, eps)
        self.post_attention_layernorm = RMSNorm(width, eps)
        self.pre_feedforward_layernorm = RMSNorm(width, eps)
        self.post_feedforward_layernorm = RMSNorm(width, eps)

    def forward(self, x, cos, sin, keys):
        x = x + self.post_attention_layernorm(
            self.self_attn(self.input_layernorm(x), cos, sin, keys)
        )
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class PatchEmbedder(nn.Module):
    """A patch's pixels through one matrix, plus its x and y rows of the position tables."""

    def __init__(self, v: dict):
        super().__init__()
        width, patch = v["hidden_size"], v["patch_size"]
        self.input_proj = nn.Linear(3 * patch * patch, width, bias=False)
        size = int(v["position_embedding_size"])
        self.position_embedding_table = nn.Parameter(torch.ones(2, size, width))


class Encoder(nn.Module):
    def __init__(self, v: dict):
        super().__init__()
        self.layers = nn.ModuleList(Gemma4VisionLayer(v) for _ in range(v["num_hidden_layers"]))


class Gemma4VisionTower(nn.Module):
    """Gemma4VisionModel: joined images (N, P, 3p^2 + 2) -> the real images' soft tokens,
    flat (M, width) in order, M = the images' tokens together."""

    inv_freq: torch.Tensor
    std_bias: torch.Tensor
    std_scale: torch.Tensor

    def __init__(self, v: dict):
        super().__init__()
        v = settings(v)
        width = v["hidden_size"]
        self.kernel = int(v["pooling_kernel_size"])
        self.patch_embedder = PatchEmbedder(v)
        self.encoder = Encoder(v)
        self.standardize = bool(v.get("standardize", False))
        if self.standardize:
            self.register_buffer("std_bias", torch.zeros(width))
            self.register_buffer("std_scale", torch.ones(width))
        head_dim = v.get("head_dim") or width // v["num_attention_heads"]
        theta = float((v.get("rope_parameters") or {}).get("rope_theta", 100.0))
        spatial = head_dim // 2
        inv = 1.0 / (theta ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, images):
        pixels, pos = split(images)
        pad = (pos == -1).all(-1)
        x = self._embed(pixels, pos, pad)
        angles = pos[..., None].float() * self.inv_freq  # (N, P, 2, head_dim / 4)
        ax, ay = angles[:, :, 0], angles[:, :, 1]
        turn = torch.cat((ax, ax, ay, ay), -1)
        cos, sin = turn.cos().to(x.dtype), turn.sin().to(x.dtype)
        for layer in self.encoder.layers:
            x = layer(x, cos, sin, ~pad)
        return self._pooled(x, pos, pad)

    def _embed(self, pixels, pos, pad):
        proj = self.patch_embedder.input_proj
        x = proj((2 * (pixels - 0.5)).to(proj.weight.dtype))  # Gemma 4 scales in the model
        table = self.patch_embedder.position_embedding_table
        at = pos.clamp(min=0)
        where = F.embedding(at[..., 0], table[0]) + F.embedding(at[..., 1], table[1])
        return x + torch.where(pad.unsqueeze(-1), 0.0, where)

    def _pooled(self, x, pos, pad):
        """Each k x k block of real patches averaged (in fp32), scaled by sqrt(width), the
        padding's tokens dropped; standardized where the checkpoint says."""
        k = self.kernel
        length = x.shape[1] // (k * k)
        x = x.masked_fill(pad.unsqueeze(-1), 0.0)
        at = pos.clamp(min=0)
        across = at[..., 0].max(dim=-1, keepdim=True)[0] + 1
        block = torch.div(at, k, rounding_mode="floor")
        block = block[..., 0] + (across // k) * block[..., 1]
        weights = F.one_hot(block.long(), length).float() / (k * k)
        pooled = weights.transpose(1, 2) @ x.float()
        real = ~(weights == 0).all(dim=1)
        h = pooled.to(x.dtype).float() * x.shape[-1] ** 0.5
        h = h[real]
        if self.standardize:
            h = (h - self.std_bias.float()) * self.std_scale.float()
        return h.to(x.dtype)


class Gemma4Projector(nn.Module):
    """embed_vision (Gemma4MultimodalEmbedder): a weightless RMSNorm, then one matrix."""

    name = "embed_vision"  # its module name in the checkpoint

    def __init__(self, v: dict, tokens: int, text_hidden: int):
        super().__init__()
        v = settings(v)
        self.embedding_pre_projection_norm = RMSNorm(
            v["hidden_size"], v.get("rms_norm_eps", 1e-6), scale=False
        )
        self.embedding_projection = nn.Linear(v["hidden_size"], text_hidden, bias=False)

    def forward(self, x):
        return self.embedding_projection(self.embedding_pre_projection_norm(x))
