"""The engine against a bare PyTorch loop: what does everything around the step cost?

    python benchmarks/overhead.py [--steps 300] [--rounds 3] [--sizes tiny,small]

The bare loop is written here: the same core.models.model.GPT, batch, device, precision and AdamW
settings, random windows from an in-memory tensor, forward, backward, clip, step. The engine
is core.training.trainer.Trainer with evaluation and checkpoints pushed past the end, so both do the
same training work. They alternate in one process (rounds); the figure is the median of
the rounds' engine/bare ratios.
Target: engine / bare >= 0.98.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.config.spec import TrainConfig, validate  # noqa: E402
from core.models.model import GPT, GPTConfig  # noqa: E402
from core.runs.events import TrainEvents  # noqa: E402
from core.training.schedule import lr_at  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402

SIZES = {
    "tiny": dict(hidden_dim=64, n_layers=2, n_heads=4, seq_len=64, batch_size=8),
    "small": dict(hidden_dim=256, n_layers=4, n_heads=4, seq_len=128, batch_size=8),
}


def config(size: str, steps: int, device: str) -> TrainConfig:
    return validate(
        TrainConfig(
            **SIZES[size],
            max_steps=steps,
            eval_every=10**9,
            ckpt_every=10**9,
            keep_checkpoints=0,
            sample_tokens=0,
            log_every=50,
            precision="fp32",
            device=device,
            corpus_max_bytes=2_000_000,
            dropout=0.0,
            optimizer="adamw",
            schedule="cosine",
            lr=1e-3,  # what the bare loop runs
        )
    )


class Clock(TrainEvents):
    """Times the steps after the first log window (warm-up) until the end."""

    def __init__(self, warmup: int):
        self.warmup, self.t0, self.t1, self.step0, self.step1 = warmup, None, None, 0, 0

    def on_train_batch_end(self, record):
        if record["step"] == self.warmup:
            self.t0, self.step0 = time.perf_counter(), record["step"]
        self.t1, self.step1 = time.perf_counter(), record["step"]


def engine_steps_per_s(cfg: TrainConfig, tmp: Path) -> tuple[float, torch.Tensor]:
    trainer = Trainer(cfg, tmp / f"run-{time.monotonic_ns()}", data_cache=tmp / "cache")
    clock = Clock(warmup=cfg.log_every)
    trainer.run(clock)
    data = torch.from_numpy(__import__("numpy").asarray(trainer.data.train).copy())
    return (clock.step1 - clock.step0) / (clock.t1 - clock.t0), data


def bare_steps_per_s(cfg: TrainConfig, data: torch.Tensor) -> float:
    device = torch.device(cfg.device)
    torch.manual_seed(cfg.seed)
    model = GPT(GPTConfig.from_train(cfg, training=False)).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0}],
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        fused=True,
    )
    gen = torch.Generator().manual_seed(0)
    offsets = torch.arange(cfg.seq_len + 1)
    warmup = cfg.log_every
    for step in range(cfg.max_steps):
        if step == warmup:
            t0 = time.perf_counter()
        starts = torch.randint(0, len(data) - cfg.seq_len - 1, (cfg.batch_size,), generator=gen)
        chunk = data[starts[:, None] + offsets].long().to(device)
        logits = model.logits(chunk[:, :-1])
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), chunk[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg, cfg.max_steps)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % cfg.log_every == 0:
            loss.item()  # the engine also reads its losses once per log window
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (cfg.max_steps - warmup) / (time.perf_counter() - t0)


def save_costs(size: str, device: str, tmp: Path, saves: int = 10) -> tuple[float, float, float]:
    """(median ms the training thread stalls per save, MB of one checkpoint, MB the run folder
    takes on disk) for a run that saves every 10 steps and keeps 3 step files plus best.pt."""
    cfg = dataclasses.replace(
        config(size, 10 * saves, device), ckpt_every=10, eval_every=10, keep_checkpoints=3
    )
    run_dir = tmp / f"saves-{size}"
    trainer = Trainer(cfg, run_dir, data_cache=tmp / "cache")
    stalls = []
    inner = trainer._save_checkpoint

    def timed(best):
        t = time.perf_counter()
        path = inner(best)
        stalls.append(time.perf_counter() - t)
        return path

    trainer._save_checkpoint = timed
    trainer.run()
    files = [p for p in run_dir.rglob("*.pt")]
    one = files[0].stat().st_size / 1e6
    inodes = {p.stat().st_ino: p.stat().st_size for p in run_dir.rglob("*") if p.is_file()}
    return statistics.median(stalls) * 1000, one, sum(inodes.values()) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="tiny,small")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    print(f"device {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'size':<8}{'engine steps/s':>16}{'bare steps/s':>14}{'engine/bare':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            cfg = config(size, args.steps, args.device)
            engine, bare = [], []
            for _ in range(args.rounds):
                rate, data = engine_steps_per_s(cfg, Path(tmp))
                engine.append(rate)
                bare.append(bare_steps_per_s(cfg, data))
            # Each round's pair runs back to back, under the same load from the rest of the
            # machine; the median of the rounds' ratios is steadier than a ratio of medians.
            ratios = sorted(e / b for e, b in zip(engine, bare, strict=True))
            e, b = statistics.median(engine), statistics.median(bare)
            print(
                f"{size:<8}{e:>16.1f}{b:>14.1f}{statistics.median(ratios):>13.3f}"
                f"   (rounds {ratios[0]:.3f} .. {ratios[-1]:.3f})"
            )
        for size in args.sizes.split(","):
            stall, one, disk = save_costs(size, args.device, Path(tmp))
            print(
                f"{size}: training stall per save {stall:.1f} ms (the rest is written in the "
                f"background); one checkpoint {one:.2f} MB; run folder on disk {disk:.2f} MB "
                f"with latest + best + 3 step files ({disk / one:.1f} checkpoints' worth)"
            )


if __name__ == "__main__":
    main()
