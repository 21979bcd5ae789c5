"""One loader for every model source: a run folder, a checkpoint file, a Hugging Face model
folder or a hub id becomes (model, tokenizer, info). The trainer, generate, export and the
Playground all go through here.

No code from a model folder is ever run: weights are read from safetensors (or, for a folder
that only has pytorch_model.bin, with torch.load(weights_only=True)), configs as JSON.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from core.config.spec import TrainConfig, from_dict, validate
from core.data.tokenizer import Tokenizer, bytes_tokenizer, pretrained_tokenizer
from core.errors import CheckpointError, UserError
from core.models import lora
from core.models.model import GPT, GPTConfig, linear_layers
from core.models.params import active_params, shape_params
from core.runs import checkpoint as ckpt
from core.weights import composite, families
from core.weights.check import check_weight_files
from core.weights.files import (  # noqa: F401 (their home before; imported from here)
    SAFETENSORS_DTYPES,
    ModelSourceError,
    drop_pages,
    map_safetensors,
    read_json,
    read_weights,
    weight_files,
)

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# Small text files of a model folder that an export carries along.
TEXT_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "preprocessor_config.json",  # a composite's image and audio settings (mmproj, hf export)
    "processor_config.json",
)


# -- where a pretrained model is -------------------------------------------------------------


def _download(repo_id: str) -> Path:
    """The hub model's folder in the normal Hugging Face cache, downloaded if need be (a
    progress bar, a disk-space check, one line for a gated, missing or unreachable model)."""
    import importlib.util

    if importlib.util.find_spec("huggingface_hub") is None:
        raise ModelSourceError(
            "init_from: a hub id needs the huggingface_hub package (pip install huggingface_hub)",
            field="init_from",
        )
    from core.weights import download

    return download.download(repo_id)


def is_hub_id(source: str | Path) -> bool:
    """owner/name that is no path here."""
    text = str(source)
    path = Path(text).expanduser()
    return bool(HUB_ID.match(text)) and not text.startswith((".", "/", "~")) and not path.exists()


def resolve_folder(source: str | Path) -> Path:
    """A model folder from a path or a hub id (which is downloaded into the HF cache)."""
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelSourceError(
                f"init_from: {path} has no config.json; expected a Hugging Face model folder "
                "(config.json, model.safetensors, tokenizer.json)",
                field="init_from",
            )
        return path.resolve()
    if path.exists():
        raise ModelSourceError(
            f"init_from: {path} is a file; expected a model folder or hub id", field="init_from"
        )
    if HUB_ID.match(str(source)) and not str(source).startswith((".", "/", "~")):
        return _download(str(source))
    raise ModelSourceError(
        f"init_from: {source} does not exist (expected a folder or a hub id)", field="init_from"
    )


_FINGERPRINTS: dict[tuple, str] = {}


def fingerprint(folder: Path) -> str:
    """A hash of the weight files' bytes: what a fine-tune's checkpoints name as their base."""
    files = weight_files(folder)
    key = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    if key not in _FINGERPRINTS:
        h = hashlib.blake2b(digest_size=12)
        for f in files:
            with open(f, "rb") as fh:
                while block := fh.read(8 << 20):
                    h.update(block)
        _FINGERPRINTS[key] = h.hexdigest()
    return _FINGERPRINTS[key]


# -- a pretrained model ----------------------------------------------------------------------


@dataclass
class Pretrained:
    """What a Hugging Face model folder says about itself (weights are read on demand)."""

    name: str  # as the user gave it: a path or a hub id
    folder: Path
    family: str
    config: GPTConfig
    hf_config: dict
    tokenizer: Tokenizer
    files: dict = field(default_factory=dict)  # TEXT_FILES that exist: name -> text

    def n_params(self) -> int:
        return shape_params(self.config)

    def info(self) -> dict:
        c = self.config
        return {
            "family": self.family,
            "parameters": self.n_params(),
            "active": active_params(c) if c.moe else None,  # MoE: what a token goes through
            "experts": (c.moe["n_experts"], c.moe["top_k"]) if c.moe else None,
            "layers": c.n_layers,
            "linear_layers": linear_layers(c),  # hybrid: Gated DeltaNet layers
            "width": c.hidden_dim,
            "heads": c.n_heads,
            "kv_heads": c.n_kv_heads,
            "context": c.seq_len,
            "vocab": c.vocab_size,
            "chat_template": bool(self.tokenizer.chat_template),
            "notes": families.notes(self.family, self.hf_config),
            "kept": composite.kept_line(self.hf_config),  # a composite's towers
        }

    def base_info(self) -> dict:
        """What an export needs of the model it writes: family, config and tokenizer files."""
        return {
            "init_from": self.name,
            "family": self.family,
            "hf_config": self.hf_config,
            "files": self.files,
        }

    def base_record(self) -> dict:
        """What a fine-tune's checkpoint keeps of its base: base_info, and the weights'
        fingerprint to refuse resuming on another base."""
        return {**self.base_info(), "fingerprint": fingerprint(self.folder)}

    def load_model(self, c: GPTConfig | None = None, mapped: bool = False) -> GPT:
        """The model with the pretrained weights, in fp32 on the CPU; mapped: in the files'
        dtype, memory-mapped where a weight is one file tensor (exports)."""
        c = c or self.config
        with torch.device("meta"):
            model = GPT(c)
        wanted = set(model.state_dict())
        maps: list = []
        files = read_weights(self.folder, mapped, maps)
        state = families.import_weights(self.family, c, files, wanted, lazy=mapped)
        if mapped:  # file tensors go in as they are; joined ones stay meta, made on demand
            model.weight_maps = maps  # for drop_pages once the model is made
            model.weight_sources = {k: v for k, v in state.items() if callable(v)}
            state = {k: v for k, v in state.items() if not callable(v)}
        else:
            model = model.to_empty(device="cpu")
            state = {k: v.float() for k, v in state.items()}
        model.load_state_dict(state, strict=False, assign=True)
        if not mapped:
            drop_pages(maps)
        if c.tie_embeddings:
            model.head.weight = model.tok_emb.weight
        return model


def info_line(info: dict) -> str:
    family = f"{families.get(info['family']).display} ({info['family']})"
    if info.get("linear_layers"):
        n = info["linear_layers"]
        kinds = f"hybrid: {n} linear-attention + {info['layers'] - n} attention layers"
        family = f"{families.get(info['family']).display} ({kinds})"
    size = f"{info['parameters'] / 1e6:,.1f}M parameters"
    if info.get("active"):  # as MoE model cards say it: "30.5B total, 3.3B active"
        size = f"{_size(info['parameters'])} total, {_size(info['active'])} active parameters"
        moe = info.get("experts")
        if moe:
            size += f" ({moe[1]} of {moe[0]} experts a token)"
    kept = f", {info['kept']}" if info.get("kept") else ""  # a composite's towers
    return (
        f"{family}{kept}, {size}, {info['layers']} layers, "
        f"width {info['width']}, {info['heads']} heads ({info['kv_heads']} kv), context "
        f"{info['context']:,}, vocab {info['vocab']:,}, chat template: "
        f"{'yes' if info['chat_template'] else 'no'}"
    ) + "".join(f"\n{note}" for note in info.get("notes", ()))


def _size(n: int) -> str:
    return f"{n / 1e9:,.1f}B" if n >= 1e9 else f"{n / 1e6:,.1f}M"


def _read_config(folder: Path) -> tuple[dict, str, GPTConfig]:
    """(config.json, family, shape) of a model folder."""
    hf_config = read_json(folder / "config.json")
    return hf_config, *families.model_config(hf_config, str(folder / "config.json"))


_SHAPES: dict[str, GPTConfig] = {}


def pretrained_shape(source: str | Path) -> GPTConfig:
    """A pretrained model's shape from its config.json alone (for estimates): a hub id's
    config.json is all that is downloaded for it."""
    if is_hub_id(source):
        if str(source) not in _SHAPES:  # an estimate asks many times: one look-up
            from core.weights.download import config_file

            path = config_file(str(source))
            _SHAPES[str(source)] = families.model_config(read_json(path), str(path))[1]
        return _SHAPES[str(source)]
    return _read_config(resolve_folder(source))[2]


def config_only(source: str | Path) -> Pretrained:
    """A pretrained model as its config.json alone (no tokenizer, no weights): enough for
    apply_pretrained and an estimate; a hub id downloads nothing else."""
    if is_hub_id(source):
        from core.weights.download import config_file

        path = config_file(str(source))
    else:
        path = resolve_folder(source) / "config.json"
    hf_config = read_json(path)
    family, config = families.model_config(hf_config, str(path))
    return Pretrained(str(source), path.parent, family, config, hf_config, tokenizer=None)


# The fields a pretrained start decides (apply_pretrained): before it is read, the flags alone
# cannot settle them, so the checks that run first leave them out (core.cli.train).
FILLED_BY_MODEL = ("hidden_dim", "n_layers", "n_heads", "bias", "tokenizer", "arch", "qk_norm")


def apply_pretrained(cfg: TrainConfig, pre: Pretrained, explicit=()) -> TrainConfig:
    """The config with the pretrained model's shape filled in. A field in explicit (set by
    the user) that contradicts the model is refused, naming it; seq_len defaults to the
    smaller of the config's and the model's maximum."""
    c = pre.config
    shape = {
        "hidden_dim": c.hidden_dim,
        "n_layers": c.n_layers,
        "n_heads": c.n_heads,
        "bias": c.bias,
        "tokenizer": "model",
        "arch": families.get(pre.family).new_arch,
        "qk_norm": c.qk_norm,
    }
    for name, value in shape.items():
        if name in explicit and getattr(cfg, name) != value:
            raise ModelSourceError(
                f"{name}: {getattr(cfg, name)!r} contradicts the pretrained model {pre.name} "
                f"({value!r}); leave it out with init_from",
                field=name,
            )
    if "vocab_size" in explicit and cfg.vocab_size != c.vocab_size:
        raise ModelSourceError(
            f"vocab_size: {cfg.vocab_size} contradicts the pretrained model {pre.name} "
            f"({c.vocab_size} tokens); leave it out with init_from",
            field="vocab_size",
        )
    for name in ("lora_experts", "train_router"):
        if getattr(cfg, name) and not c.moe:
            raise ModelSourceError(
                f"{name}: {pre.name} is a dense model (no experts); it applies to "
                "mixture-of-experts models only",
                field=name,
            )
    if cfg.train_vision:
        from core.weights import vision  # it reads weights through this module

        if vision.kind_of(pre.hf_config) is None:
            raise ModelSourceError(
                f"train_vision: {pre.name} has no vision tower TrainDeck trains (Gemma 3 4B "
                "and up have one)",
                field="train_vision",
            )
    seq_len = min(cfg.seq_len, c.seq_len)
    if "seq_len" in explicit:
        if cfg.seq_len > c.seq_len:
            raise ModelSourceError(
                f"seq_len: {cfg.seq_len} is longer than the pretrained model's context "
                f"({c.seq_len})",
                field="seq_len",
            )
        seq_len = cfg.seq_len
    return dataclasses.replace(cfg, **shape, seq_len=seq_len)


def add_family_stops(tokenizer: Tokenizer, family: str) -> None:
    """The family's end-of-turn tokens (Gemma's <end_of_turn>, Phi's <|end|>) that its chat
    template writes are stops, also where generation_config.json lists only the EOS: TrainDeck's
    chat, the GGUF's end-of-turn ids and the Modelfile's stops then agree."""
    template = tokenizer.chat_template or ""
    stops = list(tokenizer.meta.get("stop_ids") or [])
    for text in families.get(family).stops:
        i = tokenizer.hf.token_to_id(text)
        if i is not None and text in template and i not in stops:
            stops.append(i)
    tokenizer.meta["stop_ids"] = stops


def open_pretrained(source: str | Path) -> Pretrained:
    folder = resolve_folder(source)
    hf_config, family, config = _read_config(folder)
    try:
        tokenizer = pretrained_tokenizer(folder)
    except UserError as e:
        raise ModelSourceError(f"init_from: {e}", field="init_from") from None
    add_family_stops(tokenizer, family)
    if tokenizer.vocab_size > config.vocab_size:
        raise ModelSourceError(
            f"init_from: the tokenizer has {tokenizer.vocab_size} tokens but the model only "
            f"{config.vocab_size} embedding rows",
            field="init_from",
        )
    # Before anything is read or prepared: a damaged or mismatched folder is one line now.
    check_weight_files(folder, family, config, weight_files(folder))
    files = {
        n: (folder / n).read_text(encoding="utf-8") for n in TEXT_FILES if (folder / n).is_file()
    }
    return Pretrained(str(source), folder, family, config, hf_config, tokenizer, files)


# -- everything that can be loaded for use ----------------------------------------------------


@dataclass
class Loaded:
    model: GPT
    tokenizer: Tokenizer
    config: TrainConfig | None  # None for a plain Hugging Face model
    checkpoint: Path  # the checkpoint file, or the model folder
    step: int
    val_loss: float | None
    family: str  # a fine-tune's base's; a new model's from its shape (new_model_family)
    base: dict | None = None  # a fine-tune's base (Pretrained.base_record)


def checkpoint_path(target: str | Path, which: str = "best") -> Path:
    """A checkpoint file as given, or a run folder's best.pt / latest.pt."""
    path = Path(target)
    if path.is_file():
        return path
    if path.is_dir():
        folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        order = ["best.pt", "latest.pt"] if which == "best" else ["latest.pt", "best.pt"]
        for name in order:
            if (folder / name).is_file():
                return folder / name
        raise CheckpointError(f"checkpoint: {path} holds no best.pt or latest.pt")
    raise CheckpointError(f"checkpoint: {target} is neither a run folder nor a checkpoint file")


