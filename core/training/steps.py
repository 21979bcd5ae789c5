"""What one optimizer step needs besides the model: mixed precision, moving a batch to the
device (pinned, non-blocking, one micro-batch ahead on a GPU), DDP's gradient sync, and the
smaller micro-batch an out-of-memory retry uses."""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from core.data.windows import Rows

OOM_ADVICE = (
    "lower batch_size first, then hidden_dim, then n_layers, or train on the CPU (--device cpu)"
)


def smaller_micro_batch(batch_size: int, grad_accum: int) -> tuple[int, int] | None:
    """Halve the micro-batch keeping batch_size * grad_accum exact; None at 1."""
    total = batch_size * grad_accum
    for micro in range(batch_size // 2, 0, -1):
        if total % micro == 0:
            return micro, total // micro
    return None


def autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def to_device(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    if t is None:  # plain text has no loss weights
        return None
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t


def ahead_on(device: torch.device) -> bool:
    """Whether batches are fetched a micro-batch ahead: on a GPU, whose copy then overlaps the
    step before; the CPU reads its batch when it needs it, as it always has."""
    return device.type == "cuda"


class BatchAhead:
    """The next micro-batch, read and on its way to the device while the step before runs
    (its kernels are queued; nothing waits for them). Keyed by the micro-batch's starts,
    compared on the host: a batch for other starts (a smaller micro-batch after an
    out-of-memory retry) is dropped and the right one read."""

    def __init__(self, device: torch.device):
        self.device = device
        self.key: np.ndarray | None = None
        self.batch: tuple | None = None

    def put(self, starts: torch.Tensor, batch: tuple) -> None:
        self.key = starts.numpy().copy()  # host tensors: no device sync
        self.batch = on_device(batch, self.device)

    def take(self, starts: torch.Tensor) -> tuple | None:
        """The batch fetched for starts, or None; either way nothing is kept."""
        key, batch = self.key, self.batch
        self.key = self.batch = None
        if key is None or not np.array_equal(key, starts.numpy()):
            return None
        return batch

    def clear(self) -> None:
        self.key = self.batch = None


def on_device(batch, device: torch.device):
    """A batch's tensors on the device, its rows' images (core.data.windows.Rows) too."""
    images = getattr(batch, "images", None)
    return Rows(tuple(to_device(t, device) for t in batch), to_device(images, device))


def media(batch, device: torch.device | None = None) -> dict:
    """The forward's images= of a batch whose rows hold images (core.data.windows.Rows),
    moved to device where one is given; {} for the rest."""
    images = getattr(batch, "images", None)
    if images is None:
        return {}
    return {"images": images if device is None else to_device(images, device)}


def grad_sync(train_model, distributed: bool, last: bool):
    """DDP averages gradients across processes once a step, after the last micro-batch."""
    if distributed and not last:
        return train_model.no_sync()
    return contextlib.nullcontext()
