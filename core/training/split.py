"""A layer split in one process (`--devices cuda:0,cuda:1`): consecutive transformer blocks on
each card, in proportion to its free memory, the cards used in turn. No process group and no
NCCL, so it runs on any OS, Windows included (docs/multi-gpu.md).

The root (embeddings, final norm, head, the loss, a vision tower) stays on the first device,
where the batches are: a head tied to the embeddings is one tensor, and the targets and masks
need no move. The planner counts the root on the first card, so that card takes fewer blocks.

The model's forward has no device branch: each placed block's class becomes a subclass whose
forward (and generation's cached step) first moves what it is handed, the stream and its
extras (positions' cos and sin, masks, packed segments, per-layer inputs), to the block's
device, and the last block moves its output home, as FSDP2's fully_shard swaps a block's class.
The state dict's names do not change and its tensors are whole: a split run's checkpoint
resumes on one device, and one device's on a split.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, cast

import torch
import torch.nn as nn

from core.errors import ConfigError

MARGIN = 0.9  # of a card's free memory the plan fills (the estimate's 10% margin)


def names(cfg) -> list[str]:
    return [n for n in cfg.devices.split(",") if n] if cfg.devices else []


def check(cfg, world, cuda_count: int | None = None) -> None:
    """--devices' setup, in one line before any work: two or more devices that exist, one
    process (no --shard, no torchrun), and what the split does not carry yet."""
    if not cfg.devices:
        return
    if cfg.shard or world.launched:
        raise ConfigError(
            "devices: a layer split runs in one process; it does not combine with --shard or "
            "torchrun (shard over processes, or split in one: docs/multi-gpu.md)",
            field="devices",
        )
    if cfg.offload_checkpoints:
        raise ConfigError(
            "devices: --offload-checkpoints does not combine with a layer split yet; "
            "use --grad-checkpointing alone",
            field="devices",
        )
    from core.training.estimate import model_shape

    if model_shape(cfg).moe:
        raise ConfigError(
            "devices: a mixture of experts does not split across devices yet (its routing "
            "statistics are pooled over the layers); train it on one device or with --shard",
            field="devices",
        )
    if cuda_count is None:
        from core.platform.device import cuda_device_count

        cuda_count = cuda_device_count()
    for name in names(cfg):
        if name != "cpu" and int(name[5:]) >= cuda_count:
            found = f"cuda:0..cuda:{cuda_count - 1}" if cuda_count else "no CUDA GPU"
            raise ConfigError(
                f"devices: {name} does not exist; this machine has {found}", field="devices"
            )


def free_memory(devices: list[torch.device]) -> list[int]:
    """Each device's free bytes (a CUDA card's from the driver; the CPU's free RAM)."""
    import psutil

    out = []
    for d in devices:
        if d.type == "cuda":
            out.append(int(torch.cuda.mem_get_info(d)[0]))
        else:
            out.append(int(psutil.virtual_memory().available))
    return out


@dataclasses.dataclass
class Plan:
    """Which device each block goes on (indices into devices), and each device's estimated
    bytes at the step's peak."""

    devices: list[str]
    blocks: list[int]  # per block: its device's index
    loads: list[int]  # per device: bytes

    def counts(self) -> list[int]:
        return [self.blocks.count(i) for i in range(len(self.devices))]

    def describe(self) -> str:
        parts = []
        for i, (name, n) in enumerate(zip(self.devices, self.counts(), strict=True)):
            first = self.blocks.index(i) if n else 0
            layers = f"layers {first}-{first + n - 1}" if n else "no layers"
            root = " + embeddings, head and loss" if i == 0 else ""
            parts.append(f"{name}: {layers}{root} (~{self.loads[i] / 1024**3:.2f} GiB)")
        return "; ".join(parts)


