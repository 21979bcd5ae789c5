"""TrainDeck against karpathy/nanoGPT's own CPU recipe, on the same text, same machine.

    python benchmarks/vs_nanogpt.py NANOGPT_DIR [--iters 2000] [--text FILE]
    python benchmarks/vs_nanogpt.py NANOGPT_DIR --time-to-quality [--fractions 0.5 0.4]
        [--td-args "--optimizer adamw"] [--nano-wall S --nano-val L]

Step for step (the default mode):
Prepares a character-level dataset for nanoGPT from 1 MB of ASCII text (default: your
Python's standard library sources, the same corpus TrainDeck embeds), runs nanoGPT's
train.py with the shakespeare_char recipe scaled for a CPU (4 layers, 4 heads, 128 wide,
block 64, batch 12, lr 1e-3, beta2 0.99, bias False, dropout 0), then TrainDeck with the same
settings (--no-bias --beta2 0.99) on the same text and the same 90/10 split. Prints median
ms per iteration (nanoGPT's own figure; TrainDeck's from its training-only tokens/s) and the
final validation loss of each.

Time to quality: nanoGPT trains its recipe once; its wall time is its median ms/iter x iters
(evaluation left out). TrainDeck then gets only the shape flags (--hidden-dim 128 --n-layers
4 --n-heads 4 --seq-len 64 --batch-size 12 --grad-accum 1 --dropout 0), its defaults for the
rest, and a time budget of each fraction of nanoGPT's wall time, evaluating every 25 steps.
The figure: TrainDeck's training time (evaluation left out) when its validation loss first
reaches nanoGPT's final one, over nanoGPT's wall time; the smallest over the budgets tried.
--td-args adds flags (an ablation); with another tokenizer, compare val_bpb (nats / ln 2 for
nanoGPT's characters: the text is ASCII, a character is a byte).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import re
import shlex
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ)  # --threads sets the thread count of both programs
RECIPE = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, lr=1e-3)


def stdlib_text(limit: int = 1_000_000) -> str:
    parts, size = [], 0
    for p in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        try:
            parts.append(p.read_text(encoding="ascii"))
        except (UnicodeDecodeError, OSError):
            continue
        size += len(parts[-1])
        if size > limit:
            break
    return "".join(parts)[:limit]


def prepare_nanogpt(text: str, folder: Path) -> None:
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    split = int(len(ids) * 0.9)
    folder.mkdir(parents=True, exist_ok=True)
    ids[:split].tofile(folder / "train.bin")
    ids[split:].tofile(folder / "val.bin")
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}
    (folder / "meta.pkl").write_bytes(pickle.dumps(meta))


def run_nanogpt(nano: Path, iters: int, out: Path) -> tuple[float, float]:
    r = RECIPE
    cmd = [
        sys.executable,
        "train.py",
        "config/train_shakespeare_char.py",
        "--dataset=traindeck",
        "--device=cpu",
        "--compile=False",
        "--dtype=float32",
        f"--max_iters={iters}",
        f"--lr_decay_iters={iters}",
        f"--n_layer={r['n_layer']}",
        f"--n_head={r['n_head']}",
        f"--n_embd={r['n_embd']}",
        f"--block_size={r['block_size']}",
        f"--batch_size={r['batch_size']}",
        f"--learning_rate={r['lr']}",
        "--dropout=0.0",
        "--eval_iters=20",
        "--log_interval=10",
        f"--eval_interval={iters}",
        f"--out_dir={out}",
    ]
    text = subprocess.run(cmd, cwd=nano, capture_output=True, text=True, check=True, env=ENV).stdout
    times = [float(t) for t in re.findall(r"iter \d+: loss [\d.]+, time ([\d.]+)ms", text)]
    vals = re.findall(r"val loss ([\d.]+)", text)
    return statistics.median(times[len(times) // 10 :]), float(vals[-1])


def run_traindeck(data: Path, iters: int, out: Path) -> tuple[float, float]:
    r = RECIPE
    cmd = [
        sys.executable,
        "-m",
        "core.train",
        "--data",
        str(data),
        "--out",
        str(out),
        "--hidden-dim",
        str(r["n_embd"]),
        "--n-layers",
        str(r["n_layer"]),
        "--n-heads",
        str(r["n_head"]),
        "--seq-len",
        str(r["block_size"]),
        "--batch-size",
        str(r["batch_size"]),
        "--grad-accum",
        "1",
        "--lr",
        str(r["lr"]),
        "--beta2",
        "0.99",
        "--arch",
        "gpt2",
        "--optimizer",
        "adamw",
        "--schedule",
        "cosine",
        "--no-bias",
        "--dropout",
        "0",
        "--max-steps",
        str(iters),
        "--warmup-steps",
        "100",
        "--min-lr-ratio",
        "0.1",
        "--weight-decay",
        "0.1",
        "--grad-clip",
        "1.0",
        "--precision",
        "fp32",
        "--device",
        "cpu",
        "--val-fraction",
        "0.1",
        "--eval-every",
        str(iters),
        "--eval-batches",
        "20",
        "--ckpt-every",
        str(iters),
        "--sample-tokens",
        "0",
        "--log-every",
        "10",
    ]
    subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True, env=ENV)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "tokens_per_s" in r]
    per_step = RECIPE["block_size"] * 1000  # ms per step = tokens in the step / tokens per ms
    speeds = [r["batch_size"] * r["grad_accum"] * per_step / r["tokens_per_s"] for r in train]
    ms = statistics.median(speeds[len(speeds) // 10 :])
    val = [r["val_loss"] for r in records if "val_loss" in r][-1]
    return ms, val


SHAPE_FLAGS = [
    "--hidden-dim",
    "128",
    "--n-layers",
    "4",
    "--n-heads",
    "4",
    "--seq-len",
    "64",
    "--batch-size",
    "12",
    "--grad-accum",
    "1",
    "--dropout",
    "0",
]


def run_budget(data: Path, budget_s: float, out: Path, extra: list[str]) -> dict:
    """TrainDeck with the shape flags, its defaults and a time budget; its eval records."""
    cmd = [
        sys.executable,
        "-m",
        "core.train",
        "--data",
        str(data),
        "--out",
        str(out),
        *SHAPE_FLAGS,
        "--max-time",
        f"{budget_s:.1f}s",
        "--device",
        "cpu",
        "--val-fraction",
        "0.1",
        "--eval-every",
        "25",
        "--eval-batches",
        "20",
        "--ckpt-every",
        "100000",
        "--sample-tokens",
        "0",
        "--log-every",
        "25",
        *extra,
    ]
    subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True, env=ENV)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "val_loss" in r]
    return {
        "evals": evals,
        "steps": evals[-1]["step"],
        "val": evals[-1]["val_loss"],
        "bpb": evals[-1]["val_bpb"],
    }


def time_to_quality(args, text: str, tmp: Path) -> None:
    if args.nano_wall and args.nano_val:
        nano_wall, nano_val = args.nano_wall, args.nano_val
    else:
        prepare_nanogpt(text, args.nanogpt / "data" / "traindeck")
        nano_ms, nano_val = run_nanogpt(args.nanogpt, args.iters, tmp / "nano-out")
        nano_wall = nano_ms * args.iters / 1000
    (tmp / "text.txt").write_text(text, encoding="ascii")
    bpb = nano_val / math.log(2)
    print(
        f"nanoGPT: {args.iters} iters, {nano_wall:.1f} s, val loss {nano_val:.4f} "
        f"({bpb:.4f} bits/byte); TrainDeck extra flags: {args.td_args!r}"
    )
    print(f"{'budget':>7}{'steps':>7}{'val loss':>10}{'bits/byte':>10}{'reached at':>12}")
    best = None
    for i, fraction in enumerate(args.fractions):
        r = run_budget(
            tmp / "text.txt", fraction * nano_wall, tmp / f"td-{i}", shlex.split(args.td_args)
        )
        # bits per byte: equal to nats / ln 2 for bytes, and comparable for a BPE too
        hit = next((e["train_s"] / nano_wall for e in r["evals"] if e["val_bpb"] <= bpb), None)
        best = hit if hit is not None and (best is None or hit < best) else best
        at = f"{hit:.3f}" if hit is not None else "never"
        print(
            f"{fraction:>7.2f}{r['steps']:>7}{r['val']:>10.4f}{r['bpb']:>10.4f}{at:>12}", flush=True
        )
    print(
        f"time to nanoGPT's final val loss / nanoGPT's time: "
        f"{'not reached' if best is None else f'{best:.3f}'}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("nanogpt", type=Path)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--text", type=Path)
    ap.add_argument("--time-to-quality", action="store_true")
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.5])
    ap.add_argument("--td-args", default="", help="extra TrainDeck flags (ablations)")
    ap.add_argument("--threads", type=int, help="torch threads for both (default: torch's)")
    ap.add_argument("--nano-wall", type=float, help="reuse a nanoGPT wall time (s)")
    ap.add_argument("--nano-val", type=float, help="reuse a nanoGPT final val loss")
    args = ap.parse_args()
    if args.threads:
        ENV.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    text = args.text.read_text(encoding="ascii") if args.text else stdlib_text()
    if args.time_to_quality:
        with tempfile.TemporaryDirectory() as tmp_name:
            time_to_quality(args, text, Path(tmp_name))
        return
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        prepare_nanogpt(text, args.nanogpt / "data" / "traindeck")
        (tmp / "text.txt").write_text(text, encoding="ascii")
        nano_ms, nano_val = run_nanogpt(args.nanogpt, args.iters, tmp / "nano-out")
        td_ms, td_val = run_traindeck(tmp / "text.txt", args.iters, tmp / "td-run")
    print(f"{len(text):,} bytes of text, {args.iters} iterations, recipe {RECIPE}")
    print(f"{'':<10}{'ms/iter':>9}{'val loss':>10}")
    print(f"{'nanoGPT':<10}{nano_ms:>9.2f}{nano_val:>10.4f}")
    print(f"{'TrainDeck':<10}{td_ms:>9.2f}{td_val:>10.4f}")
    print(
        f"TrainDeck speed / nanoGPT speed: {nano_ms / td_ms:.3f}; val loss difference "
        f"{td_val - nano_val:+.4f}"
    )


if __name__ == "__main__":
    main()
