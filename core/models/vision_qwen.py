"""Qwen's vision tower in the language model's forward pass (Qwen3-VL and Qwen3.5): a ViT over
an image's patches at its own resolution, and its merger, which folds merge_size x
merge_size patches into one token of the language model's width.

The tower: patches embedded by a Conv3d (a still image is two equal frames), learned
positions resampled bilinearly to the image's grid, 2-D rotary positions (row and column)
in every block's attention, attention within each image, pre-norm blocks. Qwen3-VL's
DeepStack also merges the features of chosen blocks (deepstack_visual_indexes) with mergers
of their own; those are added to the first language layers' outputs at the image's tokens.
The language model's positions are 3-D (M-RoPE: time, row, column; rope_index), built per
row and per packed example as transformers' get_rope_index builds them.

Module names are Hugging Face's (visual.patch_embed.proj, visual.blocks.0.attn.qkv, ...),
so the base's tensors load as they are. Images come as core.data.images.Patches (pixel values
and each image's grid, as transformers' pixel_values and image_grid_thw).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from core.models.vision import VisionOptions, place

EPS = 1e-6  # every LayerNorm of the tower and merger


class Seen(NamedTuple):
    """What images change in a forward: the stream with their embeddings, the attention
    mask, the 3-D positions (3, B, T) (None: the 1-D ones), DeepStack's additions."""

    x: torch.Tensor
    mask: object
    mrope: torch.Tensor | None
    deep: tuple | None  # (where (B, T), [features (N, D) per first language layers])


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class QwenVisionAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x, cos, sin, lengths: list[int]):
        n, d = x.shape
        q, k, v = self.qkv(x).reshape(n, 3, self.heads, -1).permute(1, 0, 2, 3).unbind(0)
        dtype = q.dtype
        q, k = q.float(), k.float()  # rotated in fp32, as transformers does
        cos, sin = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
        q = (q * cos + rotate_half(q) * sin).to(dtype)
        k = (k * cos + rotate_half(k) * sin).to(dtype)
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        out = [  # each image's patches see each other, and no other image's
            F.scaled_dot_product_attention(a, b, c)
            for a, b, c in zip(*(t.split(lengths, dim=2) for t in (q, k, v)), strict=True)
        ]
        y = torch.cat(out, dim=2).squeeze(0).transpose(0, 1).reshape(n, d)
        return self.proj(y)


class QwenVisionMLP(nn.Module):
    def __init__(self, width: int, inner: int, act: str):
        super().__init__()
        self.linear_fc1 = nn.Linear(width, inner)
        self.linear_fc2 = nn.Linear(inner, width)
        self.approximate = "tanh" if "tanh" in act else "none"

    def forward(self, x):
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate=self.approximate))


class QwenVisionBlock(nn.Module):
    def __init__(self, v: dict):
        super().__init__()
        width = v["hidden_size"]
        self.norm1 = nn.LayerNorm(width, eps=EPS)
        self.norm2 = nn.LayerNorm(width, eps=EPS)
        self.attn = QwenVisionAttention(width, v["num_heads"])
        act = v.get("hidden_act", "gelu_pytorch_tanh")
        self.mlp = QwenVisionMLP(width, v["intermediate_size"], act)

    def forward(self, x, cos, sin, lengths):
        x = x + self.attn(self.norm1(x), cos, sin, lengths)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """merge_size x merge_size patches' features (adjacent in the patch order) normed,
    concatenated and projected to the language model's width; DeepStack's mergers norm
    after concatenating (postshuffle)."""

    def __init__(self, v: dict, postshuffle: bool = False):
        super().__init__()
        self.width = v["hidden_size"] * v.get("spatial_merge_size", 2) ** 2
        self.postshuffle = postshuffle
        self.norm = nn.LayerNorm(self.width if postshuffle else v["hidden_size"], eps=EPS)
        self.linear_fc1 = nn.Linear(self.width, self.width)
        self.linear_fc2 = nn.Linear(self.width, v["out_hidden_size"])

    def forward(self, x):
        x = self.norm(x.view(-1, self.width) if self.postshuffle else x).view(-1, self.width)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class PatchEmbed(nn.Module):
    def __init__(self, channels: int, width: int, t: int, p: int):
        super().__init__()
        self.proj = nn.Conv3d(channels, width, (t, p, p), stride=(t, p, p))


