"""TrainConfig: the one validated object a run is described by.

Presets, the GUI form and CLI flags only fill it in; `validate` names the field and the
allowed range in every message.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields

from .errors import ConfigError

PRECISIONS = ("auto", "bf16", "fp16", "fp32")

# Changing these changes tensor shapes: a checkpoint cannot be loaded into them.
ARCH_FIELDS = ("hidden_dim", "n_layers", "n_heads", "seq_len", "tokenizer", "vocab_size", "bias")
# Changing these changes which tokens are drawn: the resumed run would not be the same run.
STREAM_FIELDS = (
    "data",
    "data_extensions",
    "val_fraction",
    "corpus_max_bytes",
    "max_data_bytes",
    "seed",
)
TOKENIZERS = ("bytes", "bpe")


@dataclass
class TrainConfig:
    # model
    hidden_dim: int = 128
    n_layers: int = 2
    n_heads: int = 4
    seq_len: int = 128
    dropout: float = 0.0
    # batch
    batch_size: int = 8
    grad_accum: int = 1
    # optimisation
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9  # AdamW betas
    beta2: float = 0.95
    grad_clip: float = 1.0
    max_steps: int | None = 500
    max_epochs: float | None = None
    # execution
    precision: str = "auto"
    device: str = "auto"
    compile: bool = False
    grad_checkpointing: bool = False
    bias: bool = True  # Linear and LayerNorm biases; false is nanoGPT's faster default
    deterministic: bool = False
    seed: int = 1337
    # data: None means the embedded default corpus
    data: str | None = None
    data_extensions: list[str] = field(default_factory=lambda: [".txt", ".md"])
    val_fraction: float = 0.05
    corpus_max_bytes: int = 4_000_000  # the embedded corpus only; a user's data is used whole
    max_data_bytes: int | None = None  # optional cap on a user's data
    tokenizer: str = "bytes"
    vocab_size: int = 8192  # BPE only; bytes always have 256
    # cadence
    log_every: int = 10
    eval_every: int = 100
    eval_batches: int = 8
    ckpt_every: int = 200
    keep_checkpoints: int = 3
    sample_tokens: int = 200
    # informational: which preset filled this in
    preset: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def model_vocab(self) -> int:
        """Rows of the embedding: 256 for bytes, vocab_size for BPE (a BPE learned from
        little text may use fewer; the spare rows are never trained)."""
        return 256 if self.tokenizer == "bytes" else self.vocab_size

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.grad_accum * self.seq_len


# name -> (kind, low, high, help). Bounds are inclusive; None means unbounded.
LIMITS: dict[str, tuple[type, float | None, float | None, str]] = {
    "hidden_dim": (int, 8, 16384, "model width; must divide by n_heads"),
    "n_layers": (int, 1, 256, "transformer blocks"),
    "n_heads": (int, 1, 256, "attention heads; hidden_dim / n_heads is the head size"),
    "seq_len": (int, 8, 65536, "context length in bytes"),
    "dropout": (float, 0.0, 0.9, "dropout probability"),
    "batch_size": (int, 1, 65536, "sequences per micro-batch"),
    "grad_accum": (int, 1, 65536, "micro-batches per optimizer step"),
    "lr": (float, 1e-8, 1.0, "peak learning rate"),
    "min_lr_ratio": (float, 0.0, 1.0, "final lr as a fraction of the peak"),
    "warmup_steps": (int, 0, None, "linear warmup steps"),
    "weight_decay": (float, 0.0, 1.0, "AdamW weight decay"),
    "beta1": (float, 0.0, 0.9999, "AdamW beta1 (momentum)"),
    "beta2": (float, 0.0, 0.99999, "AdamW beta2 (0.99 suits small models and data)"),
    "grad_clip": (float, 0.0, None, "max gradient norm; 0 disables clipping"),
    "max_steps": (int, 1, None, "optimizer steps to train"),
    "max_epochs": (float, 0.001, None, "passes over the training tokens"),
    "seed": (int, 0, 2**63 - 1, "random seed"),
    "val_fraction": (float, 0.001, 0.5, "share of the data held out for validation"),
    "corpus_max_bytes": (int, 10_000, None, "bytes of the embedded corpus used"),
    "max_data_bytes": (int, 1000, None, "use only the first N bytes of your data"),
    "vocab_size": (int, 512, 65536, "BPE vocabulary size (with --tokenizer bpe)"),
    "log_every": (int, 1, None, "steps between metric reads (each read syncs the GPU)"),
    "eval_every": (int, 1, None, "steps between validation runs"),
    "eval_batches": (
        int,
        1,
        10_000,
        "validation batches (optimizer-step sized) per eval",
    ),
    "ckpt_every": (int, 1, None, "steps between checkpoints"),
    "keep_checkpoints": (int, 0, 1000, "step-NNNNNN.pt files kept"),
    "sample_tokens": (int, 0, 100_000, "bytes of text generated at each evaluation"),
}
BOOL_FIELDS = ("compile", "grad_checkpointing", "deterministic", "bias")


def describe_limit(name: str) -> str:
    kind, low, high, _ = LIMITS[name]
    word = "an integer" if kind is int else "a number"
    if high is None:
        return f"{word} >= {low}"
    return f"{word} from {low} to {high}"


def _coerce(name: str, value):
    """Turn YAML/CLI/GUI values into the field's type, or raise naming the field."""
    if name in BOOL_FIELDS:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name}: expected true or false, got {value!r}")
    if name in LIMITS:
        kind, low, high, _ = LIMITS[name]
        if value is None and name in ("max_steps", "max_epochs", "max_data_bytes"):
            return None
        if isinstance(value, bool) or value is None:
            raise ConfigError(f"{name}: expected {describe_limit(name)}, got {value!r}")
        try:
            number = kind(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected {describe_limit(name)}, got {value!r}") from None
        if kind is int and isinstance(value, float) and value != number:
            raise ConfigError(f"{name}: expected {describe_limit(name)}, got {value!r}")
        if (low is not None and number < low) or (high is not None and number > high):
            raise ConfigError(f"{name}: expected {describe_limit(name)}, got {value!r}")
        return number
    return value


def validate(cfg: TrainConfig) -> TrainConfig:
    """Check every field; return a new config with values coerced to their types."""
    values = {}
    for f in fields(cfg):
        values[f.name] = _coerce(f.name, getattr(cfg, f.name))
    if values["precision"] not in PRECISIONS:
        raise ConfigError(
            f"precision: expected one of {', '.join(PRECISIONS)}, got {values['precision']!r}"
        )
    if values["tokenizer"] not in TOKENIZERS:
        raise ConfigError(
            f"tokenizer: expected one of {', '.join(TOKENIZERS)}, got {values['tokenizer']!r}"
        )
    device = values["device"]
    if not isinstance(device, str) or not (
        device in ("auto", "cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit())
    ):
        raise ConfigError(f"device: expected auto, cpu, cuda or cuda:N, got {device!r}")
    if values["hidden_dim"] % values["n_heads"]:
        raise ConfigError(
            f"hidden_dim: {values['hidden_dim']} must be divisible by n_heads ({values['n_heads']})"
        )
    if values["max_steps"] is None and values["max_epochs"] is None:
        raise ConfigError("max_steps: set max_steps or max_epochs")
    exts = values["data_extensions"]
    if isinstance(exts, str):
        exts = [e.strip() for e in exts.split(",") if e.strip()]
    if not isinstance(exts, list) or not exts or not all(isinstance(e, str) for e in exts):
        raise ConfigError("data_extensions: expected a list of file endings such as ['.txt']")
    values["data_extensions"] = [e if e.startswith(".") else "." + e for e in exts]
    if values["data"] is not None and not isinstance(values["data"], str):
        raise ConfigError(f"data: expected a file or folder path, got {values['data']!r}")
    if values["data"] == "":
        values["data"] = None
    return TrainConfig(**values)


def from_dict(d: dict, base: TrainConfig | None = None, source: str = "config") -> TrainConfig:
    """Fill a config from a mapping; unknown keys are an error naming them and the source."""
    if not isinstance(d, dict):
        raise ConfigError(f"{source}: expected a mapping of field: value")
    known = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ConfigError(
            f"{source}: unknown field {unknown[0]!r}; allowed fields: {', '.join(sorted(known))}"
        )
    base = base or TrainConfig()
    return dataclasses.replace(base, **d)


def compare_for_resume(saved: TrainConfig, requested: TrainConfig) -> tuple[list[str], list[str]]:
    """Return (refused, allowed) human-readable differences between two configs."""
    refused, allowed = [], []
    for f in fields(TrainConfig):
        old, new = getattr(saved, f.name), getattr(requested, f.name)
        if old == new or f.name == "preset":
            continue
        if f.name == "vocab_size" and saved.tokenizer == requested.tokenizer == "bytes":
            continue  # bytes have 256 tokens whatever vocab_size says
        change = f"{f.name} {old!r} -> {new!r}"
        if f.name in ARCH_FIELDS:
            refused.append(f"{change} (architecture)")
        elif f.name in STREAM_FIELDS:
            refused.append(f"{change} (data stream)")
        elif f.name in ("batch_size", "grad_accum"):
            continue  # judged together below
        else:
            allowed.append(change)
    old_eff = saved.batch_size * saved.grad_accum
    new_eff = requested.batch_size * requested.grad_accum
    if (saved.batch_size, saved.grad_accum) != (requested.batch_size, requested.grad_accum):
        change = (
            f"batch_size x grad_accum {saved.batch_size}x{saved.grad_accum} -> "
            f"{requested.batch_size}x{requested.grad_accum}"
        )
        if old_eff == new_eff:
            allowed.append(change + " (same effective batch)")
        else:
            refused.append(change + " (effective batch changes)")
    return refused, allowed
