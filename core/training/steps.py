"""What one optimizer step needs besides the model: mixed precision, moving a batch to the
device, DDP's gradient sync, and the smaller micro-batch an out-of-memory retry uses."""

from __future__ import annotations

import contextlib

import torch

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


def grad_sync(train_model, distributed: bool, last: bool):
    """DDP averages gradients across processes once a step, after the last micro-batch."""
    if distributed and not last:
        return train_model.no_sync()
    return contextlib.nullcontext()
