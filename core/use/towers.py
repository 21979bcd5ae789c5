"""A composite's kept parts in its exports (core.weights.composite): the hf export writes the
whole `...ForConditionalGeneration` checkpoint, the trained language model under the
composite's own names and every other tensor (towers, projectors) copied bitwise from the
base's files; the peft export names the language model's modules as the composite class
has them."""

from __future__ import annotations

import torch

from core.use.common import ExportError
from core.weights import composite, vision
from core.weights.loader import Loaded, fingerprint, read_weights, resolve_folder


def is_composite(loaded: Loaded) -> bool:
    return loaded.base is not None and composite.is_composite(loaded.base["hf_config"])


def base_folder(loaded: Loaded):
    """The base model's folder, refused when it now holds other weights than those trained on
    (its towers would not be this model's)."""
    base = loaded.base
    folder = resolve_folder(base["init_from"])
    if base.get("fingerprint") and fingerprint(folder) != base["fingerprint"]:
        raise ExportError(
            f"export: {base['init_from']} now holds other weights than the model this run "
            "fine-tuned; its vision/audio towers would not be this model's: restore that model"
        )
    return folder


def kept_tensors(loaded: Loaded) -> tuple[dict[str, torch.Tensor], bool]:
    """The base's tensors that are not the language model's, bitwise (their own dtype), and
    whether its files name the language model in the released style."""
    files = read_weights(base_folder(loaded))  # memory-mapped: only the kept ones are read
    kept = {n: t.clone() for n, t in files.items() if composite.text_name(n) is None}
    return kept, composite.is_released(files)


def composite_state(loaded: Loaded, text: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The whole checkpoint: text (CausalLM names) renamed as the base's files name it,
    and the kept tensors."""
    kept, released = kept_tensors(loaded)
    kept.update(trained_tower(loaded, kept))
    return {**{composite.full_name(n, released): t for n, t in text.items()}, **kept}


def trained_tower(loaded: Loaded, kept: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A tower and projector trained with --train-vision, under the base file's names and in
    its dtypes (adapters merged in); nothing where the tower stayed frozen."""
    tower = getattr(loaded.model, "vision", None)
    if tower is None or loaded.config is None or not loaded.config.train_vision:
        return {}
    names = vision.file_names(kept)
    out = {}
    for mine, t in vision.trained_state(tower).items():
        if mine not in names:
            raise ExportError(f"export: the trained tower's {mine} is not in the base's files")
        out[names[mine]] = t.to(kept[names[mine]].dtype).contiguous()
    return out


def module_name(loaded: Loaded, name: str) -> str:
    """A language-model module as the model class names it (what a PEFT adapter targets)."""
    return composite.full_name(name) if is_composite(loaded) else name


def peft_tower(loaded: Loaded) -> tuple[dict[str, torch.Tensor], list[str], list[str]]:
    """A tower trained with --train-vision under LoRA, in PEFT's layout on transformers'
    composite: (tensors, adapted modules, modules saved whole: a projector without linear
    layers), each named as the composite's in-memory modules."""
    from core.models.lora import LoRALinear

    tower = getattr(loaded.model, "vision", None)
    if tower is None or loaded.config is None or not loaded.config.train_vision:
        return {}, [], []
    out, modules, saved = {}, [], []
    for mine, m in tower.named_modules():
        if isinstance(m, LoRALinear):
            module = vision.module_name(mine)
            out[f"base_model.model.{module}.lora_A.weight"] = m.lora_A.detach().clone()
            out[f"base_model.model.{module}.lora_B.weight"] = m.lora_B.detach().clone()
            modules.append(module)
    for mine, p in tower.named_parameters():
        if p.requires_grad and ".lora_" not in mine:  # trained whole (modules_to_save)
            out[f"base_model.model.{vision.module_name(mine)}"] = p.detach().clone()
            module = vision.module_name(mine.partition(".")[0])  # the projector (or tower)
            saved += [] if module in saved else [module]
    return out, modules, saved
