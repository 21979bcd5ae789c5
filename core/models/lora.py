"""LoRA: frozen base weights plus trainable low-rank adapters, y = W x + (alpha / r) B A x.

An adapted layer keeps the base Linear's parameter names (weight, bias) and adds lora_A and
lora_B, so the family weight tables, checkpoints and exports keep working; B starts at zero,
so step 0 is exactly the base model. Adapters merge back into W for hf/gguf/safetensors and
go to PEFT's own layout for `--format peft`.

A mixture of experts' stacked projections (core.models.moe: gate_up [E, 2I, H], down
[E, H, I]) get, with `experts`, one adapter pair per expert held stacked too (ExpertLoRA:
A [E, r, in], B [E, out, r]), applied through the same grouped product as the experts, as
PEFT's target_parameters and Unsloth do. The router is frozen unless `router` says otherwise.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from core.errors import ConfigError
from core.models.lora_autograd import lora_linear, serves
from core.models.moe import MoE, expert_matmul

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
        # LoRA's own autograd (core.models.lora_autograd), switched on once by the kernel set
        # the run's device chose (core.models.kernels), where it serves
        self.fast = False

    def forward(self, x):
        if self.fast and serves(self):
            a, b = self.lora_A, self.lora_B
            return lora_linear(x, self.weight, self.bias, a, b, self.scale)
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


class ExpertLoRA(nn.Module):
    """Each expert's own adapter pair for one stacked projection w [E, out, in]:
    y_e = w_e x + scale * B_e A_e x, over the tokens grouped by expert."""

    def __init__(self, w: torch.Tensor, rank: int, alpha: float, dropout: float):
        super().__init__()
        e, out, inp = w.shape
        device = torch.device("cpu") if w.device.type == "meta" else w.device
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        # PEFT's (and LoRALinear's) kaiming_uniform_(a=sqrt(5)) per expert: U(+-1/sqrt(in))
        bound = 1 / math.sqrt(inp)
        self.lora_A = nn.Parameter(torch.empty(e, rank, inp, device=device).uniform_(-bound, bound))
        self.lora_B = nn.Parameter(torch.zeros(e, out, rank, device=device))
        self.lora_dropout = nn.Dropout(dropout)
        self.adapters_off = False

    def forward(self, x: torch.Tensor, base: torch.Tensor, counts: torch.Tensor):
        """x [N, in] sorted by expert (counts rows each), base: the experts' own output."""
        if self.adapters_off:
            return base
        a, b = self.lora_A, self.lora_B
        if self.lora_dropout.p:
            x = self.lora_dropout(x)
        # scale on the rank-wide A x, not the wide output; base takes the delta in place (no
        # product's backward needs its own output): two passes over [N, out] fewer
        low = expert_matmul(x.to(a.dtype), a, counts).mul_(self.scale)
        delta = expert_matmul(low, b, counts)
        return base.add_(delta) if delta.dtype == base.dtype else base + delta.to(base.dtype)

    def delta(self) -> torch.Tensor:
        """scale * B A per expert, fp32 [E, out, in]."""
        return self.scale * torch.bmm(self.lora_B.float(), self.lora_A.float())


def moe_blocks(model) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def check_rank(model, rank: int, targets: str, experts: bool = False) -> None:
    """One line for a rank past an adapted layer's width, or targets that adapt nothing (a
    mixture whose every MLP is experts, with mlp: its experts adapt with experts=True)."""
    sizes = [min(m.in_features, m.out_features) for _, m in adapted_linears(model, targets)]
    if not sizes and not experts:
        raise ConfigError(
            f"lora_targets: {targets} adapts no layer of this model (its MLPs are experts: "
            "add lora_experts, or use attn or all)",
            field="lora_targets",
        )
    smallest = min(sizes, default=rank)
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


def apply_lora(
    model, rank: int, alpha: float, dropout: float, targets: str, experts: bool = False
) -> None:
    """Freeze every parameter, then give the target layers trainable adapters (experts:
    each MoE block's experts too)."""
    check_rank(model, rank, targets, experts)
    blocks = moe_blocks(model)
    if experts:
        check_experts(blocks, rank)
    for p in model.parameters():
        p.requires_grad_(False)
    for name, linear in adapted_linears(model, targets):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, LoRALinear(linear, rank, alpha, dropout))
    for m in blocks if experts else []:
        m.gate_up_lora = ExpertLoRA(m.gate_up, rank, alpha, dropout)
        m.down_lora = ExpertLoRA(m.down, rank, alpha, dropout)


def check_experts(blocks: list[MoE], rank: int) -> None:
    if not blocks:
        raise ConfigError(
            "lora_experts: this model has no experts (a dense model); it applies to "
            "mixture-of-experts models only",
            field="lora_experts",
        )
    smallest = min(min(m.down.shape[1:]) for m in blocks)
    if rank > smallest:
        raise ConfigError(
            f"lora_rank: {rank} is larger than the experts' smallest dimension ({smallest})",
            field="lora_rank",
        )


def set_router(model, trains: bool) -> None:
    """The routers frozen (the default under every method) or trained (train_router)."""
    blocks = moe_blocks(model)
    if trains and not blocks:
        raise ConfigError(
            "train_router: this model has no router (a dense model); it applies to "
            "mixture-of-experts models only",
            field="train_router",
        )
    for m in blocks:
        m.router.requires_grad_(trains)


