"""Generation speed with and without the KV cache.

    python benchmarks/generate.py [--hidden 256] [--layers 4] [--context 512] [--tokens 400]

A randomly initialised model of the given size (speed does not depend on training): tokens/s
generating --tokens tokens after a one-token prompt, greedy, on the CPU. Without the cache
each token re-runs the whole window (O(n^2) work); with it, one token's worth (O(n)).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.models.model import GPT, GPTConfig  # noqa: E402
from core.use.generate import generate_ids  # noqa: E402


def tokens_per_s(model: GPT, n: int, use_cache: bool) -> float:
    t0 = time.perf_counter()
    out = list(generate_ids(model, [10], n, temperature=0, use_cache=use_cache))
    assert len(out) == n
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=400)
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = GPTConfig(
        hidden_dim=args.hidden, n_layers=args.layers, n_heads=args.heads, seq_len=args.context
    )
    model = GPT(cfg).eval()
    tokens_per_s(model, 8, True)  # warm-up
    cached = tokens_per_s(model, args.tokens, True)
    full = tokens_per_s(model, args.tokens, False)
    print(
        f"model: hidden {args.hidden}, layers {args.layers}, context {args.context}, "
        f"{model.num_params():,} parameters, CPU threads {torch.get_num_threads()}"
    )
    print(f"{'':<22}{'tokens/s':>10}")
    print(f"{'with KV cache':<22}{cached:>10.1f}")
    print(f"{'without cache':<22}{full:>10.1f}")
    print(f"{'speed-up':<22}{cached / full:>9.1f}x")


if __name__ == "__main__":
    main()
