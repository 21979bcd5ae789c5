"""A run's state as typed objects: what setup is handed (RunInputs), what it builds
(RunState: the step loop and the objectives are handed it, they do not reach into the
Trainer), and where the run stands (Progress: step 0, or a checkpoint's)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class RunState:
    device: torch.device
    precision: str
    data: Any  # core.data.windows.TokenData, MixedData, or core.data.prompts.PromptData
    model: Any  # core.models.model.GPT
    train_model: Any  # the model as trained: compiled and/or DDP-wrapped
    optimizer: Any  # core.training.optim.Optimizers
    scaler: torch.amp.GradScaler
    objective: Any  # core.training.objectives.Objective
    world: Any  # core.platform.distributed.World
    folder: Any = None  # core.runs.folder.RunFolder (SilentFolder off the main process)
    base: dict | None = None  # the pretrained base a checkpoint names
    second_val: Any = None  # --eval-data's windows (core.data.windows.TextWindows)
    # Polled while a step waits on the user's code (a reward): true asks the step to stop.
    interrupt: Callable[[], bool] | None = None


@dataclass
class RunInputs:
    """What the Trainer hands setup: the validated config, where the run lives, and what it
    starts from."""

    cfg: Any  # core.config.spec.TrainConfig, validated
    folder: Any  # core.runs.folder.RunFolder (SilentFolder off the main process)
    world: Any  # core.platform.distributed.World
    lock: Any  # core.runs.lock.RunLock
    pretrained: Any = None  # core.weights.loader.Pretrained: a fine-tune's base
    resume_from: Path | None = None  # the checkpoint a resumed run goes on from
    data_cache: Path | None = None  # the token cache's folder (None: the default)
    allow_data_change: bool = False  # resume on data that changed since the checkpoint
    timed: bool = False  # --max-time: the budget makes the plan once steps are timed


@dataclass
class Progress:
    """Where a run stands when its steps begin."""

    step: int = 0
    plan: Any = None  # core.training.schedule.Plan
    best_val: float = math.inf  # the best evaluation value so far (lower is better)
    elapsed_s: float = 0.0  # earlier sessions' seconds
    paused_s: float = 0.0  # of those, the seconds not training
