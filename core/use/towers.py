"""A composite's kept parts in its exports (core.weights.composite): the hf export writes the
whole `...ForConditionalGeneration` checkpoint, the trained language model under the
composite's own names and every other tensor (towers, projectors) copied bitwise from the
base's files; the peft export names the language model's modules as the composite class
has them."""

from __future__ import annotations

import torch

from core.use.common import ExportError
from core.weights import composite
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
    return {**{composite.full_name(n, released): t for n, t in text.items()}, **kept}


def module_name(loaded: Loaded, name: str) -> str:
    """A language-model module as the model class names it (what a PEFT adapter targets)."""
    return composite.full_name(name) if is_composite(loaded) else name
