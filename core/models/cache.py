"""The key/value cache of GPT.forward_cached, and which keys each new token may see.

Rows of a batch may be padded on either side: every key carries its position in its own row
and whether it is a token (False: padding), so a query sees the tokens of its row at or before
its position (within the window on a sliding layer), wherever they sit in the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KVCache:
    """What forward_cached keeps of the tokens it has seen (K columns of B rows)."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]  # one (k, v) a block: (B, heads, K, dim)
    positions: torch.Tensor  # (B, K) each key's position in its row
    valid: torch.Tensor  # (B, K) False over padding
    ids: torch.Tensor  # (B, K) the tokens: LongRoPE's switch makes the keys again from them
    long: torch.Tensor  # (B,) rows whose keys use LongRoPE's long factors
    # Qwen's images: what the rotary positions of later tokens add to their 1-D ones (B,)
    rope_delta: torch.Tensor | None = None

    def lengths(self) -> torch.Tensor:
        """Each row's tokens so far (B,)."""
        return self.valid.sum(1)


def row_positions(valid: torch.Tensor, before: torch.Tensor | None = None) -> torch.Tensor:
    """Positions of new columns (B, T): each token follows its row's tokens (before: the
    counts already cached, (B,)); padding takes its row's last position (it is masked)."""
    positions = valid.long().cumsum(1) - 1
    if before is not None:
        positions = positions + before[:, None]
    return positions.clamp(min=0)


def attention_mask(
    q_pos: torch.Tensor, k_pos: torch.Tensor, k_valid: torch.Tensor, window: int | None
) -> torch.Tensor:
    """(B, 1, T, K): a query (the last T columns) sees the tokens of its row at or before its
    position, the last `window` positions on a sliding layer. Each query also sees its own
    column, so a padding query has one key (a row of no keys would be NaN)."""
    t, k = q_pos.shape[1], k_pos.shape[1]
    gap = q_pos[:, :, None] - k_pos[:, None, :]
    allowed = k_valid[:, None, :] & (gap >= 0)
    if window is not None:
        allowed &= gap < window
    column = torch.arange(k, device=k_pos.device)
    own = column[None, :] == (k - t + torch.arange(t, device=k_pos.device))[:, None]
    return (allowed | own).unsqueeze(1)


def masks_for(
    windows: set, q_pos, k_pos, k_valid: torch.Tensor, first: bool
) -> dict[int | None, torch.Tensor | None]:
    """The mask of each layer kind (its window, None: full attention). None where plain
    attention does the same: a first pass without padding is causal, and one new token
    after unpadded keys that all fit in the window sees them all. first: no cache before."""
    plain = bool(k_valid.all())
    one = q_pos.shape[1] == 1
    out = {}
    for w in windows:
        fits = w is None or k_pos.shape[1] <= w
        if plain and (first or (one and fits)):
            out[w] = None
        else:
            out[w] = attention_mask(q_pos, k_pos, k_valid, w)
    return out
