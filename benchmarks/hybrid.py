"""A LoRA step of a hybrid Qwen3.5 against transformers' own model (its torch fallback of the
delta rule, no flash-linear-attention) + peft, CPU fp32:

    python benchmarks/hybrid.py [--steps 3] [--warmup 1] [--batch 2] [--seq 128] [--threads 2]

Builds a random Qwen3.5 from transformers' Qwen3_5TextConfig (about 0.33B parameters: 16
layers, 12 Gated DeltaNet + 4 attention, width 1024, a 32k vocabulary so the step is the
layers' and not the head's), saves it in a temporary folder and fine-tunes it with LoRA
(rank 16, alpha 32, every projection: TrainDeck's attention and DeltaNet input projections are
one fused Linear each) on random token windows, each side in a fresh process (benchmarks/
finetune.py's sides, same batches, AdamW). Prints tokens/s and peak RSS per side, then where
TrainDeck's step goes: one DeltaNet layer (and its delta rule alone, the chunks), one
attention layer, one MLP, the head and loss, each forward + backward, times their counts.
Needs the test extras (transformers, peft).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import finetune  # noqa: E402  (its sides, batches and RSS readings)

SHAPE = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=16,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=128,
    linear_num_key_heads=8,
    linear_num_value_heads=16,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    max_position_embeddings=4096,
    vocab_size=32768,
    tie_word_embeddings=True,
)
PEFT_TARGETS = [
    *finetune.PEFT_TARGETS,
    *("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"),
]


def build(folder: Path, tokens: Path, shape: dict | None = None) -> int:
    import numpy as np
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from tests.hf_models import make_tokenizer

    make_tokenizer(folder, "qwen3_5")
    torch.manual_seed(0)
    shape = shape or SHAPE
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**shape, initializer_range=0.02))
    model.save_pretrained(folder)
    ids = np.random.default_rng(0).integers(0, shape["vocab_size"], 200_000)
    np.save(tokens, ids.astype(np.int64))
    return model.num_parameters()


def side(a, folder: Path, tokens: Path, name: str) -> dict:
    cmd = [sys.executable, __file__, "--one-side", name, "--model", str(folder)]
    cmd += ["--tokens", str(tokens)]
    for flag in ("steps", "warmup", "threads", "batch", "seq"):
        cmd += [f"--{flag}", str(getattr(a, flag))]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def timed(fn, reps: int = 3) -> float:
    """Median seconds of fn() after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def parts(a) -> dict:
    """Seconds of one forward + backward of each kind of piece at the step's tokens, and how
    many of each a step runs."""
    import torch

    from core.models.loss import lm_loss
    from core.models.model import rope_frequencies

    torch.set_num_threads(a.threads)
    a.mode, a.rank, a.alpha, a.side = "lora", 16, 32.0, "td"
    model, _, _ = finetune.traindeck_model(a)
    b, t, d = a.batch, a.seq, model.config.hidden_dim
    x = torch.randn(b, t, d, requires_grad=True)
    angles = torch.outer(torch.arange(t).float(), rope_frequencies(model.config))
    rope = (torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin())
    linear = next(blk for blk in model.blocks if blk.linear)
    full = next(blk for blk in model.blocks if not blk.linear)
    net = linear.attn

    def rule():
        g = torch.Generator().manual_seed(0)
        q, k = (torch.randn(b, t, net.n_k, net.dk, generator=g) for _ in "qk")
        v = torch.randn(b, t, net.n_v, net.dv, generator=g)
        gate, beta = -torch.rand(b, t, net.n_v, generator=g), torch.rand(b, t, net.n_v)
        for p in (q, k, v):
            p.requires_grad_(True)
        out, _ = net.rule(q, k, v, gate, beta, None)
        out.sum().backward()

    def run(module, *args):
        return lambda: module(x, *args).sum().backward()

    targets = torch.randint(0, model.config.vocab_size, (b, t))
    n_linear = sum(blk.linear for blk in model.blocks)
    return {
        "deltanet layer": (timed(run(net)), n_linear),
        "  of which the delta rule (chunks)": (timed(rule), n_linear),
        "attention layer": (timed(run(full.attn, rope)), model.config.n_layers - n_linear),
        "MLP": (timed(run(full.mlp)), model.config.n_layers),
        "head + loss": (timed(lambda: lm_loss(model.head, x, targets, fused=True).backward()), 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=SHAPE["vocab_size"], help="Qwen3.5's: 248320")
    p.add_argument("--layers", type=int, default=SHAPE["num_hidden_layers"], help="a multiple of 4")
    p.add_argument("--one-side", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--tokens", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one_side == "parts":
        print(json.dumps(parts(a)))
        return
    if a.one_side:
        finetune.PEFT_TARGETS = PEFT_TARGETS
        a.side, a.mode, a.rank, a.alpha, a.profile = a.one_side, "lora", 16, 32.0, 0
        print(json.dumps(finetune.one_side(a)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder, tokens = Path(tmp) / "qwen3_5", Path(tmp) / "tokens.npy"
        n = build(folder, tokens, {**SHAPE, "vocab_size": a.vocab, "num_hidden_layers": a.layers})
        print(
            f"Qwen3.5 from a config: {n / 1e6:,.0f}M parameters; LoRA rank 16 on every "
            f"projection; batch {a.batch} x seq {a.seq}, fp32, {a.threads} threads, "
            f"{a.steps} timed steps after {a.warmup}"
        )
        results = {name: side(a, folder, tokens, name) for name in ("td", "peft")}
        for name, r in results.items():
            label = {"td": "TrainDeck", "peft": "transformers + peft"}[name]
            if "error" in r:
                print(f"{label:<20} failed: {r['error']}")
                continue
            print(
                f"{label:<20} {r['tokens_per_s']:8.0f} tok/s {r['ms_per_step']:8.0f} ms/step "
                f"peak RSS {r['peak_rss_mb']:6,.0f} MB (after loading {r['loaded_mb']:,.0f} MB) "
                f"trainable {r['trainable']:,}"
            )
        td, hf = results["td"], results["peft"]
        if "error" not in td and "error" not in hf:
            print(
                f"TrainDeck / transformers: {td['tokens_per_s'] / hf['tokens_per_s']:.2f}x "
                f"tokens/s, {td['peak_rss_mb'] / hf['peak_rss_mb']:.2f}x peak RSS"
            )
        pieces = side(a, folder, tokens, "parts")
        if "error" in pieces:
            print(f"where the time goes: failed: {pieces['error']}")
            return
        total = sum(s * n for name, (s, n) in pieces.items() if not name.startswith(" "))
        print("where TrainDeck's step goes (forward + backward, one of each x its count):")
        for name, (s, count) in pieces.items():
            print(f"  {name:<36} {s * 1000:7.1f} ms x {count:2d} = {s * count / total:4.0%}")


if __name__ == "__main__":
    main()
