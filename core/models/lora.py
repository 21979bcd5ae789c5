"""LoRA: frozen base weights plus trainable low-rank adapters, y = W x + (alpha / r) B A x.

An adapted layer keeps the base Linear's parameter names (weight, bias) and adds lora_A and
lora_B, so the family weight tables, checkpoints and exports keep working; B starts at zero,
so step 0 is exactly the base model. Adapters merge back into W for hf/gguf/safetensors and
go to PEFT's own layout for `--format peft`.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from core.errors import ConfigError

TARGETS = {
    "attn": ("attn.qkv", "attn.proj"),
    "mlp": ("mlp.fc", "mlp.proj", "dense.fc", "dense.proj"),  # dense: Gemma 4 MoE's dense MLP
    "all": ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj", "dense.fc", "dense.proj"),
}


class LoRALinear(nn.Linear):
    """A Linear whose weight and bias are frozen and shared with the base layer."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float):
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.rank, self.alpha = rank, alpha
        self.scale = alpha / rank
        device = base.weight.device
        if device.type == "meta":  # a memory-mapped base made later: the adapters are real
            device = torch.device("cpu")
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, device=device))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, device=device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as PEFT initialises A
        self.lora_dropout = nn.Dropout(dropout)
        self.base_quantized = None  # a bitsandbytes layer holding the base (core.models.quant)
        self.adapters_off = False  # True: the base layer alone (DPO's reference model)

    def forward(self, x):
        if self.base_quantized is not None:
            base = self.base_quantized(x)
            base = base + self.bias if self.bias is not None else base
        else:
            base = F.linear(x, self.weight, self.bias)
        if self.adapters_off:
            return base
        a, b = self.lora_A, self.lora_B
        if self.lora_dropout.p:  # at the default 0 no dropout work at all
            x = self.lora_dropout(x)
        # In place, with older runs' numbers: a Linear's backward never needs its own output
        # (bitsandbytes' neither), and scale * delta is delta.mul_(scale) bit for bit.
        delta = F.linear(F.linear(x.to(a.dtype), a), b).mul_(self.scale)
        if delta.dtype != base.dtype:
            return base + delta.to(base.dtype)
        return base.add_(delta)

    def merged_weight(self) -> torch.Tensor:
        delta = self.scale * (self.lora_B.float() @ self.lora_A.float())
        return (self.weight.float() + delta).to(self.weight.dtype)


def check_rank(model, rank: int, targets: str) -> None:
    smallest = min(min(m.in_features, m.out_features) for _, m in adapted_linears(model, targets))
    if rank > smallest:
        raise ConfigError(
            f"lora_rank: {rank} is larger than the smallest adapted dimension ({smallest})",
            field="lora_rank",
        )


def adapted_linears(model, targets: str):
    """(name, Linear) of every layer the targets name."""
    suffixes = TARGETS[targets]
    return [
        (n, m)
        for n, m in model.named_modules()
        if n.endswith(suffixes) and isinstance(m, nn.Linear)
    ]


def apply_lora(model, rank: int, alpha: float, dropout: float, targets: str) -> None:
    """Freeze every parameter, then give the target layers trainable adapters."""
    check_rank(model, rank, targets)
    for p in model.parameters():
        p.requires_grad_(False)
    for name, linear in adapted_linears(model, targets):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, LoRALinear(linear, rank, alpha, dropout))


def apply_config(model, cfg) -> None:
    """apply_lora with a TrainConfig's LoRA settings (a no-op at rank 0)."""
    if cfg.lora_rank:
        alpha = cfg.lora_scale_alpha
        apply_lora(model, cfg.lora_rank, alpha, cfg.lora_dropout, cfg.lora_targets)


@contextlib.contextmanager
def adapters_disabled(model):
    """The base model alone while inside: with LoRA, the reference of preference tuning
    needs no second copy of the model."""
    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    for m in layers:
        m.adapters_off = True
    try:
        yield model
    finally:
        for m in layers:
            m.adapters_off = False


def is_adapter(name: str) -> bool:
    return ".lora_A" in name or ".lora_B" in name


def adapter_state(model) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if is_adapter(k)}


def merge(model) -> None:
    """Fold every adapter into its base weight, leaving plain Linear layers."""
    for name, m in list(model.named_modules()):
        if isinstance(m, LoRALinear):
            plain = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None)
            plain.weight = nn.Parameter(m.merged_weight().detach(), requires_grad=False)
            if m.bias is not None:
                plain.bias = nn.Parameter(m.bias.detach(), requires_grad=False)
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, plain)


def freeze_to(model, dtype: torch.dtype) -> None:
    """Keep the frozen Linear weights of the blocks in dtype (bf16/fp16 on a GPU: half the
    memory); norms, embeddings and the adapters stay fp32."""
    for name, m in model.named_modules():
        if name.startswith("blocks.") and isinstance(m, nn.Linear):
            m.weight.data = m.weight.data.to(dtype)
            if m.bias is not None:
                m.bias.data = m.bias.data.to(dtype)


def adapter_params(model) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if is_adapter(n))


def trainable_params(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