def apply_config(model, cfg) -> None:
    """apply_lora with a TrainConfig's LoRA settings (a no-op at rank 0), and the routers
    frozen or trained as it says."""
    if cfg.lora_rank:
        alpha = cfg.lora_scale_alpha
        experts = cfg.lora_experts
        apply_lora(model, cfg.lora_rank, alpha, cfg.lora_dropout, cfg.lora_targets, experts)
    set_router(model, cfg.train_router)
    if cfg.lora_rank and cfg.train_router:  # the base's routers, for adapters_disabled
        for m in moe_blocks(model):
            m.router_start = [p.detach().clone() for p in m.router.parameters()]


def adapt_vision(vision: nn.Module, rank: int, alpha: float, dropout: float) -> None:
    """--train-vision under LoRA, on a vision tower and its projector (core.models.vision):
    adapters on every linear layer of both; a projector with no linear layer (Gemma 3's is
    one matrix held as a parameter) trains whole, as PEFT's modules_to_save would."""
    linears = [(n, m) for n, m in vision.named_modules() if type(m) is nn.Linear]
    smallest = min((min(m.in_features, m.out_features) for _, m in linears), default=rank)
    if rank > smallest:
        raise ConfigError(
            f"lora_rank: {rank} is larger than the vision tower's smallest adapted dimension "
            f"({smallest}); lower it or leave train_vision off",
            field="lora_rank",
        )
    vision.requires_grad_(False)
    for name, linear in linears:
        parent_name, _, child = name.rpartition(".")
        setattr(vision.get_submodule(parent_name), child, LoRALinear(linear, rank, alpha, dropout))
    projector = getattr(vision, "multi_modal_projector", None)  # Qwen's merger: in the tower
    if projector is not None and not any(isinstance(m, LoRALinear) for m in projector.modules()):
        projector.requires_grad_(True)
        # the base's values, for adapters_disabled (DPO's and GRPO's reference)
        projector.base_values = [p.detach().clone() for p in projector.parameters()]


@contextlib.contextmanager
def adapters_disabled(model):
    """The base model alone while inside: with LoRA, the reference of preference tuning
    needs no second copy of the model."""
    layers = [m for m in model.modules() if isinstance(m, (LoRALinear, ExpertLoRA))]
    routers = [m for m in moe_blocks(model) if m.router_start is not None]
    for m in layers:
        m.adapters_off = True
    trained = [swap_router(m, m.router_start) for m in routers]  # --train-router's
    # a vision projector trained whole under LoRA (--train-vision): the base's values
    wholes = [m for m in model.modules() if getattr(m, "base_values", None) is not None]
    whole = [swap(m.parameters(), m.base_values) for m in wholes]
    try:
        yield model
    finally:
        for m in layers:
            m.adapters_off = False
        for m, values in zip(routers, trained, strict=True):
            swap_router(m, values)
        for m, values in zip(wholes, whole, strict=True):
            swap(m.parameters(), values)


def swap_router(m: MoE, values: list[torch.Tensor]) -> list[torch.Tensor]:
    """Put values in m's router parameters in place; what they held before."""
    return swap(m.router.parameters(), values)


def swap(params, values: list[torch.Tensor]) -> list[torch.Tensor]:
    """Put values in params in place; what they held before."""
    params = list(params)
    before = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, v in zip(params, values, strict=True):
            p.copy_(v)
    return before


def is_adapter(name: str) -> bool:
    return ".lora_A" in name or ".lora_B" in name


def is_router(name: str) -> bool:
    return ".mlp.router." in name


def adapter_state(model) -> dict[str, torch.Tensor]:
    """What a LoRA run trains: the adapters, and the routers and a vision projector where
    they train whole."""
    trained = {
        n
        for n, p in model.named_parameters()
        if p.requires_grad and (is_router(n) or n.startswith("vision."))
    }
    return {k: v for k, v in model.state_dict().items() if is_adapter(k) or k in trained}


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
    for m in moe_blocks(model):
        for leaf in ("gate_up", "down"):
            adapter = getattr(m, f"{leaf}_lora", None)
            if adapter is not None:
                w = getattr(m, leaf)
                merged = (w.float() + adapter.delta()).to(w.dtype).detach()
                setattr(m, leaf, nn.Parameter(merged, requires_grad=False))
                setattr(m, f"{leaf}_lora", None)


def freeze_to(model, dtype: torch.dtype) -> None:
    """Keep the frozen Linear weights of the blocks, and a mixture's experts, in dtype
    (bf16/fp16 on a GPU: half the memory); norms, embeddings, the adapters and a trained
    router stay fp32."""
    for name, m in model.named_modules():
        frozen = isinstance(m, nn.Linear) and not m.weight.requires_grad
        if name.startswith("blocks.") and frozen:
            m.weight.data = m.weight.data.to(dtype)
            if m.bias is not None:
                m.bias.data = m.bias.data.to(dtype)
    for m in moe_blocks(model):
        for leaf in ("gate_up", "down", "gate_up_bias", "down_bias"):
            p = getattr(m, leaf, None)
            if p is not None and not p.requires_grad:
                p.data = p.data.to(dtype)


def adapter_params(model) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if is_adapter(n))


def trainable_params(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
