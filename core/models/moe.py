"""The mixture-of-experts block: a router picks top_k of n_experts SwiGLU experts for each
token, and the token's output is their weighted sum (Qwen2/3-MoE, Mixtral, OLMoE, gpt-oss).

The experts are stacked tensors in transformers 5.x's fused layout: `gate_up` [E, 2I, H] (the
gate's rows first, then the up rows) and `down` [E, H, I]. Other layouts (per-expert
checkpoints, gpt-oss's interleaved [E, H, 2I]) are converted by the family weight maps.

Gemma 4's form (router "rms_softmax_topk", parallel_dense): the router reads the stream
RMS-normed without scale, times a learned scale and hidden^-0.5, renormalizes its top-k and
scales each by its expert's own factor; a dense MLP runs beside the experts, each with norms
of its own, and their outputs are summed.

The compute never loops over tokens: the token-expert assignments are sorted by expert and
run through one grouped matrix product (`torch.nn.functional.grouped_mm`), or, where this
torch has none for the device and dtype, one matrix product per expert over its contiguous
group. The routing statistics of the last forward stay on the module (`last_stats`), and the
pieces of the load-balancing loss, which `aux_loss` pools over layers as transformers does.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from core.models.per_layer import unit_rms

ROUTERS = ("softmax_topk", "topk_softmax", "rms_softmax_topk")
ACTIVATIONS = ("silu", "gelu_tanh")  # the experts' gate
DEFAULTS = {
    "norm_topk": False,
    "router": "softmax_topk",
    "sparse_layers": None,  # None: every layer
    "shared_expert_dim": None,
    "router_bias": False,
    "expert_bias": False,
    "swiglu_limit": None,
    "swiglu_alpha": None,
    "aux_coef": 0.0,
    "activation": "silu",
    "parallel_dense": False,  # Gemma 4: the dense MLP beside the experts, outputs summed
}
REQUIRED = ("n_experts", "top_k", "expert_dim")


def options(moe: dict) -> dict:
    """The MoE options with their defaults filled in; ValueError names a bad one."""
    missing = [k for k in REQUIRED if k not in moe]
    if missing:
        raise ValueError(f"moe: missing {', '.join(missing)}")
    unknown = sorted(set(moe) - set(REQUIRED) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"moe: unknown option {', '.join(unknown)}")
    o = {**DEFAULTS, **moe}
    if not 1 <= o["top_k"] <= o["n_experts"]:
        raise ValueError(
            f"moe.top_k: must be between 1 and n_experts ({o['n_experts']}), got {o['top_k']}"
        )
    if o["router"] not in ROUTERS:
        raise ValueError(f"moe.router: expected one of {', '.join(ROUTERS)}, got {o['router']!r}")
    if o["activation"] not in ACTIVATIONS:
        raise ValueError(
            f"moe.activation: expected one of {', '.join(ACTIVATIONS)}, got {o['activation']!r}"
        )
    return o


def is_sparse(c, layer: int) -> bool:
    """Whether layer `layer` of a model of shape c has the experts (else a dense MLP)."""
    if not c.moe:
        return False
    layers = c.moe.get("sparse_layers")
    return layers is None or layer in layers


def widths(c) -> tuple[int, int]:
    """The MLP widths a token goes through in a sparse layer of a model of shape c: its top_k
    experts' (top_k x expert_dim), and the dense width beside them (the shared expert's, and
    Gemma 4's dense MLP's: c's ffn_dim; 0 for neither), as MoE builds them."""
    o = options(c.moe)
    beside = (o["shared_expert_dim"] or 0) + (c.ffn_dim if o["parallel_dense"] else 0)
    return o["top_k"] * o["expert_dim"], beside


class Route(NamedTuple):
    """One layer's routing of one forward, the pieces the pooled aux loss needs."""

    counts: torch.Tensor  # [E] float: top-k assignments per expert
    probs: torch.Tensor  # [E] the router's probabilities summed over tokens (with its graph)
    rows: torch.Tensor  # tokens routed (not padding)


