"""Preference tuning by DPO (Direct Preference Optimization):

    loss = -log sigmoid(beta * ((log p(chosen) - log p_ref(chosen))
                                - (log p(rejected) - log p_ref(rejected))))

with log-probabilities summed over each answer's tokens. The reference is the model the run
starts from: under LoRA the same model with its adapters off (no second copy), for full
fine-tuning log-probabilities computed once before the first step and cached beside the data.
The signals carry TRL's names (rewards/chosen, rewards/rejected, rewards/margins,
rewards/accuracies), so a run reads like a TRL run.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from core.data.prepare import PrepareCancelled
from core.models import lora
from core.training.steps import autocast, to_device

SIGNALS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")


def dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta: float, smoothing: float = 0.0):
    """(per-pair losses, chosen rewards, rejected rewards); smoothing > 0: the conservative
    DPO of a share of mislabelled pairs (as TRL's label_smoothing)."""
    chosen_reward = beta * (chosen - ref_chosen)
    rejected_reward = beta * (rejected - ref_rejected)
    margin = chosen_reward - rejected_reward
    losses = -F.logsigmoid(margin) * (1 - smoothing) - F.logsigmoid(-margin) * smoothing
    return losses, chosen_reward.detach(), rejected_reward.detach()


def signal_sums(chosen_reward, rejected_reward) -> torch.Tensor:
    """The four signals summed over pairs (divided by the pair count when read)."""
    return torch.stack([
        chosen_reward.sum(), rejected_reward.sum(), (chosen_reward - rejected_reward).sum(),
        (chosen_reward > rejected_reward).float().sum(),
    ])  # fmt: skip


def signals(sums: torch.Tensor, pairs: int, prefix: str = "") -> dict:
    return {prefix + name: v / pairs for name, v in zip(SIGNALS, sums.tolist(), strict=True)}


def _split(logps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    half = logps.shape[0] // 2  # pair_batch puts the chosen rows first
    return logps[:half], logps[half:]


class Reference:
    """The reference model's log-probabilities of a batch's (chosen, rejected) answers."""

    def __init__(self, model, cached: np.ndarray | None):
        self.model = model
        self.cached = None if cached is None else torch.from_numpy(cached)

    def __call__(self, x, y, mask, pair_ids, precision: str):
        if self.cached is not None:
            ref = self.cached[pair_ids].to(x.device)
            return ref[:, 0], ref[:, 1]
        return reference_logps(self.model, x, y, mask, precision)


@torch.no_grad()
def reference_logps(model, x, y, mask, precision: str):
    """The adapters-off model's log-probs, in eval mode (no dropout: the same every time)."""
    was_training = model.training
    model.eval()
    try:
        with lora.adapters_disabled(model), autocast(x.device, precision):
            _, logps = model(x, y, mask, per_sequence=True)
    finally:
        model.train(was_training)
    return _split(logps.float())


def _pair_losses(t, model, starts: torch.Tensor, val: bool = False):
    """(per-pair losses, chosen rewards, rejected rewards) of the pairs at starts, through
    model (trainer t's model as it trains, or as it evaluates)."""
    x, y, mask, pair_ids = t.data.pair_batch(starts, val)
    x, y, mask = (to_device(v, t.device) for v in (x, y, mask))
    ref_c, ref_r = t.reference(x, y, mask, pair_ids, t.precision)
    with autocast(t.device, t.precision):
        _, logps = model(x, y, mask, per_sequence=True)
    chosen, rejected = _split(logps.float())
    return dpo_loss(chosen, rejected, ref_c, ref_r, t.cfg.dpo_beta, t.cfg.dpo_label_smoothing)


def micro_loss(t, starts: torch.Tensor):
    """The DPO loss of one micro-batch of pairs (trainer t) and its signal sums."""
    losses, rc, rr = _pair_losses(t, t.train_model, starts)
    return losses.mean(), signal_sums(rc, rr)


@torch.no_grad()
def evaluate(t, n_pairs: int) -> tuple[float, dict]:
    """The mean DPO loss over (up to n_pairs) held-out pairs, and TRL's eval_ signals."""
    model = t.model
    model.eval()
    total, sums, count = 0.0, torch.zeros(4), 0
    try:
        for chunk in t.data.val_pair_starts(n_pairs).split(t.cfg.batch_size):
            losses, rc, rr = _pair_losses(t, model, chunk, val=True)
            total += float(losses.sum())
            sums += signal_sums(rc, rr).cpu()
            count += len(chunk)
    finally:
        model.train()
    return total / count, signals(sums, count, "eval_")


# -- the cached reference of a full fine-tune ---------------------------------------------------


def _cache_file(t) -> Path:
    """Keyed by the data (its cache entry), the starting model's weights and the settings
    that change the numbers."""
    key = {
        "model": (t.base or {}).get("fingerprint"),
        "data": t.data.manifest["fingerprint"],
        "seq_len": t.cfg.seq_len,
        "precision": t.precision,
        "device": t.device.type,
    }
    digest = hashlib.blake2b(json.dumps(key, sort_keys=True).encode(), digest_size=10)
    return t.data.folder / f"reference-{digest.hexdigest()}.npy"


def _compute_all(t) -> np.ndarray:
    """Reference log-probs of every pair (training then held-out), one pass, in batches."""
    data, row = t.data, t.data.row
    n_train = len(data.train) // (2 * row)
    n_val = len(data.val) // (2 * row)
    out = np.zeros((n_train + n_val, 2), dtype=np.float32)
    done = 0
    for val, n in ((False, n_train), (True, n_val)):
        starts = torch.arange(n) * 2 * row
        for chunk in starts.split(t.cfg.batch_size):
            if t.control.stop_set():
                raise PrepareCancelled("dpo: stopped while computing the reference; nothing saved")
            x, y, mask, pair_ids = data.pair_batch(chunk, val=val)
            x, y, mask = (to_device(v, t.device) for v in (x, y, mask))
            ref_c, ref_r = reference_logps(t.model, x, y, mask, t.precision)
            out[pair_ids.numpy(), 0] = ref_c.cpu().numpy()
            out[pair_ids.numpy(), 1] = ref_r.cpu().numpy()
            done += len(chunk)
            t.events.on_prepare("reference log-probs", done, n_train + n_val)
    return out


def make_reference(t) -> Reference:
    """Before the first step (and before a resumed run's weights are loaded, so the model
    is still the starting one): adapters-off under LoRA, else the cached log-probs,
    computed now if no cache holds them."""
    if t.cfg.lora_rank:
        return Reference(t.model, None)
    path = _cache_file(t)
    if path.is_file():
        t.log(f"dpo: reference log-probs reused from {path}")
        return Reference(t.model, np.load(path))
    values = _compute_all(t)
    tmp = path.with_suffix(f".tmp-{os.getpid()}.npy")
    np.save(tmp, values)
    os.replace(tmp, path)
    t.log(f"dpo: reference log-probs of {len(values):,} pairs computed and cached in {path}")
    return Reference(t.model, values)
