"""A run's state as typed objects: what setup is handed (RunInputs), what it builds
(RunState: the step loop and the objectives are handed it, they do not reach into the
Trainer), and where the run stands (Progress: step 0, or a checkpoint's)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # types only: these modules need not load with the state
    from core.config.spec import TrainConfig
    from core.data.mix import MixedData
    from core.data.prompts import PromptData
    from core.data.windows import TextWindows, TokenData
    from core.models.model import GPT
    from core.platform.distributed import World
    from core.runs.folder import RunFolder
    from core.runs.lock import RunLock
    from core.training.objectives import Objective
    from core.training.optim import Optimizers
    from core.training.schedule import Plan
    from core.weights.loader import Pretrained


@dataclass
class RunState:
    device: torch.device
    precision: str
    data: TokenData | MixedData | PromptData
    model: GPT
    train_model: torch.nn.Module  # the model as trained: compiled and/or DDP-wrapped
    optimizer: Optimizers
    scaler: torch.amp.GradScaler
    objective: Objective
    world: World
    folder: RunFolder | None = None  # SilentFolder off the main process
    base: dict | None = None  # the pretrained base a checkpoint names
    second_val: TextWindows | None = None  # --eval-data's windows
    # Polled while a step waits on the user's code (a reward): true asks the step to stop.
    interrupt: Callable[[], bool] | None = None
    compiled: str | None = None  # which parts torch.compile compiles; None: eager


@dataclass
class RunInputs:
    """What the Trainer hands setup: the validated config, where the run lives, and what it
    starts from."""

    cfg: TrainConfig  # validated
    folder: RunFolder  # SilentFolder off the main process
    world: World
    lock: RunLock
    pretrained: Pretrained | None = None  # a fine-tune's base
    resume_from: Path | None = None  # the checkpoint a resumed run goes on from
    data_cache: Path | None = None  # the token cache's folder (None: the default)
    allow_data_change: bool = False  # resume on data that changed since the checkpoint
    timed: bool = False  # --max-time: the budget makes the plan once steps are timed


@dataclass
class Progress:
    """Where a run stands when its steps begin."""

    step: int = 0
    plan: Plan | None = None
    best_val: float = math.inf  # the best evaluation value so far (lower is better)
    elapsed_s: float = 0.0  # earlier sessions' seconds
    paused_s: float = 0.0  # of those, the seconds not training
