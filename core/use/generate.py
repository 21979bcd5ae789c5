"""Generate text with a model: sampling, the KV cache, chat prompts and streaming detokenized
text (`python -m core.generate`, in core.cli.generate, is its command line).

Deterministic for a given seed.
Generation keeps a key/value cache, so n new tokens cost O(n) forward work; past the
context length the window slides forward by half a context and the cache is rebuilt.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from core.data.chat import chat_ids
from core.data.tokenizer import Tokenizer
from core.errors import DataError
from core.models.model import GPT
from core.weights.loader import Loaded, checkpoint_path, load  # noqa: F401 (the loader's API, here too)


def pick(logits: torch.Tensor, temperature: float, top_k, top_p, gen: torch.Generator) -> int:
    """The next token from one row of logits: greedy at temperature 0, else sampled after
    top-k and nucleus (top-p) filtering."""
    logits = logits.float().cpu()
    if temperature <= 0:
        return int(torch.argmax(logits))
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        order = torch.argsort(logits, descending=True)
        probs = torch.softmax(logits[order], dim=-1)
        drop = torch.cumsum(probs, dim=-1) - probs >= top_p  # keep the first token always
        logits[order[drop]] = float("-inf")
    return int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen))


def generate_ids(
    model: GPT,
    prompt: list[int],
    n_new: int,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    use_cache: bool = True,
    should_stop: Callable[[], bool] | None = None,
    stop_ids: list[int] | tuple = (),
    images=None,
) -> Iterator[int]:
    """Yield n_new token ids after prompt. The window over which the model looks is the same
    with and without the cache: once it is full it moves forward by half a context. images
    (N, 3, H, W): the pixel values of the prompt's images (a model with a vision tower),
    seen while the window holds the whole prompt."""
    context = model.config.seq_len
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    tokens = list(prompt)
    start = max(0, len(tokens) - context)
    cache, cache_start = None, None
    for _ in range(n_new):
        if should_stop is not None and should_stop():
            return
        if len(tokens) - start > context:
            start = len(tokens) - context // 2
        window = tokens[start:]
        seen = {"images": images.to(device)} if images is not None and start == 0 else {}
        with torch.no_grad():
            if not use_cache:
                logits = model.logits(torch.tensor([window], device=device), **seen)
                logits = logits[:, -1]
            elif cache is None or cache_start != start:
                ids = torch.tensor([window], device=device)
                logits, cache = model.forward_cached(ids, last=True, **seen)
                cache_start = start
            else:
                last = torch.tensor([[window[-1]]], device=device)
                logits, cache = model.forward_cached(last, cache, last=True)
        nxt = pick(logits[0], temperature, top_k, top_p, gen)
        tokens.append(nxt)
        yield nxt
        if nxt in stop_ids:  # the end of an answer: yielded, so callers see why it stopped
            return


def stream_text(tokenizer: Tokenizer, ids: Iterator[int], hide=(), until=()) -> Iterator[str]:
    """Decoded text as it is produced; a character split across tokens waits for its end.
    Ids in hide (an end-of-turn token) are not shown. At a string of until (an end-of-turn
    mark spelled in text) the text ends, the mark not shown; text that may be the start
    of one waits until it is known not to be."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    held = ""
    for i in ids:
        if i in hide:
            continue
        held += decoder.decode(tokenizer.token_bytes(i))
        ends = [held.find(s) for s in until if s in held]
        if ends:
            if held[: min(ends)]:
                yield held[: min(ends)]
            return
        keep = max((k for s in until for k in range(1, len(s)) if held.endswith(s[:k])), default=0)
        if len(held) > keep:
            yield held[: len(held) - keep]
            held = held[len(held) - keep :]
    held += decoder.decode(b"", final=True)
    if held:
        yield held


def prompt_ids(tok: Tokenizer, prompt: str) -> list[int]:
    """A plain prompt's ids, with BOS first where the model's tokenizer adds one."""
    ids = tok.encode(prompt) or tok.encode("\n")
    if tok.add_bos:
        ids = [tok.bos_id, *ids]
    return ids


