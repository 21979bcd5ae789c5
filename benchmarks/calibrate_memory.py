"""Measured peak memory beside the estimate for every built-in GPU preset (needs CUDA), or
with --cpu for a few small shapes with and without activation checkpointing (peak RSS).

python benchmarks/calibrate_memory.py [--steps 3] [--cpu [--finetune]]
Prints a Markdown table for docs/gpu.md: estimate vs torch.cuda.max_memory_allocated and vs
NVML device used, with the error of each. Each preset runs in its own process so one
preset's cached blocks never count towards the next.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

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


# The CPU (Linux): peak resident memory (VmHWM, reset once the token cache is prepared) over
# a few fp32 steps, less what the process held before the run, beside the CPU estimate
# (device_total: on the CPU the allocator peak and the heap's slack, no CUDA context).
ONE_CPU = r"""
import json, sys, tempfile, torch
from helpers_shape import shape
from core.training.estimate import estimate
from core.training.trainer import Trainer
torch.set_num_threads(1)
cfg = shape(sys.argv[1], int(sys.argv[2]), sys.argv[3])
est = estimate(cfg, on_gpu=False)
import contextlib, gc, io, psutil
from core.cli.train import prepare_only
with contextlib.redirect_stdout(io.StringIO()):
    prepare_only(cfg, None)  # the token cache is ready: the run below only reads it
gc.collect()
with open("/proc/self/clear_refs", "w") as f:  # Linux: the peak (VmHWM) restarts from here
    f.write("5")
before = psutil.Process().memory_info().rss
with tempfile.TemporaryDirectory() as tmp:
    Trainer(cfg, tmp + "/run").run()
status = open("/proc/self/status").read()
peak = int(status.split("VmHWM:")[1].split()[0]) * 1024  # kB
print(json.dumps({"est": est.device_total, "act": est.activations, "measured": peak - before,
    "params": est.n_params}))
"""

SHAPES = {  # name: hidden_dim, n_layers, n_heads, seq_len, batch_size, dropout
    "d256-L4-T256-B8": (256, 4, 4, 256, 8, 0.0),
    "d384-L6-T256-B8": (384, 6, 6, 256, 8, 0.0),
    "d512-L8-T512-B4": (512, 8, 8, 512, 4, 0.0),
    "d512-L8-T512-B4, dropout 0.1": (512, 8, 8, 512, 4, 0.1),
}

HELPER = """
from core.config.spec import TrainConfig, validate
SHAPES = %r
def shape(name, steps, mode):
    d, layers, heads, seq, batch, dropout = SHAPES[name]
    return validate(TrainConfig(hidden_dim=d, n_layers=layers, n_heads=heads, seq_len=seq,
        batch_size=batch, grad_accum=1, precision="fp32", device="cpu", dropout=dropout,
        max_steps=steps, log_every=1, eval_every=10**9, ckpt_every=10**9, keep_checkpoints=0,
        sample_tokens=0, corpus_max_bytes=300_000, grad_checkpointing=mode == "ckpt",
        tokenizer="bytes"))
"""


# Fine-tunes (--init-from a random Llama-shaped Hugging Face folder, built with transformers'
# LlamaConfig and a 4,096-token BPE; the vocabulary is the tokenizer's, so training reads every
# row of the embedding): full and LoRA r16, with and without checkpointing.
FINETUNE_SHAPES = {  # name: width, ffn, layers, heads, kv heads, seq_len, batch
    "ft-d384-L6-T256-B8": (384, 1024, 6, 6, 2, 256, 8),
    "ft-d768-L6-T256-B4": (768, 2048, 6, 12, 4, 256, 4),
    "ft-d768-L6-T512-B4": (768, 2048, 6, 12, 4, 512, 4),
}

FINETUNE_HELPER = """
from core.config.spec import TrainConfig, validate
from core.weights.loader import apply_pretrained, config_only
SHAPES = %r
ROOT = %r
def shape(name, steps, mode):
    seq, batch = SHAPES[name][5:]
    lora = dict(lora_rank=16, lora_alpha=32, lora_targets="all") if "lora" in mode else {}
    cfg = TrainConfig(init_from=ROOT + "/" + name, seq_len=seq, batch_size=batch, grad_accum=1,
        precision="fp32", device="cpu", dropout=0.0, max_steps=steps, log_every=1,
        eval_every=10**9, ckpt_every=10**9, keep_checkpoints=0, sample_tokens=0,
        corpus_max_bytes=300_000, grad_checkpointing="ckpt" in mode, tokenizer="model", **lora)
    return validate(apply_pretrained(validate(cfg), config_only(cfg.init_from)))
