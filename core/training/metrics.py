"""The records a run writes to metrics.jsonl and sends to the window, one per step."""

from __future__ import annotations

import math

from core.config import recipe
from core.config.spec import TrainConfig
from core.errors import TrainingError
from core.models import lora


def train_records(
    steps: list[tuple[int, float]],
    losses: list[float],
    cfg: TrainConfig,
    train_tokens: int,
    common: dict,
    extras=None,
) -> list[dict]:
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
        records.append(
            {
                "step": step,
                "loss": loss,
                "lr": lr,
                "max_steps": common["max_steps"],
                "tokens_per_s": common["tokens_per_s"],
                "epoch": epoch,
                "elapsed_s": common["elapsed_s"],
                "batch_size": cfg.batch_size,
                "grad_accum": cfg.grad_accum,
                **extra,
                **common["memory"],
            }
        )
    return records


def start_record(run, cfg: TrainConfig, step: int, max_steps: int, resumed: bool) -> dict:
    """What the front ends show when the steps start (on_train_start), from the run's state
    (core.training.state.RunState)."""
    return {
        "run_dir": str(run.folder.path),
        "start_step": step,
        "max_steps": max_steps,
        "n_params": run.model.num_params(),
        "n_trainable": lora.trainable_params(run.model),
        "device": str(run.device),
        "precision": run.precision,
        "tokens_per_step": cfg.tokens_per_step,
        "train_tokens": run.data.train_tokens,
        "data_source": run.data.source,
        "data": run.data.summary(),
        "config": cfg.to_dict(),
        "resumed": resumed,
        "compiling": run.compiled,  # the parts the first step compiles; None: eager
    }
