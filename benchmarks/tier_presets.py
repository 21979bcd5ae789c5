"""The VRAM tier presets from their derivation (core/training/tiers.py):

    python -m benchmarks.tier_presets [--write]

Prints a Markdown table (assumed card and TFLOP/s, the budget's FLOPs, shape, batch, steps,
tokens per parameter, the estimate against the tier); --write rewrites presets/gpu-NNgb.yaml.
"""

from __future__ import annotations

import argparse

import yaml

from core.config.presets import BUILTIN_DIR
from core.training import tiers
from core.training.estimate import GB


def table(rows: list[dict]) -> str:
    lines = [
        "| preset | assumed card | bf16 peak x MFU | FLOPs in 30 min | width x layers (FFN) "
        "| params | batch x accum (seqs of 1024) | steps | tokens/param | estimate (bf16) "
        "| of the tier |",
        "|---|---|---:|---:|---|---:|---|---:|---:|---:|---:|",
    ]
    for d in rows:
        t, c = d["tier"], d["config"]
        lines.append(
            f"| `{tiers.preset_name(t.gb)}` | {t.card} | {t.peak_tflops:g} x {tiers.MFU:.0%} "
            f"| {d['flops']:.2e} | {c.hidden_dim} x {c.n_layers} ({c.ffn_dim}) "
            f"| {d['params'] / 1e6:.1f}M "
            f"| {c.batch_size} x {c.grad_accum} | {c.max_steps:,} "
            f"| {d['tokens'] / d['params']:.1f} | {d['device_total'] / GB:.1f} GiB "
            f"| {d['share']:.0%} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="rewrite presets/gpu-NNgb.yaml")
    args = p.parse_args()
    rows = [tiers.derive(t) for t in tiers.TIERS]
    print(table(rows))
    if args.write:
        for d in rows:
            path = BUILTIN_DIR / f"{tiers.preset_name(d['tier'].gb)}.yaml"
            path.write_text(yaml.safe_dump(tiers.preset_values(d), sort_keys=False))
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
