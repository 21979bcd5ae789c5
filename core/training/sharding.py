"""FSDP2 under torchrun (`--shard`): each block's weights, gradients and optimizer state are
split across the processes, gathered for a block's forward and backward only, so a model that
does not fit one card trains on several.

Each transformer block is one FSDP unit; the root (embeddings, final norm, head, tied to the
embeddings where the model ties them) is the last. A LoRA run's frozen base is sharded with
its adapters; gradients exist only for what trains. A 4-bit base (QLoRA) is sharded too:
bitsandbytes' packed NF4 bytes are a plain tensor FSDP2 splits by rows like any weight (it
gathers, never casts, a non-float one), and each layer keeps its quantization state, which
bitsandbytes gives back to the gathered weight (core.models.quant).
On CUDA in bf16 the blocks compute in
bf16 from fp32 master weights (MixedPrecisionPolicy), gradients reduced in fp32, as one card's
autocast does. Gradients are reduce-scattered after every micro-batch: a step's mean equals
DDP's and one process's at the same global batch.
"""

from __future__ import annotations

import dataclasses
import os
import warnings

import torch
import torch.nn as nn

from core.errors import ConfigError


def check(cfg, world, environ=os.environ) -> None:
    """--shard's setup, in one line before any work: under torchrun, a batch the processes
    can share."""
    if not cfg.shard:
        return
    if "WORLD_SIZE" not in environ:
        raise ConfigError(
            "shard: shards a model across the processes torchrun starts; run "
            "torchrun --standalone --nproc_per_node N -m core.train ... --shard "
            "(docs/multi-gpu.md)",
            field="shard",
        )
    if cfg.lora_rank and cfg.base_bits == "8":
        raise ConfigError(
            "base_bits: an 8-bit base cannot be sharded (bitsandbytes keeps its scales on the "
            "weight, which FSDP2 replaces); use --base-bits 4 with --shard",
            field="base_bits",
        )


def shard(model: nn.Module, device: torch.device, precision: str) -> None:
    """Turn model (a GPT) into FSDP2 units in place: one a block, then the root."""
    from torch.distributed.fsdp import (
        MixedPrecisionPolicy,
        fully_shard,
        register_fsdp_forward_method,
    )

    policy = MixedPrecisionPolicy()
    if device.type == "cuda" and precision in ("bf16", "fp16"):
        half = torch.bfloat16 if precision == "bf16" else torch.float16
        policy = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
        register_fsdp_forward_method(block, "cached")  # generation's per-block step
    fully_shard(model, mp_policy=policy)
    register_fsdp_forward_method(model, "forward_cached")


def held_line(model: nn.Module, processes: int) -> str:
    """What this process holds of the model's parameters after sharding, in words for the
    log: about 1/processes of each sharded tensor (the 4-bit base's packed bytes included)."""
    from torch.distributed.tensor import DTensor

    held = whole = 0
    for p in model.parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        held += local.numel() * local.element_size()
        whole += p.numel() * p.element_size()
    return (
        f"sharded over {processes} processes: this one holds {held / 1024:,.0f} KiB of the "
        f"model's {whole / 1024:,.0f} KiB of parameters"
    )


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """torch's clip over sharded gradients too: their norm is the whole model's."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return norm


def _state_dicts(model: nn.Module, optimizers, adapters_only: bool) -> tuple[dict, dict]:
    """The model's and optimizer's state keyed by parameter name (each rank's shards under
    FSDP2, whole tensors otherwise): the form Distributed Checkpoint writes and reshards."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from core.models import lora

    model_sd, optim_sd = get_state_dict(model, optimizers.all)
    if adapters_only:  # a LoRA checkpoint holds what trains; the base is on disk already
        kept = lora.adapter_state(model).keys()
        model_sd = {k: v for k, v in model_sd.items() if k in kept}
    return model_sd, optim_sd


def save_shards(model: nn.Module, optimizers, folder, adapters_only: bool) -> None:
    """Every rank writes its shards of the model and optimizer into folder (fsynced)."""
    import torch.distributed.checkpoint as dcp

    model_sd, optim_sd = _state_dicts(model, optimizers, adapters_only)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=folder)


