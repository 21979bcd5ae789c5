"""The GPU tier presets (presets/gpu-NNgb.yaml), derived, not chosen by hand.

For each VRAM tier a typical card's compute over a 30-minute budget gives the run's FLOPs C
(dense bf16 peak x an assumed MFU x 1800 s). The model is the compute-optimal one for C: of
a grid of shapes (width a multiple of 128 up to 1536, 48 to 80 of width a layer, heads of 64,
the MLP 8/3 as wide rounded up to 128: tensor cores tile both whole),
the one whose tokens per parameter, D / N with D = C / FLOPs per token, come nearest
Chinchilla's 20. The tokens per optimizer step follow DeepSeek LLM's fitted rule,
B = 0.292 * C^0.3271 (2024, eq. 1), rounded to a power of two of sequences; the micro-batch
is the largest multiple of 8 sequences, up to B, that keeps the estimate (bf16, on a GPU, CUDA
context included) at or under 80% of the tier, which leaves the desktop and other programs
their share; gradient accumulation brings the step nearest B. max_steps = D / the step.

`python -m benchmarks.tier_presets` prints the table and rewrites the YAML files from this.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from core.config.spec import TrainConfig, validate
from core.models.params import shape_params
from core.training.estimate import GB, estimate, flops_per_token, model_shape

BUDGET_S = 30 * 60
MFU = 0.30  # small models on one card: a third of the peak, before measurement
TOKENS_PER_PARAM = 20.0  # Chinchilla (Hoffmann et al. 2022)
VRAM_SHARE = 0.80  # of the tier, by the estimate's device total
SEQ_LEN = 1024
HEAD_DIM = 64
WIDTH_STEP = 128  # widths tensor cores tile without a partial tile (issue 57)
MICRO_STEP = 4  # micro-batches in whole fours of sequences
CORPUS_BYTES = 64_000_000  # the embedded corpus: all of it (its tokens repeat a few times)


@dataclass(frozen=True)
class Tier:
    gb: int
    card: str  # the card the throughput assumption is taken from
    peak_tflops: float  # its dense bf16 (fp32 accumulate) tensor peak, from the datasheet


TIERS = (
    Tier(8, "RTX 4060 8 GB", 30.0),
    Tier(12, "RTX 4070 12 GB", 58.0),
    Tier(16, "RTX 4080 16 GB", 97.0),
    Tier(24, "RTX 4090 24 GB", 165.0),
    Tier(48, "RTX 6000 Ada / L40S 48 GB", 362.0),
    Tier(80, "H100 80 GB", 989.0),
)


def preset_name(gb: int) -> str:
    return f"gpu-{gb}gb"


def budget_flops(tier: Tier) -> float:
    return tier.peak_tflops * 1e12 * MFU * BUDGET_S


def ffn_width(width: int) -> int:
    """SwiGLU's 8/3 of the width, rounded up to a multiple of 128 (the model's own rule
    rounds to 32: 1376 at width 512, ten and three quarter tiles of 128)."""
    return -(-8 * width // 3 // WIDTH_STEP) * WIDTH_STEP


def _config(width: int, layers: int) -> TrainConfig:
    return validate(
        TrainConfig(
            hidden_dim=width,
            n_layers=layers,
            n_heads=width // HEAD_DIM,
            ffn_dim=ffn_width(width),
            seq_len=SEQ_LEN,
            batch_size=1,
            grad_accum=1,
            precision="auto",
        )
    )


def compute_optimal(flops: float) -> tuple[TrainConfig, int]:
    """The grid's shape nearest 20 tokens per parameter for this many FLOPs, and its tokens."""
    best = None
    for width in range(256, 1537, WIDTH_STEP):
        # Parameters grow by one block a layer: two counts per width, not one per shape.
        one, two = (shape_params(model_shape(_config(width, n))) for n in (1, 2))
        for layers in range(max(2, round(width / 80)), round(width / 48) + 1):
            n = one + (layers - 1) * (two - one)
            # flops_per_token's 6N + 12 L d T (rotary: no position weights to leave out)
            tokens = flops / (6 * n + 12 * layers * width * SEQ_LEN)
            miss = abs(math.log(tokens / n / TOKENS_PER_PARAM))
            if best is None or miss < best[0]:
                best = (miss, width, layers)
    cfg = _config(best[1], best[2])
    return cfg, int(flops / flops_per_token(cfg))


def batch_tokens(flops: float) -> int:
    """DeepSeek LLM's optimal batch for C FLOPs, in whole sequences, a power of two."""
    seqs = 0.292 * flops**0.3271 / SEQ_LEN
    return 2 ** max(0, round(math.log2(seqs)))


def micro_batch(cfg: TrainConfig, seqs: int, tier_gb: int) -> int | None:
    """The largest micro-batch, a multiple of MICRO_STEP up to half again seqs, within
    VRAM_SHARE of the tier (a power of two dividing seqs left a third of some tiers unused on an
    H100: docs/gpu.md)."""
    step = min(MICRO_STEP, seqs)
    for micro in range(seqs * 3 // 2 // step * step, 0, -step):
        candidate = dataclasses.replace(cfg, batch_size=micro, grad_accum=accum_for(seqs, micro))
        if estimate(candidate, "bf16").device_total <= VRAM_SHARE * tier_gb * GB:
            return micro
    return None


def accum_for(seqs: int, micro: int) -> int:
    """Micro-batches a step: the effective batch nearest the rule's, never under one."""
    return max(1, round(seqs / micro))


def derive(tier: Tier) -> dict:
    """The preset's values for a tier and the figures behind them."""
    flops = budget_flops(tier)
    shape, tokens = compute_optimal(flops)
    seqs = batch_tokens(flops)
    micro = micro_batch(shape, seqs, tier.gb)
    if micro is None:
        raise ValueError(f"tier {tier.gb} GB: not one sequence fits")
    accum = accum_for(seqs, micro)
    steps = max(1, round(tokens / (micro * accum * SEQ_LEN)))
    cfg = dataclasses.replace(shape, batch_size=micro, grad_accum=accum, max_steps=steps)
    est = estimate(cfg, "bf16")
    return {
        "tier": tier,
        "config": cfg,
        "flops": flops,
        "params": est.n_params,
        "tokens": steps * micro * accum * SEQ_LEN,
        "device_total": est.device_total,
        "share": est.device_total / (tier.gb * GB),
    }


def preset_values(d: dict) -> dict:
    """What the YAML file holds: description, hardware, tier, and the config values."""
    t, c = d["tier"], d["config"]
    return {
        "description": (
            f"{t.gb} GB cards ({t.card} class): {d['params'] / 1e6:.0f}M parameters, "
            f"compute-optimal for 30 minutes at {t.peak_tflops:g} TFLOP/s x {MFU:.0%} MFU"
        ),
        "hardware": f"NVIDIA GPU with {t.gb} GB or more",
        "config_version": 3,
        "min_vram_gb": t.gb,
        "tier_gb": t.gb,
        "hidden_dim": c.hidden_dim,
        "n_layers": c.n_layers,
        "n_heads": c.n_heads,
        "ffn_dim": c.ffn_dim,
        "seq_len": c.seq_len,
        "batch_size": c.batch_size,
        "grad_accum": c.grad_accum,
        "warmup_steps": max(50, c.max_steps // 50),
        "max_steps": c.max_steps,
        "precision": "auto",
        "log_every": 20,
        "eval_every": max(250, c.max_steps // 10 // 50 * 50),
        "ckpt_every": max(500, c.max_steps // 5 // 100 * 100),
        "corpus_max_bytes": CORPUS_BYTES,
    }