class MoE(nn.Module):
    def __init__(self, c, mlp: type[nn.Module], norm=None):
        """c: the model's GPTConfig (core.models.model imports this module, so it is not
        named here); mlp: the dense MLP class, for Qwen2-MoE's shared expert and Gemma 4's
        dense MLP; norm: the model's norm maker (make_norm), for Gemma 4's."""
        super().__init__()
        o = options(c.moe)
        e, i, h = o["n_experts"], o["expert_dim"], c.hidden_dim
        self.n_experts, self.top_k, self.options = e, o["top_k"], o
        self.router = nn.Linear(h, e, bias=o["router_bias"])
        self.gate_up = nn.Parameter(torch.empty(e, 2 * i, h).normal_(std=0.02))
        self.down = nn.Parameter(torch.empty(e, h, i).normal_(std=0.02))
        # each of the optional parts below is None where the model has none
        biased = o["expert_bias"]
        self.gate_up_bias = nn.Parameter(torch.zeros(e, 2 * i)) if biased else None
        self.down_bias = nn.Parameter(torch.zeros(e, h)) if biased else None
        self.shared = self.shared_gate = None
        if o["shared_expert_dim"]:
            shared = dataclasses.replace(
                c, moe=None, ffn_dim=o["shared_expert_dim"], mlp="swiglu", mlp_bias=False
            )
            self.shared = mlp(shared)
            self.shared_gate = nn.Linear(h, 1, bias=False)
        self.router_scale = self.expert_scale = None
        if o["router"] == "rms_softmax_topk":
            self.router_scale = nn.Parameter(torch.ones(h))
            self.expert_scale = nn.Parameter(torch.ones(e))
            self.eps, self.root = c.norm_eps, h**-0.5
        if o["parallel_dense"]:  # its own width and kind: c's ffn_dim and mlp
            self.dense = mlp(c)
            self.dense_norm = norm(c)  # after the dense MLP
            self.in_norm = norm(c)  # before the experts
            self.out_norm = norm(c)  # after them
        # set later: the 4-bit copies of gate_up and down (core.models.quant.NF4Experts,
        # which replace the tensors), their adapters (core.models.lora.ExpertLoRA), and a
        # router's starting weights where --train-router trains it (core.models.lora)
        self.gate_up_nf4 = self.down_nf4 = None
        self.gate_up_lora = self.down_lora = None
        self.router_start: list | None = None
        self.drop = nn.Dropout(c.dropout)
        self.last_stats: tuple | None = None
        self.last_route: Route | None = None
        self.real: torch.Tensor | None = None  # [tokens] 1 where a token is not padding

    def forward(self, x, remake=None, stream=None):
        """x (..., H): the normed stream; stream: the stream before that norm, which Gemma
        4's router and experts read (its dense MLP reads x)."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        src = x if stream is None else stream.reshape(-1, shape[-1])
        logits = self.router(self._router_input(src))
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)
        if self.options["router"] == "topk_softmax":  # gpt-oss
            top, index = logits.topk(self.top_k, dim=-1)
            weights = F.softmax(top, dim=-1, dtype=torch.float32)
        else:
            weights, index = probs.topk(self.top_k, dim=-1)
            if self.options["norm_topk"]:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            if self.expert_scale is not None:
                weights = weights * self.expert_scale[index]
        if self.options["parallel_dense"]:
            out = self.out_norm(self._experts(self.in_norm(src), index, weights.to(x.dtype)))
            out = self.dense_norm(self.dense(x, remake)) + out
        else:
            out = self._experts(src, index, weights.to(x.dtype))
        if self.shared is not None:
            out = out + torch.sigmoid(self.shared_gate(x)) * self.shared(x)
        self._keep_stats(probs, index)
        return self.drop(out).view(shape)

    def _router_input(self, x):
        if self.router_scale is None:
            return x
        return unit_rms(x, self.eps) * self.router_scale * self.root

    def _experts(self, x, index, weights):
        """sum_k weights[t, k] * expert_{index[t, k]}(x[t]) for every token t."""
        flat = index.reshape(-1)
        order = flat.argsort(stable=True)
        token = order // self.top_k
        expert = flat[order]
        counts = torch.zeros(self.n_experts, dtype=torch.long, device=x.device)
        counts.scatter_add_(0, flat, torch.ones_like(flat))
        h = self._project(self.gate_up, self.gate_up_nf4, self.gate_up_lora, x[token], counts)
        if self.gate_up_bias is not None:
            h = h + self.gate_up_bias[expert].to(h.dtype)
        h = self._activate(h)
        y = self._project(self.down, self.down_nf4, self.down_lora, h, counts)
        if self.down_bias is not None:
            y = y + self.down_bias[expert].to(y.dtype)
        # back to (token, k) order and summed over k: a gather, deterministic on CUDA too
        # (index_add_'s atomics are not) and without index_add_'s slow CPU path
        back = torch.empty_like(order)
        back[order] = torch.arange(order.numel(), device=order.device)
        y = y[back].view(*index.shape, -1) * weights.unsqueeze(-1)
        return y.sum(dim=1).to(x.dtype)

    @staticmethod
    def _project(weight, quantized, adapter, x, counts):
        """One stacked projection (gate_up or down) of the grouped tokens: from its 4-bit
        copy where the base is quantized, plus its experts' adapters under LoRA."""
        y = expert_matmul(x, weight, counts) if quantized is None else quantized(x, counts)
        return y if adapter is None else adapter(x, y, counts)

    def _activate(self, h):
        gate, up = h.chunk(2, dim=-1)
        limit, alpha = self.options["swiglu_limit"], self.options["swiglu_alpha"]
        if self.options["activation"] == "gelu_tanh":  # Gemma 4
            return F.gelu(gate, approximate="tanh") * up
        if limit is None:
            return F.silu(gate) * up
        # gpt-oss: clamped, sigmoid(alpha * gate) and (up + 1)
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * (alpha or 1.0)))

    def _keep_stats(self, probs, index):
        """The routing's statistics over the tokens in use: padding is left out of the load,
        the entropy and the aux loss, as transformers' attention_mask leaves it out."""
        real = self.real
        if real is None or real.shape[0] != probs.shape[0]:  # a forward without the mask
            real = torch.ones(probs.shape[0], dtype=torch.float32, device=probs.device)
        counts = torch.zeros(self.n_experts, dtype=torch.float32, device=probs.device)
        weights = real[:, None].expand(index.shape).reshape(-1)
        counts.scatter_add_(0, index.reshape(-1), weights)
        route = Route(counts, (probs * real[:, None]).sum(dim=0), real.sum())
        self.last_route = route
        with torch.no_grad():
            each = -(probs * probs.clamp_min(1e-30).log()).sum(dim=-1)
            entropy = (each * real).sum() / real.sum().clamp_min(1)
        self.last_stats = (counts.detach().long(), entropy, aux_loss([route], self.n_experts))