def run_tokenizer(state: dict, ckpt_file: Path) -> Tokenizer:
    """The tokenizer the model was trained with: in the checkpoint, else beside it, else bytes
    (checkpoints from before tokenizers were recorded were all byte-level)."""
    info = state.get("data_info") or {}
    if info.get("tokenizer_json"):
        return Tokenizer.from_json(info["tokenizer_json"], info.get("tokenizer_meta"))
    for folder in (ckpt_file.parent, ckpt_file.parent.parent):
        if (folder / "tokenizer.json").is_file():
            return Tokenizer.load(folder / "tokenizer.json")
    return bytes_tokenizer()


def model_config_of(state: dict, cfg: TrainConfig) -> GPTConfig:
    """The inference shape a checkpoint was trained with (older ones: from the config)."""
    if state.get("model_config"):
        return GPTConfig.from_dict({**state["model_config"], "dropout": 0.0})
    return GPTConfig.from_train(cfg, training=False)


def load_weights(model: GPT, state: dict, assign: bool = False) -> None:
    """A checkpoint's weights into model: all of them, or (a LoRA fine-tune of a
    pretrained model) only the adapters, the base being loaded already. assign: use the
    state's tensors themselves (memory-mapped ones stay mapped)."""
    if not state.get("adapters_only") and hasattr(model, "vision"):
        # a frozen vision tower (core.models.vision) comes from the base, not the checkpoint
        missing, unexpected = model.load_state_dict(state["model"], strict=False, assign=assign)
        missing = [k for k in missing if not k.startswith("vision.")]
        if missing or unexpected:
            raise RuntimeError(f"weights differ: {(missing or unexpected)[0]}")
        return
    if not state.get("adapters_only"):
        model.load_state_dict(state["model"], assign=assign)
        return
    missing, unexpected = model.load_state_dict(state["model"], strict=False, assign=assign)
    adapters_missing = [k for k in missing if lora.is_adapter(k)]
    if unexpected or adapters_missing:
        raise RuntimeError(f"adapters differ: {(unexpected or adapters_missing)[0]}")