def plan(devices: list[str], free: list[int], root: int, blocks: list[int]) -> Plan:
    """Consecutive blocks on each device so that each one's load (bytes; the root's counts
    on the first) is as near its share of the whole as whole blocks allow, the share in
    proportion to its free memory. Every device gets one block at least."""
    n = len(devices)
    if len(blocks) < n:
        raise ConfigError(
            f"devices: {n} devices but the model has {len(blocks)} layers; split over at "
            f"most {len(blocks)}",
            field="devices",
        )
    total = root + sum(blocks)
    weights = [max(1, f) for f in free]
    targets = [total * w / sum(weights) for w in weights]
    where, loads, d = [], [root] + [0] * (n - 1), 0
    for i, size in enumerate(blocks):
        left = len(blocks) - i  # blocks still to place, this one included
        must_move = left <= n - 1 - d  # each later device needs one
        full = d < n - 1 and loads[d] + size / 2 > targets[d] and where.count(d) > 0
        if d < n - 1 and (must_move or full):
            d += 1
        where.append(d)
        loads[d] += size
    return Plan(devices, where, loads)


@dataclasses.dataclass
class Units:
    """What one device's estimate is made of: each block's share and the root's of the
    parameters (weights, weight copies) and of what trains (gradients, optimizer state: a
    LoRA run's adapters live in the blocks, one set each)."""

    block_params: list[float]
    root_params: float
    block_trained: list[float]
    root_trained: float

    @classmethod
    def of(cls, cfg, est) -> Units:
        from core.models.params import meta_model
        from core.training.estimate import model_shape

        model = meta_model(model_shape(cfg))
        per_block = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
        total = max(1, model.num_params())
        params = [p / total for p in per_block]
        root = 1.0 - sum(params)
        if 0 < est.trained < est.n_params:  # LoRA: the adapters, in the blocks only
            return cls(params, root, [1 / len(per_block)] * len(per_block), 0.0)
        return cls(params, root, params, root)


def _card(est, u: Units, blocks: list[int], root: bool):
    """est (one device's) for the device holding these blocks (indices), and the root."""
    params = sum(u.block_params[i] for i in blocks) + (u.root_params if root else 0.0)
    trained = sum(u.block_trained[i] for i in blocks) + (u.root_trained if root else 0.0)
    return dataclasses.replace(
        est,
        weights=int(est.weights * params),
        gradients=int(est.gradients * trained),
        optimizer=int(est.optimizer * trained),
        weight_casts=int(est.weight_casts * params),
        activations=est.activations * len(blocks) // max(1, len(u.block_params)),
        logits=est.logits if root else 0,
        generation=est.generation * len(blocks) // max(1, len(u.block_params)),  # KV cache
        snapshot=int(est.snapshot * params),
        fragmentation=int(est.fragmentation * params),
        step_parts={},
    )


def card_estimates(est, cfg, free: list[int]) -> tuple[Plan, list]:
    """The plan for cfg's devices with these free bytes (the 10% margin kept), and est (one
    device's) for each device: its blocks' share of the weights, gradients, optimizer state,
    weight copies and activations; the root's share and the logits on the first; a CUDA
    context on each."""
    u = Units.of(cfg, est)
    n = len(u.block_params)
    root = _card(est, u, [], True).allocator_peak
    blocks = [_card(est, u, [i], False).allocator_peak for i in range(n)]
    p = plan(names(cfg), [int(f * MARGIN) for f in free], root, blocks)
    cards = []
    for d in range(len(p.devices)):
        mine = [i for i in range(n) if p.blocks[i] == d]
        cards.append(_card(est, u, mine, d == 0))
    return p, cards


@torch.compiler.disable  # eager at a compiled block's edge: the block's graph stays whole
def _moved(value, device: torch.device) -> Any:
    """value on device: tensors, tuples and lists of them, and the objects that carry per-row
    extras to the blocks (packed segments, image masks, per-layer inputs and shared keys and
    values), those moved in place: later blocks read what earlier ones add to them."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple | list):
        return type(value)(_moved(v, device) for v in value)
    if isinstance(value, dict):
        for k, v in value.items():
            value[k] = _moved(v, device)
        return value
    if isinstance(value, _carriers()):
        for k, v in vars(value).items():
            setattr(value, k, _moved(v, device))
    return value  # None, a Remake, numbers


@functools.cache
def _carriers() -> tuple[type, ...]:
    from core.models.per_layer import Side
    from core.models.tiling import Segments
    from core.models.vision import ImageBlocks

    return (Segments, Side, ImageBlocks)


class _Placed:
    """A block on its own device: it takes its inputs there and (the last) gives its output
    back to the first device. Mixed into the block's class by place()."""

    split_device: torch.device
    split_home: torch.device | None

    def forward(self, *args, **kwargs):
        args, kwargs = _moved(args, self.split_device), _moved(kwargs, self.split_device)
        with _current(self.split_device):
            out = cast(Any, super()).forward(*args, **kwargs)  # the block's own class
        return out if self.split_home is None else out.to(self.split_home)

    def cached(self, *args, **kwargs):
        args, kwargs = _moved(args, self.split_device), _moved(kwargs, self.split_device)
        with _current(self.split_device):
            out, kv = cast(Any, super()).cached(*args, **kwargs)
        return (out if self.split_home is None else out.to(self.split_home)), kv


