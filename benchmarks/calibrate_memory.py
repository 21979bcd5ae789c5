"""Measured peak memory beside the estimate for every built-in GPU preset (needs CUDA).

python benchmarks/calibrate_memory.py [--steps 3]
Prints a Markdown table for docs/gpu.md: estimate vs torch.cuda.max_memory_allocated and vs
NVML device used, with the error of each. Each preset runs in its own process so one
preset's cached blocks never count towards the next.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

ONE = r"""
import dataclasses, json, sys, tempfile, torch
from core.config import presets
from core.platform import hardware
from core.training.estimate import estimate
from core.training.trainer import Trainer
name, steps = sys.argv[1], int(sys.argv[2])
cfg = presets.to_config(presets.load_preset(name))
cfg = dataclasses.replace(cfg, max_steps=steps, max_epochs=None, log_every=1,
    eval_every=10**9, ckpt_every=10**9, keep_checkpoints=0, sample_tokens=0, device="cuda")
with tempfile.TemporaryDirectory() as tmp:
    Trainer(cfg, tmp + "/run").run()
est = estimate(cfg)
nv = hardware.nvml_stats(0)
print(json.dumps({"preset": name, "est_alloc": est.allocator_peak, "est_total": est.device_total,
    "peak": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved(),
    "nvml_used": nv.get("nvml_used_mb", 0) * 1024**2, "gpu": torch.cuda.get_device_name(0)}))
"""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--presets", default="gpu-small,gpu,gpu-large,gpu-80gb")
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    mib = 1024**2
    print(
        "| preset | estimate (alloc) | measured max_allocated | error | estimate (device) "
        "| NVML used | error |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in args.presets.split(","):
        out = subprocess.run([sys.executable, "-c", ONE, name, str(args.steps)],
                             capture_output=True, text=True)  # fmt: skip
        if out.returncode:
            print(f"| {name} | failed: {out.stderr.strip().splitlines()[-1]} |")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        e1 = r["est_alloc"] / r["peak"] - 1
        e2 = r["est_total"] / r["nvml_used"] - 1 if r["nvml_used"] else float("nan")
        print(f"| {name} | {r['est_alloc'] / mib:,.0f} MiB | {r['peak'] / mib:,.0f} MiB | "
              f"{e1:+.1%} | {r['est_total'] / mib:,.0f} MiB | {r['nvml_used'] / mib:,.0f} MiB | "
              f"{e2:+.1%} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
