"""What --shard saves per process: the bytes of weights, gradients and optimizer state each
process holds after one optimizer step of a ~100M-parameter model (~390 MB in fp32), one
process against two sharded ones (torchrun, gloo, the CPU), beside the estimate per rank.

    python benchmarks/shard_memory.py [--hidden 1024 --layers 8]

Measured: the tensors themselves (a DTensor's local shard), and each process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MB = 1024**2


def local_bytes(tensors) -> int:
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        t = t.to_local() if isinstance(t, DTensor) else t
        total += t.numel() * t.element_size()
    return total


def worker(args) -> None:
    """One run of one step; prints this process's bytes by component as a JSON line."""
    sys.path.insert(0, str(ROOT))
    import torch

    from core.config.spec import TrainConfig, validate
    from core.platform.distributed import World
    from core.training.trainer import Trainer

    cfg = validate(
        TrainConfig(
            hidden_dim=args.hidden,
            n_layers=args.layers,
            n_heads=8,
            seq_len=64,
            batch_size=2 if args.shard else 4,
            max_steps=1,
            eval_every=1000,
            ckpt_every=1000,
            sample_tokens=0,
            optimizer="adamw",
            precision="fp32",
            device="cpu",
            corpus_max_bytes=200_000,
            shard=args.shard,
        )
    )
    trainer = Trainer(cfg, Path(args.out) / ("sharded" if args.shard else "one"))
    keep = {}
    real = trainer._train_step

    def measured(*a):  # right after the step: its gradients and the optimizer state exist
        loss = real(*a)
        model, opt = trainer.model, trainer.optimizer
        keep["weights"] = local_bytes(model.parameters())
        keep["gradients"] = local_bytes(p.grad for p in model.parameters() if p.grad is not None)
        states = [v for o in opt.all for s in o.state.values() for v in s.values()]
        keep["optimizer"] = local_bytes(v for v in states if torch.is_tensor(v) and v.dim())
        return loss

    trainer._train_step = measured
    trainer.run()
    keep["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("MEASURED " + json.dumps({"rank": World.from_env().rank, **keep}), flush=True)


def measured_lines(text: str) -> list[dict]:
    return [json.loads(line[9:]) for line in text.splitlines() if line.startswith("MEASURED ")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shard", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    me = [str(Path(__file__).resolve()), "--worker", "--hidden", str(args.hidden)]
    me += ["--layers", str(args.layers)]
    with tempfile.TemporaryDirectory() as out:
        one = subprocess.run(
            [sys.executable, *me, "--out", out], env=env, capture_output=True, text=True
        )
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        two = subprocess.run(
            [*torchrun, "--nproc_per_node", "2", *me, "--shard", "--out", out],
            env=env,
            capture_output=True,
            text=True,
        )
    rows = measured_lines(one.stdout) + measured_lines(two.stdout)
    if len(rows) != 3:
        sys.exit(f"a run failed:\n{one.stderr[-2000:]}\n{two.stderr[-2000:]}")
    print_table(rows[0], sorted(rows[1:], key=lambda r: r["rank"]), args)


def print_table(one: dict, ranks: list[dict], args) -> None:
    sys.path.insert(0, str(ROOT))
    from core.config.spec import TrainConfig, validate
    from core.training.estimate import estimate
    from core.training.sharding import rank_estimate

    cfg = validate(
        TrainConfig(
            hidden_dim=args.hidden, n_layers=args.layers, n_heads=8, optimizer="adamw", shard=True
        )
    )
    est = rank_estimate(estimate(cfg, "fp32", on_gpu=False), cfg, 2)
    print(f"hidden {args.hidden}, layers {args.layers}, AdamW, fp32, the CPU (gloo)")
    print(f"{'MiB':<12}{'1 process':>12}{'rank 0':>10}{'rank 1':>10}{'ratio':>8}{'estimate':>10}")
    for key, guess in (
        ("weights", est.weights),
        ("gradients", est.gradients),
        ("optimizer", est.optimizer),
    ):
        a, r0, r1 = one[key], ranks[0][key], ranks[1][key]
        print(
            f"{key:<12}{a / MB:>12.1f}{r0 / MB:>10.1f}{r1 / MB:>10.1f}"
            f"{max(r0, r1) / a:>8.2f}{guess / MB:>10.1f}"
        )
    total = [sum(r[k] for k in ("weights", "gradients", "optimizer")) for r in [one, *ranks]]
    print(
        f"{'sum':<12}{total[0] / MB:>12.1f}{total[1] / MB:>10.1f}{total[2] / MB:>10.1f}"
        f"{max(total[1:]) / total[0]:>8.2f}"
    )
    rss = [r["peak_rss"] / MB for r in [one, *ranks]]
    ratio = max(rss[1:]) / rss[0]
    print(f"{'peak RSS':<12}{rss[0]:>12.1f}{rss[1]:>10.1f}{rss[2]:>10.1f}{ratio:>8.2f}")


if __name__ == "__main__":
    main()
