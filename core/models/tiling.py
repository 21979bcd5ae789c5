"""Long sequences in pieces: the MLP over tiles of tokens and attention over chunks of queries,
each piece checkpointed, so that neither the MLP's (tokens x ffn) intermediate nor a (T x T)
score matrix or mask ever exists whole, forward or backward. Results equal the whole
computation's within fp32 rounding (tests/core/test_tiling.py).

A piece's checkpoint keeps only its input (a view of the tensor the caller holds anyway) and
makes everything else again in backward, one piece at a time. Under torch.compile pieces are
not cut: the compiler chooses what to keep and recompute itself.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

# Tokens of one MLP tile; a sequence longer than this runs its MLP in tiles. At 2,048 tokens
# SmolLM2's SwiGLU intermediate (3 x 1536 wide) is 38 MB a tile in fp32.
MLP_TILE_TOKENS = 2048
# Queries of one attention chunk where attention would otherwise hold T x T numbers: at 1,024
# queries and 16k keys, 9 heads of fp32 scores are 600 MB (mask: 16 MB a chunk, not 256).
ATTN_CHUNK_QUERIES = 1024


def cutting() -> bool:
    return not torch.compiler.is_compiling()


def tiled(fn, x: torch.Tensor, tile: int) -> torch.Tensor:
    """fn(x) for a row-wise fn (each token's output depends on that token alone, as an MLP's),
    computed over tiles of `tile` tokens of x (..., D); each tile checkpointed."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] <= tile or not cutting():
        return fn(x)
    outs = [
        checkpoint(fn, rows[i : i + tile], use_reentrant=False)
        for i in range(0, rows.shape[0], tile)
    ]
    return torch.cat(outs).view(*x.shape[:-1], outs[0].shape[-1])


def query_chunks(t: int, chunk: int) -> list[tuple[int, int]]:
    return [(i, min(t, i + chunk)) for i in range(0, t, chunk)]


class Segments:
    """Packed examples (B, T), numbered: a query sees the keys of its own example. The mask is
    made a block of query rows at a time, so a long packed row never holds T x T of it."""

    def __init__(self, ids: torch.Tensor):
        self.ids = ids

    def rows(self, i: int, j: int) -> torch.Tensor:
        """(B, 1, j - i, j): whether queries i..j-1 and keys 0..j-1 share an example."""
        return (self.ids[:, i:j, None] == self.ids[:, None, :j]).unsqueeze(1)


def causal_rows(
    i: int, j: int, device, window: int | None = None, mask: Segments | None = None
) -> torch.Tensor:
    """The keys 0..j-1 that queries i..j-1 see under causal attention (within the sliding
    window where one is given, within their own packed example where mask is given)."""
    r = torch.arange(i, j, device=device)[:, None]
    c = torch.arange(j, device=device)[None, :]
    rows = r >= c
    if window is not None:
        rows = rows & (r - c < window)
    return rows if mask is None else mask.rows(i, j) & rows


def chunked_causal(attend, q, k, v, chunk: int, window: int | None = None, mask=None):
    """Causal attention of q (B, H, T, hd) over k, v (B, H|Hkv, T, hd) in chunks of queries:
    attend(q_rows, k_upto, v_upto, mask_rows) for each chunk, checkpointed; the chunk's mask
    is made for it (causal, the window, its rows of the packed examples), never the whole
    T x T. Keys past a chunk's
    last query are left out: causal attention gives them no weight."""
    t = q.shape[2]
    if t <= chunk or not cutting():
        return attend(q, k, v, causal_rows(0, t, q.device, window, mask))
    outs = []
    for i, j in query_chunks(t, chunk):
        outs.append(
            checkpoint(
                _attend_rows,
                attend,
                q[:, :, i:j],
                k[:, :, :j],
                v[:, :, :j],
                i,
                window,
                mask,
                use_reentrant=False,
            )
        )
    return torch.cat(outs, dim=2)


def _attend_rows(attend, q, k, v, i: int, window, mask):
    # The mask is made inside the checkpoint, so backward makes it again rather than keep it.
    j = k.shape[2]
    return attend(q, k, v, causal_rows(i, j, q.device, window, mask))


def tiles(x: torch.Tensor, tile: int) -> bool:
    """Whether a row-wise layer over x (B, T, D) runs in tiles of `tile` tokens (0: never):
    where a sequence is longer than a tile. A batch of short sequences stays whole, as the
    tiles' recomputation costs time that only long sequences need to spend."""
    return x.dim() > 2 and tiles_at(x.shape[-2], tile) and cutting()


def tiles_at(tokens: int, tile: int = MLP_TILE_TOKENS) -> bool:
    """Whether sequences of `tokens` run a row-wise layer in tiles of `tile` (0: never), outside
    torch.compile: tiles(x) for the model, and the memory estimate for a context."""
    return bool(tile) and tokens > tile