def load_shards(model: nn.Module, optimizers, folder, adapters_only: bool) -> None:
    """A sharded checkpoint's model and optimizer into this run's, on any number of
    processes, sharded or not: Distributed Checkpoint reads each rank's part of every
    tensor, whatever the split it was written with."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    model_sd, optim_sd = _state_dicts(model, optimizers, adapters_only)
    state = {"model": model_sd, "optimizer": optim_sd}
    with warnings.catch_warnings():  # one process: "assuming ... a single process", as meant
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=folder, no_dist=not dist.is_initialized())
    set_state_dict(
        model,
        optimizers.all,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=StateDictOptions(strict=not adapters_only),
    )


def load_whole(model: nn.Module, optimizers, state: dict) -> None:
    """A checkpoint written by one process (whole tensors) into a sharded run: each rank
    keeps its rows of every weight and of its optimizer state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    saved = optimizers.each_state(state["optimizer"])
    names = {id(p): name.replace("_orig_mod.", "") for name, p in model.named_parameters()}
    merged: dict = {"state": {}, "param_groups": []}
    for opt, plain in zip(optimizers.all, saved, strict=True):
        _by_name(opt, plain, names, merged)
    set_state_dict(
        model,
        optimizers.all,
        model_state_dict=state["model"],
        optim_state_dict=merged,
        options=StateDictOptions(full_state_dict=True, strict=not state.get("adapters_only")),
    )


def _by_name(opt, plain: dict, names: dict, into: dict) -> None:
    """An optimizer's own state_dict (parameters by index) keyed by parameter name, the
    form Distributed Checkpoint's set_state_dict takes."""
    ours = [g["params"] for g in opt.param_groups]
    if [len(g["params"]) for g in plain["param_groups"]] != [len(g) for g in ours]:
        raise ValueError("the optimizer's parameter groups differ from the checkpoint's")
    for group, params in zip(plain["param_groups"], ours, strict=True):
        fqns = [names[id(p)] for p in params]
        for index, fqn in zip(group["params"], fqns, strict=True):
            if index in plain["state"]:
                into["state"][fqn] = plain["state"][index]
        into["param_groups"].append({**group, "params": fqns})


def card_rows(cfg, est, free: list[int | None]) -> list:
    """The sharded estimate per card (est: one process's whole), each against its free
    memory: every process holds the same share."""
    from core.training.split import CardRow

    n = len(free)
    each = rank_estimate(est, cfg, n).device_total
    return [
        CardRow.judged(f"cuda:{i}", f"1/{n} of every layer", each, f) for i, f in enumerate(free)
    ]


def card_memory(world, device: torch.device, memory: dict) -> dict:
    """Every process's card memory, for rank 0's records, in a layer split's fields
    (core.platform.hardware.CARD_FIELDS), so the window draws a line per card. A
    collective: every rank calls it at the same metrics read."""
    used = memory.get("nvml_used_mb")
    mine = [
        float(device.index or 0),
        memory.get("mem_reserved_mb", 0.0),
        -1.0 if used is None else used,
    ]
    return card_fields(world.gather(torch.tensor([mine], dtype=torch.float64)).tolist())


def card_fields(rows: list[list[float]]) -> dict:
    """[card index, reserved MiB, NVML used MiB or -1] a process -> {field: {cuda:N: MiB}}."""
    out = {"card_reserved_mb": {f"cuda:{int(i)}": r for i, r, _ in rows}}
    if all(u >= 0 for _, _, u in rows):
        out["card_used_mb"] = {f"cuda:{int(i)}": u for i, _, u in rows}
    return out


def unit_params(c) -> tuple[int, int]:
    """(the root's parameters: embeddings, final norm, untied head; the largest block's)."""
    from core.models.params import COUNTS, meta_model, shape_key

    key = shape_key(c, "units")
    if key not in COUNTS:
        model = meta_model(c)
        blocks = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
        COUNTS[key] = (model.num_params() - sum(blocks), max(blocks))
    return COUNTS[key]


def rank_estimate(est, cfg, processes: int):
    """est (core.training.estimate.Estimate, one process) for one of `processes` sharded
    ones: weights, gradients, optimizer state and the checkpoint copy divided among them,
    plus what is gathered whole at once: the root (its embeddings and head stay gathered
    from forward to backward), the block that computes and the next one being fetched,
    each in the compute dtype, and the computing block's gradients before they are
    reduce-scattered."""
    from core.training.estimate import model_shape

    root, block = unit_params(model_shape(cfg))
    n = max(1, processes)
    compute = 2 if est.weight_casts else 4  # bf16/fp16 copies under mixed precision
    trained = est.trained or est.n_params
    block_grads = 4 * block * trained // max(1, est.n_params)  # LoRA: its adapters' share
    return dataclasses.replace(
        est,
        weights=est.weights // n,
        gradients=est.gradients // n + block_grads,
        optimizer=est.optimizer // n,
        weight_casts=compute * (root + 2 * block),
        snapshot=est.snapshot // n,
    )
