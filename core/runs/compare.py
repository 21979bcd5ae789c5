"""Several runs side by side (the window's Compare tab): each run's loss curves by step and by
time, and a one-line summary of the settings that tell runs apart."""

from __future__ import annotations

from pathlib import Path

from core.errors import UserError
from core.runs.folder import RunFolder, read_metrics


def settings_line(run: RunFolder) -> str:
    """What distinguishes a run: its start, size, data, learning rate, batch, LoRA, length."""
    try:
        c = run.read_config()
    except (UserError, OSError, ValueError):
        return "settings unreadable"
    start = Path(c.init_from).name if c.init_from else f"new {c.hidden_dim}x{c.n_layers}"
    data = Path(c.data).name if c.data else "embedded"
    parts = [start, data, f"lr {'auto' if c.lr is None else f'{c.lr:g}'}",
             f"batch {c.batch_size}x{c.grad_accum}"]  # fmt: skip
    if c.lora_rank:
        parts.append(f"LoRA {c.lora_rank}" + (f" {c.base_bits}-bit" if c.base_bits in ("4", "8")
                                               else ""))  # fmt: skip
    return ", ".join(parts)


def run_curves(path: str | Path) -> dict:
    """{"name", "label", "train": [(step, elapsed_s, loss)], "val": [(step, train_s, loss)]}."""
    run = RunFolder(Path(path))
    train, evals = read_metrics(run.metrics_file)
    return {
        "name": run.path.name,
        "label": f"{run.path.name} ({settings_line(run)})",
        "train": [(r["step"], r.get("elapsed_s", 0.0), r["loss"]) for r in train],
        "val": [(r["step"], r.get("train_s", 0.0), r["val_loss"]) for r in evals],
    }
