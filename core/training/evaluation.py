"""Evaluation points: the validation loss over a fixed number of windows, bits per byte, and a
text sample drawn with its own generator (so sampling never moves the training RNG)."""

from __future__ import annotations

import math

import torch

from core.data.windows import TokenData
from core.training.steps import autocast, media, to_device


def validation_loss(
    model, train_model, data: TokenData, windows: int, batch: int, device, precision
) -> float:
    """The mean loss over the scored tokens of `windows` validation windows; for a mix of
    sources (core.data.mix), the weighted mean of each source's own over its share of them."""
    parts = getattr(data, "parts", None)
    if not parts:
        return _validation_loss(model, train_model, data, windows, batch, device, precision)
    each = -(-windows // len(parts))  # as many windows in all as a single source gets
    losses = [
        _validation_loss(model, train_model, p, each, batch, device, precision) for p in parts
    ]
    return data.mixed_loss(losses)


@torch.no_grad()
def _validation_loss(
    model, train_model, data: TokenData, windows: int, batch: int, device, precision
) -> float:
    model.eval()
    losses, weights = [], []
    for rows in data.val_batches(windows, batch):
        x, y, mask, seg = rows
        with autocast(device, precision):
            parts = (to_device(t, device) for t in (x, y, mask, seg))
            _, loss = train_model(*parts, **media(rows, device))
        losses.append(loss.float())
        # chat: a mean over the scored tokens of all windows, not of per-batch means
        weights.append(float(mask.sum()) if mask is not None else 1.0)
    w = torch.tensor(weights, device=losses[0].device)
    val = (torch.stack(losses) * w).sum().item() / max(float(w.sum()), 1e-9)
    model.train()
    return val


def bits_per_byte(val_loss: float, data: TokenData) -> float:
    """Nats per token -> bits per byte of the held-out text: comparable across tokenizers."""
    return val_loss / math.log(2) / data.val_bytes_per_token


@torch.inference_mode()
def sample_text(model, data: TokenData, tokens: int, seed: int, device, precision) -> str:
    if tokens == 0:
        return ""
    model.eval()
    gen = torch.Generator(device=device).manual_seed(seed)
    prompt = data.prompt()[None].to(device)
    images = getattr(data, "prompt_images", lambda: None)()  # the question's pictures
    extra = {} if images is None else {"images": images.to(device)}
    with autocast(device, precision):
        out = model.generate(prompt, tokens, gen, **extra)
    model.train()
    text = data.tokenizer.decode(out[0].tolist())
    store = getattr(data, "images", None)
    if images is not None and store is not None:  # each image named where its tokens were
        from core.data.images import named_marks

        text = named_marks(text, store.spec, data.prompt_image_names())
    return text


@torch.no_grad()
def windows_loss(model, train_model, windows, batch: int, device, precision) -> float:
    """Mean loss over a TextWindows set (the second validation set), in batches."""
    model.eval()
    total = 0.0
    for start in range(0, len(windows.x), batch):
        x, y = windows.x[start : start + batch], windows.y[start : start + batch]
        with autocast(device, precision):
            _, loss = train_model(to_device(x, device), to_device(y, device))
        total += float(loss) * len(x)
    model.train()
    return total / len(windows.x)


def second_scores(run, batch: int) -> dict:
    """eval_data_loss and eval_data_bpb of the run's (core.training.state.RunState) second
    validation set."""
    w = run.second_val
    loss = windows_loss(run.model, run.train_model, w, batch, run.device, run.precision)
    return {"eval_data_loss": loss, "eval_data_bpb": loss / math.log(2) / w.bytes_per_token}
