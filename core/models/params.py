"""Parameter counts of the model, exact, without building it in memory (the meta device)."""

from __future__ import annotations

from typing import Any

from core.models.model import VOCAB_SIZE, GPTConfig


def param_count(
    hidden: int, layers: int, seq_len: int, vocab: int = VOCAB_SIZE, bias: bool = True
) -> int:
    """Exact parameter count of core.models.model.GPT (the output head is tied to the embedding)."""
    d, b = hidden, int(bias)
    per_block = (
        d
        + b * d  # ln1
        + 3 * d * d
        + b * 3 * d  # qkv
        + d * d
        + b * d  # attention projection
        + d
        + b * d  # ln2
        + 4 * d * d
        + b * 4 * d  # mlp fc
        + 4 * d * d
        + b * d  # mlp projection
    )
    return vocab * d + seq_len * d + layers * per_block + d + b * d


COUNTS: dict[str, Any] = {}  # shape (and LoRA) -> count: the form re-estimates on every edit


def counted(key: str, count) -> int:
    if key not in COUNTS:
        COUNTS[key] = count()
    return COUNTS[key]


def meta_model(c: GPTConfig):
    import torch

    from core.models.model import GPT

    with torch.device("meta"):
        return GPT(c)


def shape_key(c: GPTConfig, *extra) -> str:
    import json

    return json.dumps([c.to_dict(), *extra], sort_keys=True, default=str)


def shape_params(c: GPTConfig) -> int:
    """Exact parameter count of the GPT with this shape (counted on the meta device)."""
    return counted(shape_key(c), lambda: meta_model(c).num_params())


def adapter_count(c: GPTConfig, rank: int, targets: str) -> int:
    """Parameters of the LoRA adapters a shape gets (rank x (in + out) per adapted layer)."""
    if not rank:
        return 0
    from core.models.lora import adapted_linears

    def count():
        linears = adapted_linears(meta_model(c), targets)
        return sum(rank * (m.in_features + m.out_features) for _, m in linears)

    return counted(shape_key(c, rank, targets), count)


def adapted_weights(c: GPTConfig, targets: str) -> int:
    """Weights of the layers LoRA adapts (the ones a 4- or 8-bit base quantizes)."""
    from core.models.lora import adapted_linears

    def count():
        return sum(
            m.in_features * m.out_features for _, m in adapted_linears(meta_model(c), targets)
        )

    return counted(shape_key(c, "adapted", targets), count)


def expert_params(c: GPTConfig, rank: int = 0) -> tuple[int, int, int]:
    """An MoE model's (expert matrices gate_up and down: what a 4-bit base holds in NF4,
    router weights, expert adapters of this rank: --lora-experts); zeros for a dense one."""
    if not c.moe:
        return 0, 0, 0

    def count():
        from core.models.moe import MoE

        matrices = routers = adapters = 0
        for m in meta_model(c).modules():
            if isinstance(m, MoE):
                matrices += m.gate_up.numel() + m.down.numel()
                routers += sum(p.numel() for p in m.router.parameters())
                for w in (m.gate_up, m.down):
                    adapters += rank * w.shape[0] * (w.shape[1] + w.shape[2])
        return matrices, routers, adapters

    key = shape_key(c, "experts", rank)
    if key not in COUNTS:
        COUNTS[key] = count()
    return COUNTS[key]


def inactive_params(c: GPTConfig) -> int:
    """An MoE model's expert weights a token does not pass through: (n_experts - top_k) of
    each sparse layer's experts (0 for a dense model)."""
    if not c.moe:
        return 0

    def count():
        from core.models.moe import MoE

        total = 0
        for m in meta_model(c).modules():
            if isinstance(m, MoE):
                experts = sum(
                    p.numel()
                    for name, p in m.named_parameters(recurse=False)
                    if name in ("gate_up", "down", "gate_up_bias", "down_bias")
                )
                total += experts * (m.n_experts - m.top_k) // m.n_experts
        return total

    return counted(shape_key(c, "inactive"), count)


def active_params(c: GPTConfig) -> int:
    """Parameters one token passes through: all of a dense model's, an MoE model's without
    the experts its router leaves out (what compute and speed go by)."""
    return shape_params(c) - inactive_params(c)
