"""What a run is built from, as one typed object: setup makes it, the step loop and the
objectives read it (they are handed it, they do not reach into the Trainer)."""

from __future__ import annotations

from dataclasses import dataclass
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
