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
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from core.config.methods import dpo as declared
from core.config.spec import TrainConfig
from core.data.prepare import PrepareCancelled
from core.models import lora
from core.models.loss import sequence_logps
from core.platform.atomic import atomic_write
from core.training.objectives import Objective, StepSignals
from core.training.state import RunState
from core.training.steps import autocast, media, to_device

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
    return torch.stack(
        [
            chosen_reward.sum(),
            rejected_reward.sum(),
            (chosen_reward - rejected_reward).sum(),
            (chosen_reward > rejected_reward).float().sum(),
        ]
    )


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

    def __call__(self, x, y, mask, pair_ids, precision: str, images=None):
        if self.cached is not None:
            ref = self.cached[pair_ids].to(x.device)
            return ref[:, 0], ref[:, 1]
        return reference_logps(self.model, x, y, mask, precision, images)


@torch.no_grad()
def reference_logps(model, x, y, mask, precision: str, images=None):
    """The adapters-off model's log-probs, in eval mode (no dropout: the same every time)."""
    was_training = model.training
    model.eval()
    try:
        with lora.adapters_disabled(model), autocast(x.device, precision):
            logps, _ = answer_logps(model, model, x, y, mask, images=images)
    finally:
        model.train(was_training)
    return _split(logps.float())


def answer_logps(model, gpt, x, y, mask, real=None, images=None):
    """(each row's summed log-probability of its masked targets, the MoE penalty or None):
    model runs the forward (the model as it trains may be compiled or DDP-wrapped), gpt is
    the model itself, whose head makes the log-probabilities a chunk at a time. images: the
    pixel values of the rows' images (a prompt that shows some), in the order of their tokens."""
    seen = {} if images is None else {"images": images}
    hidden, penalty = model(x, real=real, **seen)
    return sequence_logps(gpt.output_head(), hidden, y, mask), penalty


def in_use(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) a pair row's tokens before its padding: an answer's targets run to the row's
    last real token, which is the input one position after the last target."""
    pos = torch.arange(mask.shape[1], device=mask.device)
    last = torch.where(mask > 0, pos, -1).max(dim=1).values
    return pos <= last[:, None] + 1


def _pair_losses(run: RunState, cfg: TrainConfig, reference, model, starts, val: bool = False):
    """(per-pair losses, chosen rewards, rejected rewards, the MoE penalty or None) of the
    pairs at starts, through model (the model as it trains, or as it evaluates)."""
    batch = run.data.pair_batch(starts, val)
    x, y, mask, pair_ids = batch
    x, y, mask = (to_device(v, run.device) for v in (x, y, mask))
    images = media(batch, run.device).get("images")
    ref_c, ref_r = reference(x, y, mask, pair_ids, run.precision, images)
    with autocast(run.device, run.precision):
        logps, penalty = answer_logps(model, run.model, x, y, mask, in_use(mask), images)
    chosen, rejected = _split(logps.float())
    losses = dpo_loss(chosen, rejected, ref_c, ref_r, cfg.dpo_beta, cfg.dpo_label_smoothing)
    return (*losses, penalty)


class DPO(Objective):
    """The objective (core.training.objectives): pairs in, the DPO loss and TRL's signals out."""

    name = declared.METHOD.name  # fields, checks, plots: core/config/methods/dpo.py

    def __init__(self, cfg: TrainConfig):
        self.reference: Reference | None = None

    def prepare(self, run: RunState, cfg: TrainConfig, log, events, stop) -> None:
        """The starting model's view, before a checkpoint replaces it."""
        self.reference = make_reference(run, cfg, log, events, stop)

    def micro_loss(self, run: RunState, cfg: TrainConfig, starts):
        """The DPO loss of one micro-batch of pairs and its signal sums."""
        losses, rc, rr, penalty = _pair_losses(run, cfg, self.reference, run.train_model, starts)
        # an MoE's load-balancing loss, where enabled
        loss = losses.mean() if penalty is None else losses.mean() + penalty
        return loss, signal_sums(rc, rr)

    def records(self, steps: list[StepSignals], cfg: TrainConfig, world) -> list[dict]:
        """The signals of each pending step, read in the same sync as the losses."""
        pairs = cfg.batch_size * cfg.grad_accum * world.size
        stacked = world.mean(torch.stack([s.sums for s in steps])) * world.size
        return [signals(s, pairs) for s in stacked.cpu()]

    @torch.no_grad()
    def evaluate(self, run: RunState, cfg: TrainConfig) -> tuple[float, dict, str]:
        """The mean DPO loss over held-out pairs, and TRL's eval_ signals."""
        n_pairs = cfg.eval_batches * cfg.batch_size * cfg.grad_accum
        model = run.model
        model.eval()
        total, sums, count = 0.0, torch.zeros(4), 0
        try:
            for chunk in run.data.val_pair_starts(n_pairs).split(cfg.batch_size):
                losses, rc, rr, _ = _pair_losses(run, cfg, self.reference, model, chunk, val=True)
                total += float(losses.sum())
                sums += signal_sums(rc, rr).cpu()
                count += len(chunk)
        finally:
            model.train()
        val, extra = total / count, signals(sums, count, "eval_")
        line = (
            f"val_loss {val:.4f}, margin {extra['eval_rewards/margins']:.4f}, "
            f"accuracy {extra['eval_rewards/accuracies']:.3f}"
        )
        return val, {"val_loss": val, **extra}, line