"""


def build_finetune_models(root) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from finetune import build_model

    for name, (d, ffn, layers, heads, kv, _, _) in FINETUNE_SHAPES.items():
        shape = dict(
            hidden_size=d,
            intermediate_size=ffn,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            max_position_embeddings=1024,
            tie_word_embeddings=False,
        )
        build_model(root / name, shape)


def cpu_table(steps: int, finetune: bool = False) -> None:
    import os
    import tempfile

    mib = 1024**2
    root = Path(__file__).resolve().parents[1]
    helper_dir = Path(tempfile.mkdtemp())
    shapes, modes, text = SHAPES, ("plain", "ckpt"), HELPER % (SHAPES,)
    if finetune:
        build_finetune_models(helper_dir)
        shapes, modes = FINETUNE_SHAPES, ("full", "full-ckpt", "lora", "lora-ckpt")
        text = FINETUNE_HELPER % (FINETUNE_SHAPES, str(helper_dir))
    (helper_dir / "helpers_shape.py").write_text(text)
    # the lean heap the CPU estimate describes (core.platform.heap)
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{helper_dir}", "TRAINDECK_HEAP": "lean"}
    print(
        "| shape (width, layers, seq, batch) | checkpointing | estimate (fp32, CPU) "
        "| of it activations | measured peak RSS - start | error |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for name in shapes:
        for mode in modes:
            out = subprocess.run(
                [sys.executable, "-c", ONE_CPU, name, str(steps), mode],
                capture_output=True,
                text=True,
                env=env,
                cwd=root,
            )
            if out.returncode:
                print(f"| {name} | {mode} | failed: {out.stderr.strip().splitlines()[-1]} |")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            err = r["est"] / r["measured"] - 1
            print(
                f"| {name} | {mode} | {r['est'] / mib:,.0f} MiB "
                f"| {r['act'] / mib:,.0f} MiB | {r['measured'] / mib:,.0f} MiB | {err:+.1%} |",
                flush=True,
            )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--presets",
        default="gpu-small,gpu,gpu-large,gpu-8gb,gpu-12gb,gpu-16gb,gpu-24gb,gpu-48gb,gpu-80gb",
    )
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--cpu", action="store_true", help="tiny-to-small shapes on the CPU (RSS)")
    p.add_argument("--finetune", action="store_true", help="with --cpu: fine-tunes of Llamas")
    args = p.parse_args()
    if args.cpu:
        cpu_table(args.steps, args.finetune)
        return
    mib = 1024**2
    print(
        "| preset | estimate (alloc) | measured max_allocated | error | estimate (device) "
        "| NVML used | error |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in args.presets.split(","):
        out = subprocess.run(
            [sys.executable, "-c", ONE, name, str(args.steps)], capture_output=True, text=True
        )
        if out.returncode:
            print(f"| {name} | failed: {out.stderr.strip().splitlines()[-1]} |")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        e1 = r["est_alloc"] / r["peak"] - 1
        e2 = r["est_total"] / r["nvml_used"] - 1 if r["nvml_used"] else float("nan")
        print(
            f"| {name} | {r['est_alloc'] / mib:,.0f} MiB | {r['peak'] / mib:,.0f} MiB | "
            f"{e1:+.1%} | {r['est_total'] / mib:,.0f} MiB | {r['nvml_used'] / mib:,.0f} MiB | "
            f"{e2:+.1%} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
