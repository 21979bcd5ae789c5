"""The records a run writes to metrics.jsonl and sends to the window, one per step."""

from __future__ import annotations

import math

from core.config import recipe
from core.config.spec import TrainConfig
from core.errors import TrainingError
from core.models import lora


def train_records(steps: list[tuple[int, float]], losses: list[float], cfg: TrainConfig,
                  train_tokens: int, common: dict, extras=None) -> list[dict]:  # fmt: skip
    """One record per (step, lr) with its loss (and extras[i], DPO's signals, merged in);
    raises TrainingError when a loss is not finite: this is where divergence is seen."""
    records = []
    extras = extras or [{}] * len(steps)
    for (step, lr), loss, extra in zip(steps, losses, extras, strict=True):
        if not math.isfinite(loss):
            raise TrainingError(
                f"loss became {loss} at step {step}: lower lr (now "
                f"{recipe.adamw_lr(cfg):.3g}) or use precision bf16/fp32"
            )
        epoch = round(step * cfg.tokens_per_step / train_tokens, 4)
        records.append({
            "step": step, "loss": loss, "lr": lr, "max_steps": common["max_steps"],
            "tokens_per_s": common["tokens_per_s"], "epoch": epoch,
            "elapsed_s": common["elapsed_s"], "batch_size": cfg.batch_size,
            "grad_accum": cfg.grad_accum, **extra, **common["memory"],
        })  # fmt: skip
    return records


def start_record(trainer) -> dict:
    """What the front ends show when the steps start (on_train_start)."""
    t, cfg = trainer, trainer.cfg
    return {
        "run_dir": str(t.folder.path), "start_step": t.step, "max_steps": t.max_steps,
        "n_params": t.model.num_params(), "n_trainable": lora.trainable_params(t.model),
        "device": str(t.device), "precision": t.precision,
        "tokens_per_step": cfg.tokens_per_step, "train_tokens": t.data.train_tokens,
        "data_source": t.data.source, "data": t.data.summary(), "config": cfg.to_dict(),
        "resumed": t.resume_from is not None,
    }  # fmt: skip
