"""Data preparation speed and training memory on a large generated corpus.

    python benchmarks/data_prep.py [--gb 1.0] [--bpe-mb 200] [--steps 100]

Prints: bytes preparation MB/s, BPE learning and encoding MB/s (on a --bpe-mb slice), and the
peak RSS of a training process on the whole generated file (bytes tokenizer), measured from
the outside with psutil while it runs. Targets on a 2-core machine: bytes >= 100 MB/s,
BPE encoding >= 10 MB/s, training RSS < 1 GB.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.data.prepare import DataSpec, prepare  # noqa: E402
from core.data.sources import find_sources  # noqa: E402

WORDS = " ".join(
    [
        "the of and to in a is that for it as was with be by on not he I this are or his",
        "from at which but have an they you were her she there been one all we their has",
        "would when model training loss gradient token layer attention über café naïve",
        "東京 данные",
    ]
).split(" ")


def make_corpus(path: Path, size: int) -> None:
    """Word salad with punctuation and newlines, written in 8 MB pieces."""
    rng = np.random.default_rng(0)
    vocab = np.array([w + " " for w in WORDS] + [w + ".\n" for w in WORDS[:20]])
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < size:
            piece = "".join(rng.choice(vocab, 1_000_000))[: size - written]
            f.write(piece)
            written += len(piece.encode("utf-8"))


def timed_prepare(src: Path, tokenizer: str, cache: Path, cap: int | None = None):
    spec = DataSpec(find_sources(str(src), [".txt"], 0, cap), tokenizer, 8192, 0.01)
    t0 = time.perf_counter()
    _, m = prepare(spec, cache, log=lambda s: None)
    return time.perf_counter() - t0, m


TRAIN = """
import sys
from core.training.trainer import Trainer
from core.config.spec import TrainConfig, validate
cfg = validate(TrainConfig(data=sys.argv[1], hidden_dim=64, n_layers=2, n_heads=2, seq_len=128,
    batch_size=8, max_steps=int(sys.argv[3]), eval_every=50, eval_batches=2, ckpt_every=10**6,
    sample_tokens=0, device="cpu", precision="fp32", val_fraction=0.01))
Trainer(cfg, sys.argv[2], data_cache=sys.argv[4]).run()
"""


def training_peak_rss(src: Path, run_dir: Path, steps: int, cache: Path) -> tuple[float, float]:
    """(peak RSS in MB of a training process, its wall time) sampled every 50 ms."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAIN, str(src), str(run_dir), str(steps), str(cache)], env=env
    )
    p, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            peak = max(peak, p.memory_info().rss)
        except psutil.Error:
            break
        time.sleep(0.05)
    if proc.returncode:
        raise SystemExit(f"training failed with exit code {proc.returncode}")
    return peak / 1e6, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0, help="size of the generated corpus")
    ap.add_argument("--bpe-mb", type=int, default=200, help="slice the BPE is timed on")
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = tmp / "corpus.txt"
        size = int(args.gb * 1e9)
        t0 = time.perf_counter()
        make_corpus(src, size)
        print(f"generated {size / 1e9:.2f} GB in {time.perf_counter() - t0:.0f} s")

        seconds, m = timed_prepare(src, "bytes", tmp / "cache")
        bytes_rate = m["source_bytes"] / 1e6 / seconds
        print(f"bytes prepare: {m['source_bytes'] / 1e6:,.0f} MB in {seconds:.1f} s")

        cap = args.bpe_mb * 1_000_000
        seconds, m = timed_prepare(src, "bpe", tmp / "cache", cap)
        learn, encode = seconds - m["prepare_seconds"], m["prepare_seconds"]
        bpe_learn = min(m["train_bytes"], 100 << 20) / 1e6 / learn
        bpe_rate = m["source_bytes"] / 1e6 / encode
        tokens = m["train_tokens"] + m["val_tokens"]
        print(
            f"bpe prepare ({args.bpe_mb} MB): learn {learn:.1f} s, encode {encode:.1f} s, "
            f"{m['source_bytes'] / tokens:.2f} bytes/token"
        )

        rss, wall = training_peak_rss(src, tmp / "run", args.steps, tmp / "cache")
        print(f"training {args.steps} steps on the {size / 1e9:.2f} GB file: {wall:.1f} s")
        print()
        print(f"{'figure':<34}{'measured':>14}{'target':>12}{'ratio':>8}")
        rows = [
            ("bytes preparation (MB/s)", bytes_rate, 100, True),
            ("BPE learning (MB/s)", bpe_learn, None, True),
            ("BPE encoding (MB/s)", bpe_rate, 10, True),
            ("training peak RSS (MB)", rss, 1000, False),
        ]
        for name, value, target, higher in rows:
            ratio = (
                "" if target is None else f"{(value / target if higher else target / value):.2f}x"
            )
            shown = "" if target is None else f"{'>=' if higher else '<'} {target:,}"
            print(f"{name:<34}{value:>14,.1f}{shown:>12}{ratio:>8}")


if __name__ == "__main__":
    main()