class QwenTower(nn.Module):
    """Qwen3-VL's and Qwen3.5's vision model: Patches -> (merged features (tokens, D),
    DeepStack's merged features of its chosen blocks)."""

    def __init__(self, v: dict):
        super().__init__()
        width, self.merge = v["hidden_size"], v.get("spatial_merge_size", 2)
        t, p = v.get("temporal_patch_size", 2), v["patch_size"]
        self.channels, self.t, self.p = v.get("in_channels", 3), t, p
        self.patch_embed = PatchEmbed(self.channels, width, t, p)
        self.pos_embed = nn.Embedding(v["num_position_embeddings"], width)
        self.side = int(v["num_position_embeddings"] ** 0.5)
        self.blocks = nn.ModuleList(QwenVisionBlock(v) for _ in range(v["depth"]))
        self.merger = PatchMerger(v)
        self.deep_layers = list(v.get("deepstack_visual_indexes") or [])
        if self.deep_layers:
            self.deepstack_merger_list = nn.ModuleList(
                PatchMerger(v, postshuffle=True) for _ in self.deep_layers
            )
        self.spatial = width // v["num_heads"] // 2  # rotary dims of the row, and the column
        self.theta = float((v.get("rope_parameters") or {}).get("rope_theta", 10000.0))

    def forward(self, values, grid):
        proj = self.patch_embed.proj
        x = values.view(-1, self.channels, self.t, self.p, self.p).to(proj.weight.dtype)
        x = proj(x).view(-1, proj.out_channels)
        x = x + self.positions(grid).to(x.dtype)
        cos, sin = self.rotary(grid)
        lengths = [int(t * h * w) for t, h, w in grid.tolist()]
        deep = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, lengths)
            if i in self.deep_layers:
                deep.append(self.deepstack_merger_list[self.deep_layers.index(i)](x))
        return self.merger(x), deep

    def _rows_cols(self, grid):
        """Each patch's row and column in its image, in the tower's order (merge blocks of
        merge x merge patches together, frames repeated)."""
        m, rows, cols = self.merge, [], []
        for t, h, w in grid.tolist():
            r = torch.arange(h, device=grid.device)[:, None].expand(h, w)
            c = torch.arange(w, device=grid.device)[None, :].expand(h, w)
            shape = (h // m, m, w // m, m)
            rows.append(r.reshape(shape).transpose(1, 2).flatten().repeat(t))
            cols.append(c.reshape(shape).transpose(1, 2).flatten().repeat(t))
        return torch.cat(rows), torch.cat(cols), grid

    def positions(self, grid):
        """The learned square table of positions resampled to each image's grid (bilinear,
        corners aligned), as transformers gathers and weights it."""
        rows, cols, _ = self._rows_cols(grid)
        hs = torch.cat([torch.full((t * h * w,), h) for t, h, w in grid.tolist()])
        ws = torch.cat([torch.full((t * h * w,), w) for t, h, w in grid.tolist()])
        h_taps, h_weights = self._taps(rows.cpu(), hs)
        w_taps, w_weights = self._taps(cols.cpu(), ws)
        index = (h_taps[:, :, None] * self.side + w_taps[:, None, :]).reshape(-1, 4)
        weight = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, 4)
        table = self.pos_embed.weight
        index, weight = index.to(table.device), weight.to(table.device)
        return (self.pos_embed(index) * weight[:, :, None]).sum(1)

    def _taps(self, index, size):
        side = self.side
        src = index.float() * (side - 1) / torch.clamp(size - 1, min=1)
        floor = torch.floor(src)
        offsets = torch.arange(0, 2)
        taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)
        weights = (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
        return taps, weights

    def rotary(self, grid):
        """cos and sin (patches, head) of each patch's row (first half) and column."""
        rows, cols, _ = self._rows_cols(grid)
        steps = torch.arange(0, self.spatial, 2, dtype=torch.float) / self.spatial
        inv = (1.0 / self.theta**steps).to(self.pos_embed.weight.device)  # fp32 in any dtype
        pos = torch.stack([rows, cols], dim=-1).to(inv.device)
        freqs = pos[..., None].float() * inv
        both = torch.cat([freqs[:, 0], freqs[:, 1]], dim=-1)
        emb = torch.cat([both, both], dim=-1)
        return emb.cos(), emb.sin()


class QwenVision(nn.Module):
    """A Qwen composite's vision model (named `visual`, as in the checkpoint): Patches ->
    the language model's embeddings of its images' tokens, DeepStack's features, and the
    3-D positions of the rows that hold them."""

    def __init__(self, o: VisionOptions):
        super().__init__()
        self.options = o
        self.visual = QwenTower(o.config)
        self.merge = o.config.get("spatial_merge_size", 2)

    def forward(self, patches):
        """Patches -> ((tokens, D) merged features in order, [DeepStack's (tokens, D)])."""
        trains = any(p.requires_grad for p in self.parameters())
        with torch.set_grad_enabled(trains and torch.is_grad_enabled()):
            return self.visual(patches.values, patches.grid)

    def see(self, idx, x, patches, mask=None, restart=None, valid=None) -> Seen:
        """The images' embeddings at their tokens, DeepStack's features for the first
        language layers, and each row's 3-D positions (restart (B, T): where a packed
        example begins; valid (B, T): False over padding)."""
        embeds, deep = self(patches)
        where = idx == self.options.token_id
        x = place(x, where, embeds)
        positions, _ = rope_index(where, patches.grid, self.merge, restart, valid)
        return Seen(x, mask, positions, (where, deep) if deep else None)

    def place(self, idx, x, patches, mask=None):
        return self.see(idx, x, patches, mask)[:2]

    def cached_masks(self, masks: dict, q_pos, k_pos, k_valid, ids) -> dict:
        return masks  # causal among an image's tokens, as any text's


def rope_index(is_image, grid, merge: int, restart=None, valid=None):
    """3-D positions (3, B, T) of each row and each row's delta (B,): the furthest position
    + 1 minus its tokens, which the tokens generated after it add (as transformers'
    get_rope_index and rope_deltas). Text takes one position on all three axes; an image's
    tokens its row and column on the grid of merged patches, from the position after the
    text before it; the text after an image continues from its start + its longer side.
    restart (B, T): packed examples' first tokens, where positions start again from 0.
    valid (B, T): False over padding (given position 0, as transformers does)."""
    b, t = is_image.shape
    device = is_image.device
    keep = valid if valid is not None else torch.ones_like(is_image)
    rows = torch.arange(b, device=device)[:, None].expand(b, t)[keep]  # each token's row
    image = is_image[keep]  # the tokens in order, row after row, padding left out
    n = image.shape[0]
    firsts = torch.ones(n, dtype=torch.bool, device=device)
    firsts[1:] = rows[1:] != rows[:-1]  # a row starts an example too
    if restart is not None:
        firsts |= restart[keep]
    grid = grid.to(device)
    h, w = grid[:, 1] // merge, grid[:, 2] // merge
    sizes = grid[:, 0] * h * w
    ends = sizes.cumsum(0)
    k = image.long().cumsum(0) - 1  # an image token's number among all images' tokens
    which = torch.searchsorted(ends, k.clamp(min=0), right=True).clamp(max=len(grid) - 1)
    offset = k - (ends - sizes)[which]
    # what each token adds to the position after it: a text token 1, an image its longer
    # side (merged) at its last token, so all of its tokens start from the same position
    last = image & (offset == sizes[which] - 1)
    step = torch.where(image, 0, 1) + torch.where(last, torch.maximum(h, w)[which], 0)
    before = step.cumsum(0) - step
    example = firsts.long().cumsum(0) - 1
    pos = before - before[firsts][example]
    hw = (h * w)[which]
    extra = torch.stack([offset // hw, offset // w[which] % h[which], offset % w[which]])
    found = pos[None] + torch.where(image[None], extra, 0)
    out = torch.zeros(3, b, t, dtype=torch.long, device=device)
    out[:, keep] = found
    top = torch.full((b,), -1, dtype=torch.long, device=device)
    top = top.scatter_reduce(0, rows, found.amax(0), "amax")
    deltas = top + 1 - keep.sum(1)
    return out, torch.where(keep.any(1), deltas, 0)
