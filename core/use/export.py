"""Take a trained model to other tools (`python -m core.export`, in core.cli.export):

hf: a folder that transformers loads with no custom code (config.json, model.safetensors,
tokenizer files, a model card). gguf: a GGUF file with the tokenizer inside, for llama.cpp and
the apps built on it. Both are in the model's family: a fine-tune's base's, a new model's from
its shape (GPT-2, or Llama / Qwen3 for arch llama without / with q/k norms). safetensors: the
weights under TrainDeck's own names plus the config as JSON. The folder is written beside
--out and renamed into place when complete.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from core.config import recipe
from core.errors import DiskFullError
from core.models import lora
from core.platform.atomic import (
    as_disk_full,
    clean_stale_temps,
    free_bytes,
    is_disk_full,
    rename_into_place,
    temp_sibling,
    writable_problem,
)
from core.use import mmproj, towers
from core.use.common import ExportError, hf_state_dict, need, weights
from core.use.gguf_export import export_gguf, export_gguf_lora
from core.use.gguf_quality import quality_line
from core.use.gguf_quants import QUANTS
from core.use.ollama_export import export_ollama
from core.weights import families
from core.weights.loader import Loaded, load

FORMATS = ("hf", "gguf", "ollama", "safetensors", "peft", "gguf-lora")


def hf_config(loaded: Loaded) -> dict:
    """A fine-tune keeps its base model's config.json (a composite's whole, or what its family
    makes of it); a new model gets its family's."""
    if loaded.base is None:
        return families.new_model_hf_config(loaded.model.config)
    config = families.export_config(loaded.family, loaded.base["hf_config"])
    config.pop("dtype", None)
    config["torch_dtype"] = "float32"
    return config


def data_line(cfg) -> str:
    """The run's data for the model card: every source of a mix, and the weights."""
    sources = [cfg.data or "embedded corpus (Python standard library sources)", *cfg.extra_data]
    weights = f" (weights {cfg.data_weights})" if cfg.data_weights else ""
    return " + ".join(sources) + weights


def model_card(loaded: Loaded) -> str:
    cfg, c, tok = loaded.config, loaded.model.config, loaded.tokenizer
    val = f"{loaded.val_loss:.4f}" if loaded.val_loss is not None else "not measured"
    family = families.get(loaded.family)
    arch = f"{family.display} ({family.hf_arch})"
    origin = (
        f"fine-tuned from {loaded.base['init_from']}" if loaded.base else "trained from scratch"
    )
    if cfg is None:
        return f"# {arch} model\n\nWritten by TrainDeck from {loaded.checkpoint}.\n"
    return f"""# TrainDeck model

A {arch} language model {origin} with TrainDeck.

- Data: {data_line(cfg)}
- Tokenizer: {tok.kind} ({tok.vocab_size} tokens; model vocab {c.vocab_size})
- Size: {loaded.model.num_params():,} parameters; {c.n_layers} layers, {c.n_heads} heads
  ({c.n_kv_heads} key/value), width {c.hidden_dim}, context {c.seq_len}
- Trained: {loaded.step} optimizer steps, batch {cfg.batch_size} x {cfg.grad_accum} x
  {cfg.seq_len} tokens, {recipe.optimizer_line(cfg)}, precision {cfg.precision}
- Validation loss at export: {val} (nats per token)
- Checkpoint: {loaded.checkpoint.name}

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained("THIS_FOLDER")
model = AutoModelForCausalLM.from_pretrained("THIS_FOLDER")
print(tok.decode(model.generate(**tok("def ", return_tensors="pt"), max_new_tokens=50)[0]))
```
"""


