"""The optimizer a run trains with: AdamW, or Muon for the hidden weight matrices beside
AdamW for the rest, stepped as one. Each param group keeps its peak lr as `peak_lr`; the
schedule scales every group by the same factor."""

from __future__ import annotations

import torch
import torch.nn as nn

from core.config import recipe
from core.config.spec import TrainConfig
from core.errors import ConfigError


def muon_params(model: nn.Module) -> set[int]:
    """ids of the 2-D weights inside the transformer blocks: attention and MLP matrices.
    Embeddings and the head (tied to them) are lookups and a classifier; Muon's
    orthogonalised step suits neither, nor the 1-D norms and biases."""
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        return set()
    return {id(p) for p in blocks.parameters() if p.dim() == 2 and p.requires_grad}


NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Keller Jordan's quintic, as torch.optim.Muon's


def orthogonalize(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Newton-Schulz: g's nearest semi-orthogonal matrix, roughly (as torch.optim.Muon).
    In bf16 on a GPU; in fp32 on the CPU, where bf16 matrix products are ~300x slower."""
    a, b, c = NS_COEFFICIENTS
    x = g.bfloat16() if g.is_cuda else g.float()
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        m = x @ x.T
        x = a * x + (b * m + c * m @ m) @ x
    return (x.T if tall else x).to(g.dtype)


def whole(t: torch.Tensor, f) -> torch.Tensor:
    """f(t) for a function of the whole matrix; a sharded t (FSDP2's DTensor) is gathered,
    and each process keeps its own rows of the result, so every shard gets the update one
    process would make."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(t, DTensor):
        return f(t)
    full = f(t.full_tensor())  # the same on every process
    return distribute_tensor(full, t.device_mesh, t.placements, src_data_rank=None)


class Muon(torch.optim.Optimizer):
    """Momentum, orthogonalised: the update of torch.optim.Muon (nesterov, decoupled weight
    decay, lr scaled by sqrt(max(1, rows/cols))). Written here because torch's runs its
    Newton-Schulz iteration in bf16 on every device: 20x slower steps on the CPU."""

    def __init__(self, params, lr: float, weight_decay: float = 0.0, momentum: float = 0.95):
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.lerp_(p.grad, 1 - mu)
                update = whole(p.grad.lerp(buf, mu), orthogonalize)
                p.mul_(1 - lr * wd)
                p.add_(update, alpha=-lr * max(1.0, p.size(0) / p.size(1)) ** 0.5)


class Optimizers:
    """One or two torch optimizers that step, save and load as one."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.all = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.all for g in opt.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.all:
            opt.zero_grad(set_to_none=set_to_none)

    def set_lr(self, factor: float) -> None:
        for group in self.param_groups:
            group["lr"] = group["peak_lr"] * factor

    def step(self, scaler: torch.amp.GradScaler) -> None:
        for opt in self.all:
            scaler.step(opt)

    def unscale(self, scaler: torch.amp.GradScaler) -> None:
        for opt in self.all:
            scaler.unscale_(opt)

    def state_dict(self) -> dict:
        if len(self.all) == 1:  # the format checkpoints had before Muon
            return self.all[0].state_dict()
        return {"optimizers": [opt.state_dict() for opt in self.all]}

    def each_state(self, state: dict) -> list[dict]:
        """A saved state_dict() as one state per optimizer, in this object's order."""
        states = state.get("optimizers", [state])
        if len(states) != len(self.all):
            raise ValueError(f"{len(states)} optimizer states saved, {len(self.all)} here")
        return states

    def load_state_dict(self, state: dict) -> None:
        for opt, s in zip(self.all, self.each_state(state), strict=True):
            opt.load_state_dict(s)


def adamw_8bit(groups: list[dict], lr: float, betas: tuple) -> torch.optim.Optimizer:
    """bitsandbytes' AdamW with block-wise 8-bit moments: 2 bytes of state a weight instead
    of 8 (tensors under 4096 elements keep fp32 moments). It runs on the CPU as well."""
    try:
        from bitsandbytes.optim import AdamW8bit
    except ImportError:
        raise ConfigError(
            "optimizer: adamw8bit needs the bitsandbytes package (pip install bitsandbytes); "
            "use adamw",
            field="optimizer",
        ) from None
    return AdamW8bit(groups, lr=lr, betas=betas)


def make(model: nn.Module, cfg: TrainConfig) -> Optimizers:
    params = [p for p in model.parameters() if p.requires_grad]
    hidden = muon_params(model) if recipe.optimizer(cfg) == "muon" else set()
    rest = [p for p in params if id(p) not in hidden]
    adam_lr = recipe.adamw_lr(cfg)
    groups = [
        {"params": [p for p in rest if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0},
    ]
    for group in groups:
        group["peak_lr"] = adam_lr
    betas = (cfg.beta1, cfg.beta2)
    kept = [g for g in groups if g["params"]]
    if recipe.optimizer(cfg) == "adamw8bit":
        out = [adamw_8bit(kept, adam_lr, betas)]
    else:  # fused AdamW, on the CPU too: measured 5x faster per step than the default loop
        out = [torch.optim.AdamW(kept, lr=adam_lr, betas=betas, fused=True)]
    if hidden:
        matrices = [p for p in params if id(p) in hidden]
        lr = recipe.muon_lr(cfg)
        group = {"params": matrices, "peak_lr": lr, "weight_decay": cfg.weight_decay}
        out.insert(0, Muon([group], lr=lr))
    return Optimizers(out)
