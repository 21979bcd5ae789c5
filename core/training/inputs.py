"""What a run is built from: the prepared data (checked against a resumed checkpoint's), the
model (new, or pretrained with LoRA), and the process-wide switches set before the first step."""

from __future__ import annotations

import dataclasses
import os
import random
from types import SimpleNamespace

import numpy as np
import torch

from core.config import recipe
from core.config.spec import TrainConfig
from core.data import mix
from core.data.mix import MixedData
from core.data.prepare import examples_line, prepare
from core.data.prompts import PromptData
from core.data.sources import data_changes, sure_changes
from core.data.tokenizer import Tokenizer
from core.data.windows import TokenData
from core.errors import CheckpointError, DataError
from core.models import deltanet, lora, quant
from core.models import vision as vision_model
from core.models.model import GPT, GPTConfig
from core.models.vision import attach
from core.platform import heap
from core.weights import vision
from core.weights.loader import Pretrained, drop_pages


def prepare_data(
    cfg: TrainConfig,
    pretrained: Pretrained | None,
    saved: dict | None,
    *,
    cache,
    allow_change: bool,
    events,
    stop,
    log,
) -> TokenData | MixedData:
    """Prepare (or reuse) the cached token file of each data source (several: a MixedData);
    saved is a resumed checkpoint's data_info, whose data must be the same unless
    allow_change."""
    sources = mix.sources_of(cfg)
    specs = [mix.source_spec(cfg, src, events.on_prepare) for src in sources]
    if pretrained is not None:  # how the model sees images, where it does (else: text only)
        vision.tell_specs(specs, pretrained, cfg.image_max_pixels)
    mix.check_pairs_alone(specs, sources)  # before any source is prepared
    if saved:
        tokenizer = Tokenizer.from_json(saved["tokenizer_json"], saved.get("tokenizer_meta"))
    else:
        tokenizer = pretrained.tokenizer if pretrained else None
    listing = [f for spec in specs for f in spec.sources.listing()]
    changes = data_changes(saved["files"], listing) if saved else []
    uncapped = all(spec.sources.cap is None for spec in specs)  # a cap may hide a change
    if saved and not allow_change and uncapped and sure_changes(saved["files"], listing):
        raise data_changed(changes)  # before anything is tokenized
    parts = []
    for spec in specs:
        folder, manifest = prepare(spec, cache, tokenizer, events.on_prepare, stop, log)
        parts.append(TokenData(folder, manifest, cfg.seq_len, cfg.seed))
        tokenizer = tokenizer or parts[0].tokenizer  # one tokenizer for every source
    data = parts[0]
    if len(parts) > 1 and any(p.images is not None for p in parts):
        raise DataError(
            "data: chat data with images trains from one data source for now; join the "
            "sources into one file (images and text examples may mix in it)"
        )
    if len(parts) > 1:
        data = MixedData(parts, mix.source_names(sources), mix.weights_of(cfg, parts), cfg.seed)
    if saved and data_info(data)["fingerprint"] != saved["fingerprint"]:
        if not allow_change:
            raise data_changed(changes)
        log(f"resume: data changed ({changes_text(changes)}); going on as allowed")
    for part in parts:
        log_data_notes(part, log)
    log_thinking(parts[0].tokenizer, log)
    if len(parts) > 1:
        log(data.shares_line())
    return data


def prepare_prompts(
    cfg: TrainConfig, pretrained: Pretrained | None, saved: dict | None, allow_change: bool, log
) -> PromptData:
    """GRPO's prompt file, read and tokenized (it is small: no cache), checked against a
    resumed checkpoint's."""
    if saved:
        tokenizer = Tokenizer.from_json(saved["tokenizer_json"], saved.get("tokenizer_meta"))
    else:
        tokenizer = pretrained.tokenizer
    room = cfg.seq_len - cfg.max_completion_tokens
    seen = SimpleNamespace(images=None, images_problem="")
    if pretrained is not None:  # how the model sees images, where it does (else: text only)
        vision.tell_specs([seen], pretrained, cfg.image_max_pixels)
    data = PromptData(
        cfg.data,
        tokenizer,
        room,
        cfg.seed,
        cfg.val_fraction,
        cfg.num_generations,
        cfg.seq_len,
        seen.images,
        seen.images_problem,
    )
    if saved and data.manifest["fingerprint"] != saved["fingerprint"]:
        if not allow_change:
            raise CheckpointError(
                f"resume: the prompts changed since the checkpoint ({data.source}); restore "
                "them, or pass --allow-data-change to go on with the new prompts"
            )
        log(f"resume: prompts changed ({data.source}); going on as allowed")
    log_thinking(tokenizer, log)
    columns = f"; columns for the rewards: {', '.join(data.columns)}" if data.columns else ""
    kind = "conversational" if data.conversational else "text"
    log(
        f"prompts: {data.n_train:,} to train on, {len(data.val_index):,} held out ({kind})"
        + columns
    )
    return data


def changes_text(changes: list[str]) -> str:
    what = "; ".join(changes[:5]) or "the content"
    if len(changes) > 5:
        what += f"; and {len(changes) - 5} more"
    return what


def data_changed(changes: list[str]) -> CheckpointError:
    return CheckpointError(
        f"resume: the data changed since the checkpoint ({changes_text(changes)}); restore it, "
        "or pass --allow-data-change to go on with the new data"
    )


def log_thinking(tokenizer: Tokenizer, log) -> None:
    """The run's thinking setting (core.data.chat.set_thinking), where it set one."""
    if "enable_thinking" in tokenizer.meta:
        on = tokenizer.meta["enable_thinking"]
        log(
            f"chat: thinking {'on' if on else 'off'}: the template renders with "
            f"enable_thinking={on} (data, prompts, generation, evaluation)"
        )