def _base_model(state: dict, cfg: TrainConfig, c: GPTConfig, path: Path, mapped=False) -> GPT:
    """The model a checkpoint's weights go into: for a LoRA fine-tune of a pretrained model,
    its base (checked against the fingerprint the checkpoint names) with adapters."""
    base = state.get("base")
    if state.get("adapters_only"):
        pre = open_pretrained(base["init_from"])
        if fingerprint(pre.folder) != base["fingerprint"]:
            raise CheckpointError(
                f"checkpoint: {path} holds LoRA adapters for {base['init_from']} (weights "
                f"{base['fingerprint']}), which now holds other weights; restore that model"
            )
        model = pre.load_model(c, mapped)
    else:
        with torch.device("meta" if mapped else "cpu"):  # the checkpoint's tensors go in
            model = GPT(c)
    lora.apply_config(model, cfg)
    if cfg.train_vision:  # its trained tower, in the checkpoint (over the base's, with LoRA)
        from core.models.vision import attach, train
        from core.weights import vision

        folder = resolve_folder(base["init_from"])
        tower = vision.load_vision(folder, base["hf_config"])
        attach(model, train(tower, cfg.lora_rank, cfg.lora_scale_alpha, cfg.lora_dropout), None)
    return model


def load_checkpoint(
    target: str | Path, which: str = "best", device: str = "cpu", mapped: bool = False
) -> Loaded:
    path = checkpoint_path(target, which)
    state = ckpt.load_model_state(path, mmap=mapped)
    cfg = validate(from_dict(state["config"], source=str(path)))
    c = model_config_of(state, cfg)
    c.grad_checkpointing = False
    model = _base_model(state, cfg, c, path, mapped)
    try:
        load_weights(model, state, assign=mapped)
    except (RuntimeError, KeyError) as e:
        msg = f"checkpoint: {path} does not hold this model's weights ({e})"
        raise CheckpointError(msg) from None
    (model if mapped else model.to(device)).eval()
    meta = state.get("meta") or {}
    base = state.get("base")
    return Loaded(
        model,
        run_tokenizer(state, path),
        cfg,
        path,
        int(state["step"]),
        meta.get("val_loss"),
        family=base["family"] if base else families.new_model_family(c),
        base=base,
    )


def is_model_folder(target: str | Path) -> bool:
    path = Path(target)
    return (
        path.is_dir() and (path / "config.json").is_file() and not (path / "checkpoints").is_dir()
    )


def load(
    target: str | Path, which: str = "best", device: str = "cpu", mapped: bool = False
) -> Loaded:
    """Model (eval mode, fp32, on device) and tokenizer of a run folder, a checkpoint file,
    a Hugging Face model folder or a hub id. mapped (exports): the weights memory-mapped in
    their files' dtype where they can be, so a model larger than memory can be written out."""
    path = Path(target)
    if path.exists() and not is_model_folder(path):
        return load_checkpoint(path, which, device, mapped)
    if not path.exists() and not HUB_ID.match(str(target)):
        raise CheckpointError(
            f"checkpoint: {target} is neither a run folder, a checkpoint file, a model folder "
            "nor a hub id"
        )
    pre = open_pretrained(target)
    model = pre.load_model(mapped=mapped)
    model = (model if mapped else model.to(device)).eval()
    return Loaded(model, pre.tokenizer, None, pre.folder, 0, None, pre.family, pre.base_info())