def aux_loss(routes: list[Route], n_experts: int) -> torch.Tensor:
    """transformers' load_balancing_loss_func (models/mixtral, 5.24): the top-k assignment
    shares and the mean router probabilities, each pooled over the layers' tokens, then
    n_experts * sum(share * probability), over the tokens that are not padding (its
    attention_mask)."""
    rows = torch.stack([r.rows for r in routes]).sum().clamp_min(1)
    counts = torch.stack([r.counts for r in routes]).sum(0) / rows
    probs = torch.stack([r.probs for r in routes]).sum(0) / rows
    return (counts * probs).sum() * n_experts


def grouped_ok(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether F.grouped_mm runs here: torch >= 2.11 on the CPU (older ones lack a CPU kernel
    or need 16-byte aligned tensors), bf16 on CUDA from compute capability 8.0."""
    if not hasattr(F, "grouped_mm"):
        return False
    if device.type == "cpu":
        return torch_at_least(2, 11)
    if device.type == "cuda":
        return dtype == torch.bfloat16 and torch.cuda.get_device_capability(device) >= (8, 0)
    return False


def torch_at_least(major: int, minor: int) -> bool:
    version = torch.__version__.split("+")[0].split(".")
    return (int(version[0]), int(version[1])) >= (major, minor)


def aligned(w: torch.Tensor, dtype: torch.dtype) -> bool:
    """grouped_mm wants rows of 16 bytes: a LoRA rank of 2 in bf16 (4 bytes) takes the loop."""
    size = torch.empty(0, dtype=dtype).element_size()
    return all(n * size % 16 == 0 for n in w.shape[1:])


FORCE_LOOP = False  # tests compare the per-expert fallback with the grouped product


def expert_matmul(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """x [N, in] sorted by expert, counts[e] rows each; w [E, out, in] -> [N, out]."""
    device = x.device.type
    autocast = torch.is_autocast_enabled(device)
    dtype = torch.get_autocast_dtype(device) if autocast else w.dtype
    if not FORCE_LOOP and grouped_ok(x.device, dtype) and aligned(w, dtype):
        offs = counts.cumsum(0).to(torch.int32)
        return F.grouped_mm(x.to(dtype), w.to(dtype).transpose(-2, -1), offs=offs)
    outs = [
        F.linear(part, w[e]) for e, part in enumerate(x.split(counts.tolist())) if part.shape[0]
    ]
    return torch.cat(outs) if outs else x.new_zeros(0, w.shape[1])


class LoadMeter:
    """The routing statistics of the training forwards (a step's micro-batches), summed on
    the device; take() hands them over without a host sync, records() reads them."""

    def __init__(self):
        self.sums: tuple | None = None  # (assignments [layers, E], entropy, aux, forwards)

    def add(self, layers: list[MoE], aux: torch.Tensor):
        counts = torch.stack([m.last_stats[0] for m in layers])
        entropy = torch.stack([m.last_stats[1] for m in layers]).mean()
        new = (counts, entropy, aux.detach(), 1)
        old = self.sums
        self.sums = new if old is None else tuple(a + b for a, b in zip(old, new, strict=True))

    def take(self) -> tuple | None:
        """The sums since the last take (None: no training forward), on the device."""
        sums, self.sums = self.sums, None
        return sums


def _share(v: float) -> float:
    """Six decimals keep a 48 x 128 record near 40 KB instead of 120 KB; a share above zero
    stays above zero (0 means an expert got no token)."""
    return max(round(v, 6), 1e-6) if v else 0.0


def records(sums: tuple | None, layer_ids: list[int]) -> dict:
    """metrics.jsonl's MoE fields from LoadMeter.take()'s sums ({} for None): each layer's
    share of the assignments per expert, the mean router entropy and aux loss a forward."""
    if sums is None:
        return {}
    load, entropy, aux, forwards = sums
    load = load.double()
    share = load / load.sum(dim=1, keepdim=True).clamp_min(1)
    return {
        "moe/aux_loss": float(aux) / forwards,
        "moe/router_entropy": float(entropy) / forwards,
        "moe/expert_load": [[_share(v) for v in row] for row in share.tolist()],
        "moe/layers": list(layer_ids),
    }
