"""A vision tower in the language model's forward pass: the tower and its projector turn an
image's pixel values into embeddings, which take the place of the image's tokens in the
language model's input; Gemma 3's image tokens also see each other both ways.

Built from plain options (core.weights.vision reads them from the checkpoint), with module
names as Hugging Face's, so the base's tensors load as they are. Attached to a GPT as
`model.vision` (attach); GPT.forward and forward_cached take `images=` (N, 3, H, W pixel
values of the images in the order their tokens come). Frozen unless trained.

Gemma 3: SigLIP (patches of a fixed-size image, learned positions, pre-norm layers) and its
projector (patch features pooled to mm_tokens_per_image, a Gemma RMSNorm, one matrix).
Gemma 4: its encoder and embed_vision (core.models.vision_gemma4): images of their own aspect
ratio, each its own count of tokens, which see each other in the sliding layers only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from core.models.cache import attention_mask
from core.models.vision_gemma4 import Gemma4Projector, Gemma4VisionTower


@dataclass(frozen=True)
class VisionOptions:
    """What the forward pass needs beside the tower's config: the class's kind, the image
    token, the tokens an image gives, the language model's width, and whether an image's
    tokens attend to each other both ways (Gemma 3)."""

    kind: str  # "gemma3", "gemma4"
    config: dict  # the checkpoint's vision_config
    token_id: int
    tokens: int  # embeddings an image gives (Gemma 4: at most; its count varies per image)
    text_hidden: int
    bidirectional: bool = False
    # Qwen (core.models.vision_qwen): the language model's interleaved M-RoPE sections
    # (time, height, width rotary pairs), which its 3-D positions turn by
    mrope_section: tuple | None = None
    # Gemma 4: an image's tokens see each other in the sliding layers only (full: causal)
    sliding_only: bool = False
    # Gemma 4: the id its per-layer table reads at an image token (the pad token's)
    text_id: int | None = None


class SiglipAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (
            p(x).view(b, t, self.heads, d // self.heads).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        y = F.scaled_dot_product_attention(q, k, v)  # every patch sees every patch
        return self.out_proj(y.transpose(1, 2).reshape(b, t, d))


class SiglipMLP(nn.Module):
    def __init__(self, width: int, inner: int, act: str):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, inner), nn.Linear(inner, width)
        self.approximate = "tanh" if "tanh" in act else "none"

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


class SiglipLayer(nn.Module):
    def __init__(self, v: dict):
        super().__init__()
        width, eps = v["hidden_size"], v.get("layer_norm_eps", 1e-6)
        self.layer_norm1 = nn.LayerNorm(width, eps=eps)
        self.self_attn = SiglipAttention(width, v["num_attention_heads"])
        self.layer_norm2 = nn.LayerNorm(width, eps=eps)
        act = v.get("hidden_act", "gelu_pytorch_tanh")
        self.mlp = SiglipMLP(width, v["intermediate_size"], act)

    def forward(self, x):
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class SiglipTower(nn.Module):
    """SigLIP's vision transformer (no pooling head: Gemma 3 reads every patch)."""

    def __init__(self, v: dict):
        super().__init__()
        width, patch = v["hidden_size"], v["patch_size"]
        self.embeddings = nn.Module()
        self.embeddings.patch_embedding = nn.Conv2d(
            v.get("num_channels", 3), width, patch, stride=patch
        )
        self.embeddings.position_embedding = nn.Embedding((v["image_size"] // patch) ** 2, width)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(SiglipLayer(v) for _ in range(v["num_hidden_layers"]))
        self.post_layernorm = nn.LayerNorm(width, eps=v.get("layer_norm_eps", 1e-6))

    def forward(self, pixels):
        conv = self.embeddings.patch_embedding
        x = conv(pixels.to(conv.weight.dtype)).flatten(2).transpose(1, 2)
        x = x + self.embeddings.position_embedding.weight
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)


class Gemma3Projector(nn.Module):
    """Patch features average-pooled to tokens per side squared, normed (Gemma's 1 + w, in
    fp32) and projected to the language model's width."""

    def __init__(self, v: dict, tokens: int, text_hidden: int):
        super().__init__()
        width = v["hidden_size"]
        self.eps = v.get("layer_norm_eps", 1e-6)
        self.mm_input_projection_weight = nn.Parameter(torch.zeros(width, text_hidden))
        self.mm_soft_emb_norm = nn.Module()
        self.mm_soft_emb_norm.weight = nn.Parameter(torch.zeros(width))
        self.patches = v["image_size"] // v["patch_size"]
        self.kernel = self.patches // int(tokens**0.5)

    def forward(self, x):
        n, _, d = x.shape
        grid = x.transpose(1, 2).reshape(n, d, self.patches, self.patches)
        pooled = F.avg_pool2d(grid, self.kernel, self.kernel).flatten(2).transpose(1, 2)
        h = pooled.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = (h * (1.0 + self.mm_soft_emb_norm.weight.float())).to(pooled.dtype)
        return (h @ self.mm_input_projection_weight).to(x.dtype)


# The towers built so far, by the kind a family's vision options name: (tower, projector).
TOWERS: dict[str, tuple[type[nn.Module], type[nn.Module]]] = {
    "gemma3": (SiglipTower, Gemma3Projector)
}
TOWERS["gemma4"] = (Gemma4VisionTower, Gemma4Projector)


class Vision(nn.Module):
    """A checkpoint's tower and projector: pixel values -> the language model's embeddings of
    its images' tokens, placed where those tokens are."""

    def __init__(self, o: VisionOptions):
        super().__init__()
        if o.kind not in TOWERS:
            raise ValueError(f"vision: {o.kind!r} towers are not built")
        tower, projector = TOWERS[o.kind]
        self.options = o
        self.vision_tower = tower(o.config)
        # the projector under the checkpoint's name (Gemma 4: embed_vision)
        self.projector_name = getattr(projector, "name", "multi_modal_projector")
        setattr(self, self.projector_name, projector(o.config, o.tokens, o.text_hidden))

    def forward(self, pixels):
        """(N, 3, H, W) -> (N * tokens, text width): the images' embeddings in order
        (Gemma 4: its joined patches, core.models.vision_gemma4)."""
        trains = any(p.requires_grad for p in self.parameters())
        projector = getattr(self, self.projector_name)
        with torch.set_grad_enabled(trains and torch.is_grad_enabled()):
            out = projector(self.vision_tower(pixels))
        return out.reshape(-1, out.shape[-1])

    def see(self, idx, x, pixels, mask=None, restart=None, valid=None):
        """place's (x, mask), and no 3-D positions nor DeepStack features (Qwen's see:
        core.models.vision_qwen)."""
        return (*self.place(idx, x, pixels, mask), None, None)

    def place(self, idx, x, pixels, mask=None):
        """x (B, T, D) with the images' embeddings at their tokens, and the attention mask
        with each image's tokens seeing each other (Gemma 3): an ImageBlocks over mask
        (packed examples' Segments, or None)."""
        x = place(x, idx == self.options.token_id, self(pixels))
        if self.options.bidirectional:
            mask = ImageBlocks(idx == self.options.token_id, mask)
        return x, mask

    def cached_masks(self, masks: dict, q_pos, k_pos, k_valid, ids) -> dict:
        """forward_cached's masks with each image's tokens seeing each other (Gemma 3): the
        new queries over every key, the cached ones' ids (B, K) included."""
        if not self.options.bidirectional:
            return masks
        blocks = block_ids(ids == self.options.token_id)
        t = q_pos.shape[1]
        q_blocks = blocks[:, -t:]
        same = (q_blocks[:, :, None] == blocks[:, None, :]) & (q_blocks[:, :, None] >= 0)
        same = same & k_valid[:, None, :]
        out = {}
        for w, m in masks.items():
            if not both_ways(self.options, w):
                out[w] = m
                continue
            base = attention_mask(q_pos, k_pos, k_valid, w) if m is None else m
            extra = same
            if w is not None:  # a sliding layer: keys within the window behind the query
                extra = extra & (k_pos[:, None, :] > q_pos[:, :, None] - w)
            out[w] = base | extra.unsqueeze(1)
        return out


def both_ways(o: VisionOptions, window) -> bool:
    """Whether a layer of this attention window (None: full) lets an image's tokens see each
    other (Gemma 3: every layer; Gemma 4: sliding layers only; Qwen: none)."""
    return o.bidirectional and not (o.sliding_only and window is None)


def text_ids(o: VisionOptions, idx):
    """idx as the per-layer inputs read it: image tokens as the pad token (Gemma 4)."""
    if o.text_id is None:
        return idx
    return torch.where(idx == o.token_id, o.text_id, idx)


def place(x, where, embeds):
    """x (B, T, D) with embeds (N, D) at the positions where (B, T) is True, in order."""
    n = int(where.sum())
    if n != embeds.shape[0]:
        raise ValueError(f"images: {n} image tokens for {embeds.shape[0]} image embeddings")
    return x.masked_scatter(where.unsqueeze(-1), embeds.to(x.dtype))


def block_ids(is_image):
    """Each image's tokens numbered (a run of image tokens is one image), -1 elsewhere."""
    before = F.pad(is_image, (1, 0), value=False)[:, :-1]
    group = torch.cumsum((is_image & ~before).int(), dim=1) - 1
    return torch.where(is_image, group, torch.full_like(group, -1))


class ImageBlocks:
    """A forward's attention mask where an image's tokens see each other both ways (Gemma 3:
    causal OR same image; a sliding layer's window behind each query kept), within packed
    examples where segments are given. Made whole (B, 1, T, T): chunks of queries cannot
    hold the keys ahead of them (core.models.model's attention asks `bidirectional`)."""

    bidirectional = True

    def __init__(self, is_image, segments=None):
        self.blocks = block_ids(is_image)
        self.segments = segments

    def whole(self, t: int, window: int | None, device) -> torch.Tensor:
        r = torch.arange(t, device=device)[:, None]
        c = torch.arange(t, device=device)[None, :]
        b = self.blocks
        same = (b[:, :, None] == b[:, None, :]) & (b[:, :, None] >= 0)
        m = (r >= c)[None] | same
        if window is not None:
            m = m & (c > r - window)[None]
        if self.segments is not None:
            ids = self.segments.ids
            m = m & (ids[:, :, None] == ids[:, None, :])
        return m.unsqueeze(1)


def train(vision: Vision, rank: int = 0, alpha: float = 1.0, dropout: float = 0.0) -> Vision:
    """A tower and projector made trainable (--train-vision): LoRA on their linear layers at
    rank > 0 (core.models.lora.adapt_vision), every weight at rank 0 (full fine-tuning)."""
    from core.models import lora

    if rank:
        lora.adapt_vision(vision, rank, alpha, dropout)
    else:
        vision.requires_grad_(True)
    return vision


def attach(model, vision: Vision, trains: bool | None = False) -> None:
    """model.vision = vision, frozen unless trains (--train-vision); None: as it is (made
    trainable already, core.training.inputs.train_tower)."""
    if trains is not None:
        vision.requires_grad_(trains)
    model.vision = vision