def _current(device: torch.device):
    """The block's card as the current one: Triton kernels (Liger's) launch on the current
    device, not their tensors'."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


_CLASSES: dict[type, type] = {}


def _placed_class(cls: type) -> type:
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Placed{cls.__name__}", (_Placed, cls), {})
    return _CLASSES[cls]


def place(model: nn.Module, p: Plan) -> None:
    """model (a GPT) onto p's devices in place: the root on the first, block i on
    p.blocks[i]'s device, each block's class made its placed subclass (once)."""
    devices = [torch.device(n) for n in p.devices]
    home = devices[0]
    last = len(model.blocks) - 1
    for i, (block, d) in enumerate(zip(model.blocks, p.blocks, strict=True)):
        block.to(devices[d])
        if not isinstance(block, _Placed):
            block.__class__ = _placed_class(type(block))
        block.split_device = devices[d]
        block.split_home = home if i == last and d != 0 else None
    blocks = model.blocks
    model.blocks = nn.ModuleList()  # the root alone, then the blocks back as they are
    model.to(home)
    model.blocks = blocks


def placed_devices(model: nn.Module) -> list[torch.device]:
    """The devices a model's blocks are on, in order, each once (one: not split)."""
    out: list[torch.device] = []
    for b in model.blocks:
        d = getattr(b, "split_device", None)
        if d is not None and d not in out:
            out.append(d)
    return out


def free_of(cfg, found: list[dict], ram_free: int | None) -> list[int | None]:
    """Each of cfg's devices' free bytes from core.platform.hardware.gpus()'s list (a card
    missing or unread: None) and the CPU's free RAM, without touching the cards."""
    by_index = {g["index"]: g.get("free_bytes") for g in found}
    return [ram_free if n == "cpu" else by_index.get(int(n[5:])) for n in names(cfg)]


@dataclasses.dataclass
class CardRow:
    """One device's line of the split's estimate."""

    device: str
    layers: str
    total: int  # bytes at the peak, as NVML would show
    free: int | None  # None: unknown (the card not found here)
    fits: bool | None

    @classmethod
    def judged(cls, device: str, layers: str, total: int, free: int | None) -> CardRow:
        """The row with its verdict: total against free less the 10% margin."""
        from core.training.estimate import usable_bytes

        return cls(
            device, layers, total, free, None if free is None else total <= usable_bytes(free)
        )

    def line(self) -> str:
        mib = f"{self.device:<7} {self.layers:<34} {self.total / 1024**2:>10.1f} MiB"
        if self.free is None:
            return f"{mib} (free memory unknown)"
        verdict = "fits" if self.fits else "does NOT fit"
        return f"{mib} of {self.free / 1024**3:.1f} GiB free - {verdict}"


def card_rows(cfg, est, free: list[int]) -> list[CardRow]:
    """The split's estimate per device (est: one device's), each against its free memory
    with the 10% margin kept."""
    known = [f for f in free if f is not None]
    guess = [f if f is not None else min(known, default=1) for f in free]  # unknown: alike
    p, cards = card_estimates(est, cfg, guess)
    rows = []
    for i, (name, card) in enumerate(zip(p.devices, cards, strict=True)):
        n = p.blocks.count(i)
        first = p.blocks.index(i) if n else 0
        layers = f"layers {first}-{first + n - 1}" if n else "no layers"
        if i == 0:
            layers += " + embeddings, head, loss"
        rows.append(CardRow.judged(name, layers, card.device_total, free[i]))
    return rows