def start_ids(
    tok: Tokenizer,
    prompt: str,
    chat: bool,
    system: str | None = None,
    history=(),
    seeing: Seeing | None = None,
) -> tuple[list[int], list[int], list[str]]:
    """(prompt ids, stop ids, stop strings): a plain prompt runs to the length asked; a chat
    prompt is a user message (after history, the conversation so far) in the model's
    template and ends at the model's end of turn. seeing: images the prompt shows (a chat
    prompt: in the user's message, before its text; a plain one: before the prompt); its
    pixels are those of the history's image parts, then of its paths."""
    shown = seeing.paths if seeing is not None else []
    if not chat:
        marks = "".join(seeing.spec.text(n) for n in seeing.counts) if shown else ""
        return prompt_ids(tok, marks + prompt), [], []
    messages = [{"role": "system", "content": system}] if system else []
    content = prompt
    if shown:
        content = [{"type": "image", "image": str(p)} for p in shown]
        content.append({"type": "text", "text": prompt})
    messages += [*history, {"role": "user", "content": content}]
    spec = seeing.spec if seeing is not None else None  # history's images count too
    counts = seeing.counts if seeing is not None else None
    return chat_ids(tok, messages, images=spec, counts=counts), tok.stop_ids, tok.stop_strings


NEEDS_VISION = "images need a vision model (Gemma 3 4B and up, Gemma 4, Qwen3-VL, Qwen3.5)"
TEXT_ONLY = f"this model reads text only here (no vision tower TrainDeck runs); {NEEDS_VISION}"


def image_refusal(target: str | Path) -> str:
    """Why the model at target cannot take images ("" when it can, or when its files do not
    say yet), from its config files alone: a model folder's config.json, a run's or a
    checkpoint's base (config.yaml's init_from). Nothing is downloaded or loaded."""
    import yaml

    from core.weights import vision
    from core.weights.loader import is_hub_id, is_model_folder

    if not str(target).strip():
        return ""
    path = Path(str(target)).expanduser()
    source: str | Path = path
    if path.exists() and not is_model_folder(path):
        folder = path if path.is_dir() else path.parent
        configs = [folder / "config.yaml", folder.parent / "config.yaml"]
        found = next((c for c in configs if c.is_file()), None)
        if found is None:
            return ""
        try:
            source = (yaml.safe_load(found.read_text(encoding="utf-8")) or {}).get("init_from")
        except (OSError, yaml.YAMLError):
            return ""
        if not source:
            return f"a model trained from scratch reads text only; {NEEDS_VISION}"
    config = _cached_config(source) if is_hub_id(source) else Path(source) / "config.json"
    try:
        hf = json.loads(config.read_text(encoding="utf-8")) if config else None
    except (OSError, ValueError):
        return ""
    return "" if hf is None or vision.kind_of(hf) else TEXT_ONLY


def _cached_config(repo_id) -> Path | None:
    """A hub model's config.json where the cache has it (None: not downloaded yet)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(str(repo_id), "config.json")
    except Exception:
        return None
    return Path(found) if isinstance(found, str) else None


@dataclass
class Seeing:
    """The images a prompt shows, as the model sees them: its ImageSpec, the files, their
    pixel values (N, 3, H, W), or a dynamic-resolution tower's Patches (Qwen), and the
    tokens each image gives."""

    spec: object
    paths: list
    pixels: object
    counts: list


def check_images(paths, flag: str = "--image") -> list:
    """Each image file decoded and checked before any model is loaded (RGB PIL images);
    one line naming the flag and the file for a bad one."""
    from core.data import images

    out = []
    for p in paths:
        try:
            out.append(images.open_rgb(Path(p)))
        except images.ImageProblem as e:
            raise DataError(f"{flag}: {p} {e}") from None
    return out


def seeing(loaded, paths, pictures, flag: str = "--image") -> Seeing:
    """The model's view of checked pictures (check_images), and its vision tower attached to
    loaded.model; one line where the model has none TrainDeck runs."""
    from core.data import images
    from core.models.vision import attach
    from core.weights import vision
    from core.weights.loader import resolve_folder

    if loaded.base is not None:
        folder, hf = resolve_folder(loaded.base["init_from"]), loaded.base["hf_config"]
    else:
        folder = Path(loaded.checkpoint)
        hf = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if vision.kind_of(hf) is None:
        raise DataError(f"{flag}: {TEXT_ONLY}")
    try:
        spec = vision.image_spec(folder, hf, loaded.tokenizer)
        pixels = [images.resized(p, spec) for p in pictures]
    except (images.ImageProblem, DataError) as e:
        raise DataError(f"{flag}: {e}") from None
    device = next(loaded.model.parameters()).device
    if not hasattr(loaded.model, "vision"):
        attach(loaded.model, vision.load_vision(folder, hf).to(device))
    counts = [images.image_tokens(spec, p) for p in pixels]
    return Seeing(spec, list(paths), images.pixel_batch(pixels, spec), counts)