def write_tokenizer_files(loaded: Loaded, folder: Path) -> None:
    tok = loaded.tokenizer
    (folder / "tokenizer.json").write_text(tok.hf_json(), encoding="utf-8")
    if loaded.base is not None:  # the base model's own tokenizer settings and chat template
        for name, text in loaded.base["files"].items():
            if name != "config.json":
                (folder / name).write_text(text, encoding="utf-8")
    else:
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": loaded.model.config.seq_len,
            "clean_up_tokenization_spaces": False,
        }
        path = folder / "tokenizer_config.json"
        path.write_text(json.dumps(config, indent=1), encoding="utf-8")
    if tok.chat_template:  # the template it was trained with (transformers reads this file)
        (folder / "chat_template.jinja").write_text(tok.chat_template, encoding="utf-8")


def export_hf(loaded: Loaded, folder: Path) -> None:
    from safetensors.torch import save_file

    state = hf_state_dict(loaded)
    if towers.is_composite(loaded):  # the whole checkpoint: its towers as they came
        state = towers.composite_state(loaded, state)
    save_file(state, str(folder / "model.safetensors"), {"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf_config(loaded), indent=1), encoding="utf-8")
    write_tokenizer_files(loaded, folder)
    (folder / "README.md").write_text(model_card(loaded), encoding="utf-8")


# -- safetensors -----------------------------------------------------------------------------


def export_safetensors(loaded: Loaded, folder: Path) -> None:
    from safetensors.torch import save_file

    tensors = weights(loaded.model)
    tensors.pop("head.weight")  # tied to tok_emb.weight
    save_file(tensors, str(folder / "model.safetensors"), {"format": "traindeck"})
    config = {
        "format": "traindeck",
        "note": "head.weight is tied to tok_emb.weight",
        "vocab_size": loaded.model.config.vocab_size,
        "tokenizer": loaded.tokenizer.kind,
        "step": loaded.step,
        "train_config": loaded.config.to_dict(),
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    (folder / "tokenizer.json").write_text(loaded.tokenizer.hf_json(), encoding="utf-8")


# -- PEFT ----------------------------------------------------------------------------------


def peft_weights(loaded: Loaded) -> tuple[dict[str, torch.Tensor], list[str]]:
    """LoRA A/B under PEFT's key names for the source family, and the adapted module names.
    A fused layer of ours (q/k/v, gate/up) is several Hugging Face modules: each gets the same
    A and its own rows of B, which gives each exactly its rows of B A."""
    c, family = loaded.model.config, loaded.family
    state = weights(loaded.model)
    out, modules = {}, []
    for ours, hf_names, _ in families.table(family, c):
        prefix = ours.removesuffix(".weight")
        if not ours.endswith(".weight") or f"{prefix}.lora_A" not in state:
            continue
        a, b = state[f"{prefix}.lora_A"], state[f"{prefix}.lora_B"]
        parts = families.split_rows(ours, c, b, len(hf_names))
        for hf_name, part in zip(hf_names, parts, strict=True):
            module = towers.module_name(loaded, hf_name.removesuffix(".weight"))
            out[f"base_model.model.{module}.lora_A.weight"] = a.clone().contiguous()
            out[f"base_model.model.{module}.lora_B.weight"] = part.clone().contiguous()
            modules.append(module)
    return out, modules


# PEFT (0.21) nests one ParamWrapper per targeted parameter of mlp.experts, in the module's
# own order: gate_up_proj's is the inner one (its keys under base_layer.), down_proj's outer.
EXPERT_KEYS = {"gate_up": ".base_layer", "down": ""}


def peft_expert_weights(loaded: Loaded) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The experts' adapters (--lora-experts) under PEFT's target_parameters layout, and the
    parameter names: A [E, r, in] -> lora_A [E r, in]; B [E, out, r] -> lora_B [out, r E]."""
    c, family = loaded.model.config, loaded.family
    state, out, targets = weights(loaded.model), {}, []
    for ours, hf_names, _ in in_memory_table(family, c):
        leaf = ours.rsplit(".", 1)[-1]
        if leaf not in EXPERT_KEYS or f"{ours}_lora.lora_A" not in state:
            continue
        a, b = state[f"{ours}_lora.lora_A"], hf_rows(family, ours, state[f"{ours}_lora.lora_B"])
        module = hf_names[0].rpartition(".")[0]  # model.layers.{i}.mlp.experts
        key = f"base_model.model.{module}{EXPERT_KEYS[leaf]}"
        out[f"{key}.lora_A.weight"] = a.reshape(-1, a.shape[-1]).contiguous()
        out[f"{key}.lora_B.weight"] = b.permute(1, 2, 0).reshape(b.shape[1], -1).contiguous()
        targets.append(hf_names[0])
    return out, targets


def in_memory_table(family: str, c) -> list:
    """The names of transformers' modules, which PEFT adapts (5.x fuses the experts)."""
    fused = families.get(family).fused_table
    return fused(c) if fused else families.table(family, c)


def hf_rows(family: str, ours: str, b: torch.Tensor) -> torch.Tensor:
    """An expert adapter's B with its rows in the Hugging Face tensor's order: gpt-oss
    interleaves gate and up, for the weight as for its bias (the family's convert)."""
    convert = families.get(family).convert
    if convert is None or not ours.endswith(".gate_up"):
        return b
    return convert(ours + "_bias", b, True)


def peft_router_weights(loaded: Loaded) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Routers trained with --train-router, as PEFT's modules_to_save (whole modules)."""
    if not loaded.config.train_router:
        return {}, []
    state, out, modules = weights(loaded.model), {}, []
    for ours, hf_names, _ in in_memory_table(loaded.family, loaded.model.config):
        if lora.is_router(ours) and ours in state:
            out[f"base_model.model.{hf_names[0]}"] = state[ours].clone().contiguous()
            module = hf_names[0].rpartition(".")[0]
            modules += [] if module in modules else [module]
    return out, modules


def export_peft(loaded: Loaded, folder: Path) -> None:
    from safetensors.torch import save_file

    cfg = loaded.config
    if cfg is None or not cfg.lora_rank:
        raise ExportError("format: peft needs a LoRA run (trained with --lora-rank R)")
    tensors, modules = peft_weights(loaded)
    experts, targets = peft_expert_weights(loaded)
    routers, saved = peft_router_weights(loaded)
    tower, tower_modules, tower_saved = towers.peft_tower(loaded)  # --train-vision's
    tensors.update(experts | routers | tower)
    modules, saved = modules + tower_modules, saved + tower_saved
    # GPT-2's Conv1D keeps weights transposed (its table's rows say so)
    fan_in_fan_out = any(t for _, _, t in families.table(loaded.family, loaded.model.config))
    save_file(tensors, str(folder / "adapter_model.safetensors"), {"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": loaded.base["init_from"] if loaded.base else None,
        "r": cfg.lora_rank,
        "lora_alpha": cfg.lora_scale_alpha,
        # PEFT's parameter adapters refuse dropout; it only ever acted in training
        "lora_dropout": 0.0 if targets else cfg.lora_dropout,
        "target_modules": modules,  # full names: exactly these modules, no others
        "target_parameters": targets or None,
        "bias": "none",
        "fan_in_fan_out": fan_in_fan_out,
        "inference_mode": True,
        "init_lora_weights": True,
        "use_rslora": False,
        "modules_to_save": saved or None,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    write_tokenizer_files(loaded, folder)


QUANTIZED = ("gguf", "ollama")  # the formats --quant applies to
NEEDS = {
    "hf": ["safetensors"],
    "gguf": ["gguf"],
    "ollama": ["gguf"],
    "gguf-lora": ["gguf"],
    "safetensors": ["safetensors"],
    "peft": [],
}
ADAPTERS = ("peft", "gguf-lora")  # the formats that write the adapters alone, unmerged


def _write(fmt: str, loaded: Loaded, folder: Path, quant: str, system, log, progress) -> dict:
    if fmt in QUANTIZED:
        projector = mmproj.NAME if mmproj.check(loaded) is not None else None
        if fmt == "gguf":
            report = export_gguf(loaded, folder, quant, log, progress)
        else:
            report = export_ollama(loaded, folder, quant, system, log, progress, projector)
        log(f"gguf {quality_line(loaded, report['path'], quant)}")
        if towers.is_composite(loaded):  # its towers beside it, where llama.cpp has them
            report["mmproj"] = mmproj.write_mmproj(loaded, folder, quant, log)
        return report
    if fmt == "gguf-lora":
        return export_gguf_lora(loaded, folder, log)
    {"hf": export_hf, "safetensors": export_safetensors, "peft": export_peft}[fmt](loaded, folder)
    return {}


def check_request(fmt: str, out: Path, quant: str | None) -> str | None:
    """Refuse, in one line, a request that cannot work, before anything is loaded; return
    the quant type to use (f16 when not given; None for formats without one)."""
    if fmt not in FORMATS:
        raise ExportError(f"format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    if quant is not None and fmt not in QUANTIZED:
        raise ExportError(f"quant: only {' and '.join(QUANTIZED)} exports are quantized, not {fmt}")
    if quant is not None and quant not in QUANTS:
        raise ExportError(f"quant: expected one of {', '.join(QUANTS)}, got {quant!r}")
    check_export_out(out)
    for module in NEEDS[fmt]:
        need(module)
    return (quant or "f16") if fmt in QUANTIZED else None


def export(
    target: str | Path,
    fmt: str,
    out: str | Path,
    which: str = "best",
    quant: str | None = None,
    system: str | None = None,
    log=print,
    progress=None,
) -> Path:
    """Write the export into out (a new or empty folder); nothing is left on failure.
    quant: the GGUF type mix for gguf and ollama (default f16); system: ollama's SYSTEM;
    log(line) hears what happens, progress(done, total) counts the tensors written."""
    out = Path(out)
    quant = check_request(fmt, out, quant)
    # GGUF is written a tensor at a time: the weights stay memory-mapped in their own dtype.
    loaded = load(target, which, mapped=fmt in QUANTIZED)
    if fmt not in ADAPTERS + QUANTIZED:  # one model: the adapters folded into the weights
        lora.merge(loaded.model)  # (GGUF merges each tensor as it writes it)
    check_export_out(out)  # again: another export may have started while this one loaded
    tmp = temp_sibling(out)
    try:
        _write(fmt, loaded, tmp, quant, system, log, progress)
        try:
            placed = rename_into_place(tmp, out)
        except PermissionError as e:  # Windows: another program holds it open (Ollama)
            raise ExportError(
                f"out: cannot move the export into {out} ({e.strerror or e}); another program "
                "may hold it open: close it, or choose another folder"
            ) from None
        if not placed:
            raise ExportError(f"out: another process wrote {out} meanwhile; this export is dropped")
    except BaseException as e:
        full = as_disk_full(e, tmp)  # asked before the half-written files give space back
        shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_full(full):
            free = (free_bytes(out.parent) or 0) / 1e6
            raise DiskFullError(
                f"disk full: no space left on the device holding {out.parent} while writing "
                f"the export; nothing was written ({free:,.1f} MB free now); free some space or "
                "give --out on another disk"
            ) from None
        raise
    return out


def check_export_out(out: Path) -> None:
    """out is new or an empty folder (not a link), writable, and no live process is writing
    it; temporaries left there by a killed export are deleted."""
    if out.is_symlink():
        raise ExportError(f"out: {out} is a symbolic link; give a new folder")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"out: {out} exists and is not an empty folder; choose a new one")
    live = clean_stale_temps(out)
    if live:
        raise ExportError(
            f"out: another export is writing {out} now ({live[0].name}); wait for it or "
            "choose another folder"
        )
    problem = writable_problem(out)
    if problem:
        raise ExportError(f"out: {problem}")
