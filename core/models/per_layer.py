"""Gemma 4's per-layer options of the model (core.models.model), each off by default:

- per-layer input embeddings: a second table gives each token a small vector for every layer
  (vocab x layers*dim, one table), mixed with a projection of its main embedding; each layer
  gates its vector with the stream and adds the result back (PerLayerInputs, PerLayerGate);
- full-attention layers with a head size and kv-head count of their own (layer_shape);
- KV sharing: the last kv_shared_layers layers project no keys or values and reuse those of
  the last earlier layer of their kind (kv_source); with wide_shared_mlp their MLP is twice
  as wide;
- k_eq_v: a full-attention layer's values are its keys' projection (attn_sizes).

As transformers 5.24's models/gemma4 computes them. GPTConfig.per_layer holds them (PerLayer);
None: none of them.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F

SLIDING = "sliding_attention"


@dataclasses.dataclass(frozen=True, kw_only=True)
class PerLayer:
    """Gemma 4's per-layer options (GPTConfig.per_layer); each default leaves the model as it
    was."""

    input_dim: int | None = None  # per-layer input embeddings: each layer's vector size
    input_vocab: int | None = None  # their table's rows; None: the model's vocab_size
    full_head_dim: int | None = None  # full-attention layers' own head size
    full_kv_heads: int | None = None  # and their own kv-head count
    k_eq_v: bool = False  # full-attention layers: the values are the keys' projection
    v_norm: bool = False  # an RMSNorm without scale over each value head
    kv_shared_layers: int = 0  # the last n layers reuse an earlier layer's keys and values
    wide_shared_mlp: bool = False  # and have an MLP twice ffn_dim wide
    layer_scalar: bool = False  # each layer's output times a scalar of its weights


OFF = PerLayer()
# GPTConfig's own fields before they became one block (runs saved before): old name -> new
FLAT = {
    "per_layer_dim": "input_dim",
    "per_layer_vocab": "input_vocab",
    "full_head_dim": "full_head_dim",
    "full_kv_heads": "full_kv_heads",
    "k_eq_v": "k_eq_v",
    "v_norm": "v_norm",
    "kv_shared_layers": "kv_shared_layers",
    "wide_shared_mlp": "wide_shared_mlp",
    "layer_scalar": "layer_scalar",
}


def of(c) -> PerLayer:
    """c's per-layer options (OFF where it has none)."""
    return c.per_layer or OFF


def from_saved(value) -> PerLayer | None:
    """GPTConfig.per_layer from what a saved config holds: the block, its dict, or None."""
    if value is None or isinstance(value, PerLayer):
        return value
    return PerLayer(**value)


def folded(saved: dict) -> dict:
    """A saved GPTConfig mapping with the flat fields of older runs folded into per_layer
    (a block with every option off becomes None)."""
    flat = {new: saved[old] for old, new in FLAT.items() if old in saved}
    out = {k: v for k, v in saved.items() if k not in FLAT}
    if flat and "per_layer" not in out:
        block = PerLayer(**flat)
        out["per_layer"] = None if block == OFF else block
    return out


def is_full(c, layer: int) -> bool:
    """Whether layer `layer` is a full-attention layer (every layer without layer_types)."""
    return not (c.layer_types and c.layer_types[layer] == SLIDING)


def kv_source(c, layer: int) -> int | None:
    """The layer whose keys and values layer `layer` reuses (None: its own): the last layer
    before the shared ones of the same kind. ValueError when there is none."""
    shared = of(c).kv_shared_layers
    first = c.n_layers - shared
    if not shared or layer < first:
        return None
    full = is_full(c, layer)
    for j in range(first - 1, -1, -1):
        if is_full(c, j) == full:
            return j
    kind = "full-attention" if full else "sliding"
    raise ValueError(
        f"layer {layer} is {kind} but no earlier layer of that kind makes keys and values to share"
    )


def kv_sources(c) -> set[int]:
    """The layers whose keys and values later layers reuse."""
    return {s for i in range(c.n_layers) if (s := kv_source(c, i)) is not None}