def log_data_notes(data: TokenData, log) -> None:
    manifest = data.manifest
    used, total = manifest["source_bytes"], manifest["total_bytes"]
    if used < total:
        log(f"data: using {used:,} of {total:,} bytes")
    if manifest["empty_files"]:
        log(f"data: skipped {manifest['empty_files']} empty file(s)")
    if data.is_chat:
        log(f"{'preference' if data.is_pairs else 'chat'} data: {examples_line(manifest)}")


def data_info(data: TokenData) -> dict:
    """What a checkpoint keeps of its data: enough to check it on resume and to decode."""
    m = data.manifest
    info = {
        "fingerprint": m["fingerprint"],
        "files": m["files"],
        "source": m["source"],
        "tokenizer": m["tokenizer"],
        "tokenizer_json": data.tokenizer.hf_json(),
        "tokenizer_meta": data.tokenizer.meta or None,
    }
    if isinstance(data, MixedData):  # every source's files and content are checked on resume
        files = [f for part in data.parts for f in part.manifest["files"]]
        info.update(fingerprint=data.fingerprint, files=files, source=data.source)
    return info


def build_model(
    cfg: TrainConfig, pretrained: Pretrained | None, device, precision, log, fused: bool = True
) -> GPT:
    """fused=False: a fine-tune with the plain operations, as one saved before the fused ones
    existed resumes bit for bit."""
    if pretrained is None:
        model = GPT(GPTConfig.from_train(cfg))
        lora.apply_config(model, cfg)
        return model
    sixteen = precision in ("bf16", "fp16") and device.type == "cuda"
    bits = recipe.base_bits(cfg, sixteen) if cfg.lora_rank else 32
    shape = dataclasses.replace(GPTConfig.from_train(cfg, base=pretrained.config), fused=fused)
    # A quantized base is made layer by layer from the memory-mapped files: the
    # full-precision model never exists at once.
    model = pretrained.load_model(shape, mapped=bits in (4, 8))
    log(f"starting from {pretrained.name} ({pretrained.family})")
    if (line := deltanet.kernel_line(shape, device)) is not None:
        log(line)  # CUDA without flash-linear-attention: the torch path, slower
    lora.apply_config(model, cfg)
    if bits in (4, 8):
        compute = torch.float32 if precision == "fp32" else torch.bfloat16
        if precision == "fp16":
            compute = torch.float16
        held = quant.quantize_base(model, bits, compute, device)
        _materialize(model, torch.float32 if device.type == "cpu" else compute)
        log(f"base in {bits} bits: its adapted layers hold {held / 1024:,.0f} KiB")
    elif bits == 16:  # the frozen base in 16 bits: half its memory
        lora.freeze_to(model, torch.bfloat16 if precision == "bf16" else torch.float16)
    return model


def attach_vision(model: GPT, pretrained: Pretrained, cfg: TrainConfig, log) -> None:
    """The base's vision tower and projector in the model's forward pass (chat data with
    images): frozen, or with cfg.train_vision trained too (LoRA on their linear layers under
    LoRA, every weight under full fine-tuning). It stays unquantized under QLoRA."""
    tower = vision.load_vision(pretrained.folder, pretrained.hf_config)
    train_tower(tower, cfg)
    attach(model, tower, trains=None)
    n = sum(p.numel() for p in tower.parameters())
    how = "frozen"
    if cfg.train_vision:
        how = "LoRA on its linear layers" if cfg.lora_rank else "trained in full"
    log(
        f"vision: {tower.options.kind} tower and projector ({n:,} parameters) in the forward "
        f"pass, {how}; the loss is on the answers' text only"
    )


def train_tower(tower, cfg: TrainConfig) -> None:
    """A loaded (frozen) tower made trainable as cfg.train_vision says."""
    if cfg.train_vision:
        vision_model.train(tower, cfg.lora_rank, cfg.lora_scale_alpha, cfg.lora_dropout)


def _materialize(model: GPT, dtype: torch.dtype) -> None:
    """After the quantized layers are made: the other weights of a memory-mapped model (the
    embeddings, norms, head, and fused layers without adapters) in dtype, in memory."""
    import torch.nn as nn

    sources = getattr(model, "weight_sources", {})
    for name, param in list(model.named_parameters()):
        if ".base_quantized." in name:
            continue  # bitsandbytes' own packed weights
        owner, _, leaf = name.rpartition(".")
        module = model.get_submodule(owner)
        if name in sources:
            value = sources[name]()
        elif param.is_meta:
            continue
        else:
            value = param.detach()
        wanted = dtype if value.is_floating_point() else value.dtype
        # A file tensor already in dtype stays a view of its file (pages read as used).
        tensor = value.to(wanted)
        setattr(module, leaf, nn.Parameter(tensor, requires_grad=param.requires_grad))
    if hasattr(model, "weight_sources"):
        del model.weight_sources
    drop_pages(getattr(model, "weight_maps", []))  # what quantizing and joining read
    if model.config.tie_embeddings:
        model.head.weight = model.tok_emb.weight


def set_switches(cfg: TrainConfig, device: torch.device, lean_heap: bool = True) -> None:
    """Determinism, TF32, the C heap and the seeds, before the model is made. lean_heap: keep
    glibc's heap lean on the CPU (core.training.planner.heap_choice decides)."""
    if device.type == "cpu" and lean_heap:
        heap.return_large_frees()  # freed activations go back to the system (core.platform.heap)
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.cuda.reset_peak_memory_stats(device)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    torch.manual_seed(cfg.seed)
