"""Throughput and MFU per preset: python benchmarks/throughput.py [--presets a,b] [--steps N].

Prints tokens/s, ms per optimizer step and, on CUDA, model FLOPs utilisation against the
card's peak (pass --peak-tflops; defaults: H100 989, A100 312 bf16 dense). Speed targets live
here, not in unit tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time

import torch

from core.config import presets
from core.runs.events import TrainEvents
from core.training.estimate import flops_per_token
from core.training.trainer import Trainer

PEAKS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40": 181.0, "4090": 165.0}


class Collect(TrainEvents):
    def __init__(self):
        self.records = []

    def on_train_batch_end(self, record):
        self.records.append(record)


def peak_tflops(explicit: float | None) -> float | None:
    if explicit:
        return explicit
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        return next((v for k, v in PEAKS.items() if k in name), None)
    return None


def bench(name: str, steps: int, device: str, peak: float | None) -> str:
    cfg = presets.to_config(presets.load_preset(name))
    cfg = dataclasses.replace(
        cfg,
        max_steps=steps,
        max_epochs=None,
        log_every=1,
        eval_every=10**9,
        ckpt_every=10**9,
        keep_checkpoints=0,
        device=device,
        sample_tokens=0,
    )
    events = Collect()
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        Trainer(cfg, f"{tmp}/run").run(events)
        wall = time.perf_counter() - t
    steady = events.records[len(events.records) // 2 :]  # skip warm-up and compile
    tok_s = sum(r["tokens_per_s"] for r in steady) / len(steady)
    line = f"{name:<10} {tok_s:>12,.0f} tok/s  {cfg.tokens_per_step / tok_s * 1000:>9.1f} ms/step"
    if peak:
        mfu = tok_s * flops_per_token(cfg) / (peak * 1e12)
        line += f"  MFU {mfu:6.1%}"
    peak_mb = steady[-1].get("mem_peak_mb")
    if peak_mb:
        line += f"  peak {peak_mb:,.0f} MiB"
    return line + f"  (wall {wall:.1f}s for {steps} steps)"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--presets", default="cpu-tiny")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--device", default="auto")
    p.add_argument("--peak-tflops", type=float)
    args = p.parse_args()
    peak = peak_tflops(args.peak_tflops)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    print(f"device: {device}; torch {torch.__version__}; peak {peak or '-'} TFLOP/s")
    for name in args.presets.split(","):
        print(bench(name, args.steps, args.device, peak), flush=True)


if __name__ == "__main__":
    main()