# -- the cached reference of a full fine-tune ---------------------------------------------------


def _cache_file(run: RunState, cfg: TrainConfig) -> Path:
    """Keyed by the data (its cache entry), the starting model's weights and the settings
    that change the numbers."""
    key = {
        "model": (run.base or {}).get("fingerprint"),
        "data": run.data.manifest["fingerprint"],
        "seq_len": cfg.seq_len,
        "precision": run.precision,
        "device": run.device.type,
    }
    digest = hashlib.blake2b(json.dumps(key, sort_keys=True).encode(), digest_size=10)
    return run.data.folder / f"reference-{digest.hexdigest()}.npy"


def _compute_all(run: RunState, batch_size: int, events, stop) -> np.ndarray:
    """Reference log-probs of every pair (training then held-out), one pass, in batches."""
    data, row = run.data, run.data.row
    n_train = len(data.train) // (2 * row)
    n_val = len(data.val) // (2 * row)
    out = np.zeros((n_train + n_val, 2), dtype=np.float32)
    done = 0
    for val, n in ((False, n_train), (True, n_val)):
        starts = torch.arange(n) * 2 * row
        for chunk in starts.split(batch_size):
            if stop():
                raise PrepareCancelled("dpo: stopped while computing the reference; nothing saved")
            batch = data.pair_batch(chunk, val=val)
            x, y, mask, pair_ids = batch
            x, y, mask = (to_device(v, run.device) for v in (x, y, mask))
            images = media(batch, run.device).get("images")
            ref_c, ref_r = reference_logps(run.model, x, y, mask, run.precision, images)
            out[pair_ids.numpy(), 0] = ref_c.cpu().numpy()
            out[pair_ids.numpy(), 1] = ref_r.cpu().numpy()
            done += len(chunk)
            events.on_prepare("reference log-probs", done, n_train + n_val)
    return out


def make_reference(run: RunState, cfg: TrainConfig, log, events, stop) -> Reference:
    """Before the first step (and before a resumed run's weights are loaded, so the model
    is still the starting one): adapters-off under LoRA, else the cached log-probs,
    computed now if no cache holds them."""
    if cfg.lora_rank:
        return Reference(run.model, None)
    path = _cache_file(run, cfg)
    if path.is_file():
        log(f"dpo: reference log-probs reused from {path}")
        return Reference(run.model, np.load(path))
    values = _compute_all(run, cfg.batch_size, events, stop)
    atomic_write(path, lambda f: np.save(f, values))  # a killed write leaves no half file
    log(f"dpo: reference log-probs of {len(values):,} pairs computed and cached in {path}")
    return Reference(run.model, values)
