"""Composite checkpoints: a `...ForConditionalGeneration` whose config.json has a text_config
beside a vision_config and/or an audio_config (Gemma 3 4B and up, Qwen3.5, Gemma 4).

TrainDeck trains the language model alone, on text. Its family is found from text_config's
model_type and reads text_config; its tensors are mapped to the CausalLM names every family
table uses, for every family alike. Everything else (the towers, their projectors or
embedders, anything else the file holds) is kept: exports write it back as it came.
Plain dicts and names only: the registry (core.weights.families) and the exports use this.
"""

from __future__ import annotations

TOWERS = (("vision_config", "vision"), ("audio_config", "audio"))
# The language model's tensors in a composite -> a CausalLM's: transformers 4.52 and later
# save "model.language_model.*" (the in-memory module names too), earlier releases
# "language_model.model.*" and "language_model.lm_head.*".
CURRENT = (("model.language_model.", "model."), ("lm_head.", "lm_head."))
RELEASED = (("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."))


def towers(hf: dict) -> list[str]:
    """The towers a composite config.json names ("vision", "audio"); none for a plain one."""
    if not isinstance(hf.get("text_config"), dict):
        return []
    return [kind for key, kind in TOWERS if isinstance(hf.get(key), dict)]


def is_composite(hf: dict) -> bool:
    return bool(towers(hf))


def class_name(hf: dict) -> str:
    return (hf.get("architectures") or [f"model_type {hf.get('model_type')!r}"])[0]


def text_config(hf: dict) -> dict:
    """The language model's config.json: text_config (its model_type, else the composite's);
    a head tie the composite states at its top level applies to it."""
    if not is_composite(hf):
        return hf
    text = {"model_type": hf.get("model_type"), **hf["text_config"]}
    if "tie_word_embeddings" in hf and "tie_word_embeddings" not in hf["text_config"]:
        text["tie_word_embeddings"] = hf["tie_word_embeddings"]
    return text


def kept_line(hf: dict) -> str:
    """ "vision kept" / "vision and audio kept" for the info line; "" for a plain model."""
    kinds = towers(hf)
    return f"{' and '.join(kinds)} kept" if kinds else ""


def note(hf: dict) -> str:
    kinds = " and ".join(towers(hf))
    return (
        f"{class_name(hf)}: training its language model on text; the {kinds} part (towers and "
        "projectors) is kept unchanged: the hf export writes it back bitwise, the gguf export "
        "as a projector file (mmproj) beside the text model where llama.cpp has one for it"
    )


def text_name(name: str) -> str | None:
    """A composite tensor's CausalLM name, or None for a tensor that is kept (a tower's)."""
    for prefixes in (CURRENT, RELEASED):
        for old, new in prefixes:
            if name.startswith(old):
                return new + name[len(old) :]
    return None


def is_released(names) -> bool:
    """Whether a composite's files name the language model as released (language_model.*)."""
    return any(n.startswith(RELEASED[0][0]) for n in names)


def full_name(name: str, released: bool = False) -> str:
    """A CausalLM tensor or module name as the composite names it (released: in the older
    files' style; else as transformers 5 names its modules, which PEFT adapters target)."""
    for old, new in RELEASED if released else CURRENT:
        if name.startswith(new):
            return old + name[len(new) :]
    return name