def layer_shape(c, layer: int):
    """c with layer `layer`'s own head size, kv heads and MLP width (c itself if none)."""
    p, changes = of(c), {}
    if is_full(c, layer):
        if p.full_head_dim:
            changes["head_dim"] = p.full_head_dim
        if p.full_kv_heads:
            changes["n_kv_heads"] = p.full_kv_heads
    if p.wide_shared_mlp and kv_source(c, layer) is not None:
        changes["ffn_dim"] = 2 * c.ffn_dim
    return dataclasses.replace(c, **changes) if changes else c


def attn_sizes(c, layer: int) -> tuple[int, ...]:
    """The output widths of layer `layer`'s fused q/k/v Linear (c: layer_shape's): q only on a
    layer that reuses keys and values, q and k where values are the keys (k_eq_v)."""
    gate = 2 if c.attn_output_gate else 1  # Qwen3.5: q with its output gate, twice as wide
    q, kv = c.n_heads * c.head_dim * gate, c.n_kv_heads * c.head_dim
    if kv_source(c, layer) is not None:
        return (q,)
    if of(c).k_eq_v and is_full(c, layer):
        return (q, kv)
    return (q, kv, kv)


def unit_rms(x, eps: float):
    """RMSNorm without a scale, in fp32 (Gemma 4's v_norm and router norm)."""
    h = x.float()
    return (h * torch.pow(h.pow(2).mean(-1, keepdim=True) + eps, -0.5)).to(x.dtype)


class PerLayerInputs(nn.Module):
    """Each token's input to every layer (B, T, layers, dim): its row of the per-layer table
    scaled by sqrt(dim), plus its main embedding projected and normed per layer, over sqrt 2.
    norm: the model's norm maker (core.models.model.make_norm)."""

    def __init__(self, c, norm):
        super().__init__()
        self.layers, self.dim = c.n_layers, c.per_layer.input_dim
        self.table = nn.Embedding(c.per_layer.input_vocab or c.vocab_size, self.layers * self.dim)
        self.proj = nn.Linear(c.hidden_dim, self.layers * self.dim, bias=False)
        self.norm = norm(c, self.dim)
        self.proj_scale = c.hidden_dim**-0.5

    def forward(self, idx, x):
        shape = (*idx.shape, self.layers, self.dim)
        own = self.table(idx)
        own = own * torch.tensor(self.dim**0.5, dtype=own.dtype)
        mixed = self.norm((self.proj(x) * self.proj_scale).reshape(shape))
        return (mixed + own.reshape(shape)) * 2.0**-0.5


class PerLayerGate(nn.Module):
    """A layer's use of its input: x + norm(proj(gelu(gate(x)) * input))."""

    def __init__(self, c, norm):
        super().__init__()
        self.gate = nn.Linear(c.hidden_dim, c.per_layer.input_dim, bias=False)
        self.up = nn.Linear(c.per_layer.input_dim, c.hidden_dim, bias=False)
        self.norm = norm(c)

    def forward(self, x, inputs):
        h = F.gelu(self.gate(x), approximate="tanh") * inputs
        return x + self.norm(self.up(h))


@dataclasses.dataclass
class Side:
    """What a forward pass hands its blocks beside the stream: the per-layer inputs (B, T,
    layers, dim) or None, and the keys and values of the layers others reuse, by layer."""

    inputs: torch.Tensor | None = None
    kv: dict = dataclasses.field(default_factory=dict)

    def layer_input(self, layer: int):
        return None if self.inputs is None else self.inputs[:, :, layer]


def varies(c) -> bool:
    """Whether c's layers differ in shape (any of this module's options on)."""
    p = of(c)
    return bool(p.full_head_dim or p.full_kv_heads or p.kv_shared_layers or p.input_dim or p.k_eq_v)


def table_params(c) -> int:
    """The per-layer input table's weights: looked up, never multiplied (0 without one)."""
    p = of(c)
    if not p.input_dim:
        return 0
    return (p.input_vocab or c.vocab_size) * c.n_layers * p.input_dim
