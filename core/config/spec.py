"""TrainConfig: the one validated object a run is described by.

Presets, the GUI form and CLI flags only fill it in; `validate` names the field and the
allowed range in every message.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field, fields

from core.errors import ConfigError

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
LORA_TARGETS = ("attn", "mlp", "all")
LORA_TARGET_HELP = (
    "layers that get LoRA adapters; attn: attention projections (Llama, Mistral, Qwen: "
    "q_proj, k_proj, v_proj, o_proj; GPT-2: c_attn, attn.c_proj); mlp: feed-forward "
    "(gate_proj, up_proj, down_proj; GPT-2: c_fc, mlp.c_proj); all: both"
)
TOKENIZERS = ("bytes", "bpe", "model")  # model: the pretrained model's own (init_from)
DATA_FORMATS = ("auto", "text", "chat")  # chat: .jsonl examples (core.data.chatdata)
ARCHS = ("gpt2", "llama")
OPTIMIZERS = ("auto", "adamw", "muon")  # auto: muon for a new model, adamw for a fine-tune
SCHEDULES = ("cosine", "wsd")
DECAY_SHAPES = ("linear", "sqrt")  # sqrt: 1 - sqrt(progress)
CONFIG_VERSION = (
    3  # bump with a MIGRATIONS entry whenever a field is renamed or its meaning changes
)


@dataclass(frozen=True)
class Spec:
    """Everything said about one config field: CLI flag, form widget and validation read it."""

    help: str
    label: str = ""  # the form's label; empty: the field has no widget in the form
    group: str | None = None  # the form's group box
    low: float | None = None  # inclusive bounds for numbers; None: unbounded
    high: float | None = None
    choices: tuple[str, ...] = ()
    optional: bool = False  # None is allowed (and means "not set")
    arch: bool = False  # changes tensor shapes: a checkpoint cannot be loaded into another value
    stream: bool = False  # changes which tokens are drawn: a resumed run would be another run
    state: bool = False  # changes what the optimizer state holds: a checkpoint cannot resume
    cli: bool = True  # has a --flag of its own (booleans that default to true get --no-flag)
    widget: str = ""  # a special form widget: "limit", "device", "text"


def spec(default, help: str, **kw):
    """A dataclass field carrying its Spec; a list default is copied per instance."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"spec": Spec(help, **kw)})
    return field(default=default, metadata={"spec": Spec(help, **kw)})


MODEL, BATCH, EXECUTION, INTERVALS, DATA, ADVANCED = (
    "Model", "Batch and schedule", "Execution", "Intervals (steps)", "Data", "Advanced",
)  # fmt: skip


@dataclass
class TrainConfig:
    # model
    init_from: str | None = spec(
        None,
        "start from a pretrained model: a Hugging Face model folder or hub id "
        "(GPT-2, Llama, Mistral, Qwen2, Qwen3 families); default: a new model",
        optional=True,
        arch=True,
    )
    hidden_dim: int = spec(
        128,
        "model width; must divide by n_heads",
        label="Hidden dim",
        group=MODEL,
        low=8,
        high=16384,
        arch=True,
    )
    n_layers: int = spec(
        2, "transformer blocks", label="Layers", group=MODEL, low=1, high=256, arch=True
    )
    n_heads: int = spec(
        4,
        "attention heads; hidden_dim / n_heads is the head size",
        label="Heads",
        group=MODEL,
        low=1,
        high=256,
        arch=True,
    )
    seq_len: int = spec(
        128,
        "context length in tokens",
        label="Context length",
        group=MODEL,
        low=8,
        high=65536,
        arch=True,
    )
    arch: str = spec(
        "llama",
        "a new model's architecture; llama: RMSNorm, rotary positions, SwiGLU, no biases "
        "(exports as a Llama model); gpt2: LayerNorm, learned positions, GELU (nanoGPT's). "
        "A pretrained model keeps its own",
        label="Architecture",
        group=MODEL,
        choices=ARCHS,
        arch=True,
    )
    n_kv_heads: int | None = spec(
        None,
        "llama: key/value heads for grouped-query attention; must divide n_heads "
        "(default: n_heads)",
        low=1,
        high=256,
        optional=True,
        arch=True,
    )
    qk_norm: bool = spec(
        False,
        "llama: RMSNorm over each head of q and k (exports as a Qwen3 model)",
        label="QK-norm",
        group=ADVANCED,
        arch=True,
    )
    dropout: float = spec(
        0.0, "dropout probability", label="Dropout", group=ADVANCED, low=0.0, high=0.9
    )
    # LoRA: 0 trains every weight; R > 0 freezes them and trains rank-R adapters
    lora_rank: int = spec(
        0,
        "LoRA adapter rank; 0: full fine-tuning (every weight trains)",
        label="LoRA rank",
        group=MODEL,
        low=0,
        high=4096,
        arch=True,
    )
    lora_alpha: float | None = spec(
        None,
        "LoRA scale numerator (the update is alpha / rank * B A); default: 2 x rank",
        low=1e-6,
        high=1e6,
        optional=True,
        arch=True,
    )
    lora_dropout: float = spec(
        0.0, "dropout on the LoRA input", label="LoRA dropout", group=ADVANCED, low=0.0, high=0.9
    )
    lora_targets: str = spec(
        "all",
        LORA_TARGET_HELP,
        label="LoRA targets",
        group=ADVANCED,
        choices=LORA_TARGETS,
        arch=True,
    )
    bias: bool = spec(
        True,
        "biases in Linear and LayerNorm layers (without, as nanoGPT's bias=False: a bit faster)",
        label="Biases",
        group=ADVANCED,
        arch=True,
    )
    # batch and schedule
    batch_size: int = spec(
        8, "sequences per micro-batch", label="Batch size", group=BATCH, low=1, high=65536
    )
    grad_accum: int = spec(
        1,
        "micro-batches per optimizer step",
        label="Grad accumulation",
        group=BATCH,
        low=1,
        high=65536,
    )
    optimizer: str = spec(
        "auto",
        "muon: Muon for the hidden weight matrices, AdamW for embeddings, head and norms; "
        "adamw: AdamW for all; auto: muon for a new model, adamw for a pretrained one",
        label="Optimizer",
        group=BATCH,
        choices=OPTIMIZERS,
        state=True,
    )
    lr: float | None = spec(
        None,
        "peak learning rate of AdamW (with muon: of the embeddings, head and norms); "
        "default: scaled with the model's width (core.config.recipe)",
        label="Learning rate",
        group=BATCH,
        low=1e-8,
        high=1.0,
        optional=True,
    )
    muon_lr: float | None = spec(
        None,
        "peak learning rate of Muon's hidden matrices (default: core.config.recipe's)",
        label="Muon lr",
        group=ADVANCED,
        low=1e-8,
        high=10.0,
        optional=True,
    )
    warmup_steps: int = spec(20, "linear warmup steps", label="Warmup steps", group=BATCH, low=0)
    schedule: str = spec(
        "cosine",
        "cosine: decay from the first step after warmup; wsd: warmup, a stable phase, then "
        "a decay over the last decay_fraction of the run (a run can be finished early)",
        label="Schedule",
        group=BATCH,
        choices=SCHEDULES,
    )
    decay_fraction: float = spec(
        0.2,
        "wsd: share of the run spent decaying the learning rate; also the default length "
        "of a Finish cooldown, as a share of the steps done",
        label="Decay share",
        group=ADVANCED,
        low=0.0,
        high=1.0,
    )
    decay_shape: str = spec(
        "linear",
        "wsd and Finish: linear, or sqrt (1 - sqrt of the progress: drops fast, then slowly)",
        label="Decay shape",
        group=ADVANCED,
        choices=DECAY_SHAPES,
    )
    finish_steps: int | None = spec(
        None,
        "steps of the cooldown a Finish request runs before saving and stopping "
        "(default: decay_fraction x the steps done)",
        low=1,
        optional=True,
    )
    max_time: str | None = spec(
        None,
        "train for this long, e.g. 90s, 45m, 2h, 1h30m (overrides --max-steps and "
        "--max-epochs): steps are planned from the measured speed",
        optional=True,
    )
    max_steps: int | None = spec(
        500,
        "optimizer steps to train",
        label="Train for",
        group=BATCH,
        low=1,
        optional=True,
        widget="limit",
    )
    max_epochs: float | None = spec(
        None, "passes over the training tokens (overrides --max-steps)", low=0.001, optional=True
    )
    min_lr_ratio: float = spec(
        0.1,
        "final lr as a fraction of the peak",
        label="Min lr ratio",
        group=ADVANCED,
        low=0.0,
        high=1.0,
    )
    weight_decay: float = spec(
        0.1, "AdamW weight decay", label="Weight decay", group=ADVANCED, low=0.0, high=1.0
    )
    beta1: float = spec(
        0.9, "AdamW beta1 (momentum)", label="AdamW beta1", group=ADVANCED, low=0.0, high=0.9999
    )
    beta2: float = spec(
        0.95,
        "AdamW beta2 (0.99 suits small models and data)",
        label="AdamW beta2",
        group=ADVANCED,
        low=0.0,
        high=0.99999,
    )
    grad_clip: float = spec(
        1.0, "max gradient norm; 0 disables clipping", label="Grad clip", group=ADVANCED, low=0.0
    )
    # execution
    precision: str = spec(
        "auto",
        "auto: bf16 where the GPU supports it, else fp16; fp32 on the CPU",
        label="Precision",
        group=EXECUTION,
        choices=PRECISIONS,
    )
    device: str = spec(
        "auto",
        "auto | cpu | cuda | cuda:N (auto: the first CUDA GPU if there is one, else the CPU)",
        label="Device",
        group=EXECUTION,
        widget="device",
    )
    compile: bool = spec(
        False,
        "torch.compile the model: faster steps on a GPU after a slow first step",
        label="torch.compile",
        group=EXECUTION,
    )
    grad_checkpointing: bool = spec(
        False,
        "recompute activations in the backward pass: less memory, about 30% slower",
        label="Gradient checkpointing",
        group=EXECUTION,
    )
    deterministic: bool = spec(
        False,
        "deterministic kernels, so CUDA runs repeat bit for bit (slower)",
        label="Deterministic",
        group=ADVANCED,
    )
    seed: int = spec(
        1337,
        "random seed",
        label="Seed",
        group=ADVANCED,
        low=0,
        high=2**63 - 1,
        stream=True,
        widget="text",
    )
    # data: None means the embedded default corpus
    data: str | None = spec(
        None,
        "a text file or a folder of them (default: the embedded corpus)",
        optional=True,
        stream=True,
    )
    tokenizer: str = spec(
        "bytes",
        "bytes: 256 tokens, nothing to learn; bpe: a byte-level BPE learned from your data "
        "once (Hugging Face tokenizers), fewer tokens per byte; model: a pretrained "
        "model's own (set by init_from)",
        label="Tokenizer",
        group=DATA,
        choices=TOKENIZERS,
        arch=True,
    )
    vocab_size: int = spec(
        8192,
        "BPE vocabulary size (with tokenizer bpe; bytes always have 256)",
        label="BPE vocab",
        group=DATA,
        low=512,
        high=65536,
        arch=True,
    )
    data_format: str = spec(
        "auto",
        "text: plain text; chat: .jsonl examples (messages, prompt/completion or Alpaca) "
        "rendered with the model's chat template, loss on the answers only; auto: chat for "
        ".jsonl data, else text",
        label="Data format",
        group=DATA,
        choices=DATA_FORMATS,
        stream=True,
    )
    train_on_prompts: bool = spec(
        False,
        "chat data: let system and user turns carry the loss too (default: answers only)",
        label="Train on prompts",
        group=ADVANCED,
        stream=True,
    )
    drop_long: bool = spec(
        False,
        "chat data: skip examples longer than the context (default: truncate them)",
        label="Drop long examples",
        group=ADVANCED,
        stream=True,
    )
    skip_bad_lines: bool = spec(
        False,
        "chat data: skip and count malformed lines (default: stop at the first, naming it)",
        label="Skip bad lines",
        group=ADVANCED,
        stream=True,
    )
    data_extensions: list[str] = spec(
        [".txt", ".md"],
        "file endings read from a data folder, comma separated",
        label="File endings",
        group=ADVANCED,
        stream=True,
        widget="text",
    )
    val_fraction: float = spec(
        0.05,
        "share of the data held out for validation",
        label="Validation share",
        group=ADVANCED,
        low=0.001,
        high=0.5,
        stream=True,
    )
    corpus_max_bytes: int = spec(
        4_000_000,
        "bytes of the embedded corpus used (your own data is used whole)",
        label="Corpus cap (bytes)",
        group=ADVANCED,
        low=10_000,
        stream=True,
    )
    max_data_bytes: int | None = spec(
        None,
        "use only the first N bytes of your data (default: all of it)",
        low=1000,
        optional=True,
        stream=True,
    )
    # intervals
    eval_every: int = spec(
        100, "steps between validation runs", label="Eval every", group=INTERVALS, low=1
    )
    ckpt_every: int = spec(
        200, "steps between checkpoints", label="Checkpoint every", group=INTERVALS, low=1
    )
    log_every: int = spec(
        10,
        "steps between metric reads (each read syncs the GPU)",
        label="Log every",
        group=INTERVALS,
        low=1,
    )
    eval_batches: int = spec(
        8,
        "validation batches (optimizer-step sized) per eval",
        label="Eval batches",
        group=ADVANCED,
        low=1,
        high=10_000,
    )
    keep_checkpoints: int = spec(
        3, "step-NNNNNN.pt files kept", label="Keep checkpoints", group=ADVANCED, low=0, high=1000
    )
    sample_tokens: int = spec(
        200,
        "tokens of text generated at each evaluation",
        label="Sample tokens",
        group=ADVANCED,
        low=0,
        high=100_000,
    )
    # informational: which preset filled this in
    preset: str | None = spec(None, "the preset this config came from", optional=True, cli=False)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "config_version": CONFIG_VERSION}

    @property
    def model_vocab(self) -> int:
        """Rows of the embedding: 256 for bytes, vocab_size for BPE (a BPE learned from
        little text may use fewer; the spare rows are never trained)."""
        return 256 if self.tokenizer == "bytes" else self.vocab_size  # "model": see init_from

    @property
    def lora_scale_alpha(self) -> float:
        """alpha as used: the one set, else 2 x rank."""
        return self.lora_alpha if self.lora_alpha is not None else 2.0 * self.lora_rank

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.grad_accum * self.seq_len


def from_known(cls, d: dict):
    """A dataclass from a saved mapping, leaving out keys it no longer has."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


def _kind(hint) -> type:
    """int for `int | None`, list for `list[str]`."""
    if typing.get_origin(hint) is list:
        return list
    return ([t for t in typing.get_args(hint) if t is not type(None)] or [hint])[0]


_HINTS = typing.get_type_hints(TrainConfig)
SPECS: dict[str, Spec] = {f.name: f.metadata["spec"] for f in fields(TrainConfig)}
KINDS: dict[str, type] = {name: _kind(_HINTS[name]) for name in SPECS}
DEFAULTS: dict[str, object] = TrainConfig().to_dict()
BOOL_FIELDS = tuple(n for n, k in KINDS.items() if k is bool)
ARCH_FIELDS = tuple(n for n, s in SPECS.items() if s.arch)
STREAM_FIELDS = tuple(n for n, s in SPECS.items() if s.stream)
STATE_FIELDS = tuple(n for n, s in SPECS.items() if s.state)
# name -> (kind, low, high, help) for the numeric fields
LIMITS: dict[str, tuple[type, float | None, float | None, str]] = {
    n: (KINDS[n], s.low, s.high, s.help) for n, s in SPECS.items() if KINDS[n] in (int, float)
}


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
        if value is None and SPECS[name].optional:
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
    for name, s in SPECS.items():
        if s.choices and values[name] not in s.choices:
            raise ConfigError(
                f"{name}: expected one of {', '.join(s.choices)}, got {values[name]!r}"
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
    if values["max_steps"] is None and values["max_epochs"] is None and not values["max_time"]:
        raise ConfigError("max_steps: set max_steps, max_epochs or max_time")
    exts = values["data_extensions"]
    if isinstance(exts, str):
        exts = [e.strip() for e in exts.split(",") if e.strip()]
    if not isinstance(exts, list) or not exts or not all(isinstance(e, str) for e in exts):
        raise ConfigError("data_extensions: expected a list of file endings such as ['.txt']")
    values["data_extensions"] = [e if e.startswith(".") else "." + e for e in exts]
    for name in ("data", "init_from"):
        if values[name] is not None and not isinstance(values[name], str):
            raise ConfigError(f"{name}: expected a path, got {values[name]!r}")
        if values[name] == "":
            values[name] = None
    _check_arch(values)
    if values["max_time"] is not None:
        values["max_time"] = format_duration(parse_duration(values["max_time"]))
    if values["lora_rank"] == 0 and values["lora_alpha"] is not None:
        raise ConfigError("lora_alpha: set only with lora_rank > 0 (rank 0 is full fine-tuning)")
    if (values["tokenizer"] == "model") != (values["init_from"] is not None):
        raise ConfigError(
            "tokenizer: 'model' is the pretrained model's own tokenizer and goes with init_from "
            "alone; a pretrained model cannot use bytes or bpe"
        )
    return TrainConfig(**values)


# A new model's architecture fields: for a pretrained start its own config.json decides them.
PRETRAINED_SHAPE = ("arch", "n_kv_heads", "qk_norm")


def _check_arch(values: dict) -> None:
    heads, kv = values["n_heads"], values["n_kv_heads"]
    if kv is not None and heads % kv:
        raise ConfigError(f"n_kv_heads: {kv} must divide n_heads ({heads})")
    if values["arch"] == "gpt2" and values["init_from"] is None:
        if values["qk_norm"]:
            raise ConfigError("qk_norm: needs arch llama (GPT-2 has no q/k norms)")
        if kv not in (None, heads):
            raise ConfigError("n_kv_heads: needs arch llama (GPT-2 has no grouped-query attention)")
    if values["optimizer"] == "muon" and values["lora_rank"]:
        raise ConfigError("optimizer: muon trains whole weight matrices; LoRA uses adamw")


DURATION_UNITS = {"h": 3600, "m": 60, "s": 1}
DURATION_HELP = "a duration such as 90s, 45m, 2h or 1h30m"


def parse_duration(text) -> float:
    """Seconds in '1h30m', '45m', '90s', '2.5h'; ConfigError naming max_time otherwise."""
    rest, total = str(text).strip().lower().replace(" ", ""), 0.0
    if isinstance(text, bool) or not isinstance(text, str) or not rest:
        raise ConfigError(f"max_time: expected {DURATION_HELP}, got {text!r}")
    for unit in DURATION_UNITS:
        number, sep, tail = rest.partition(unit)
        if not sep:
            continue
        try:
            total += float(number) * DURATION_UNITS[unit]
        except ValueError:
            raise ConfigError(f"max_time: expected {DURATION_HELP}, got {text!r}") from None
        rest = tail
    if rest or total <= 0:
        raise ConfigError(f"max_time: expected {DURATION_HELP}, got {text!r}")
    return total


def format_duration(seconds: float) -> str:
    """The canonical spelling: 5400 -> '1h30m', 90 -> '1m30s'."""
    out, left = "", round(seconds, 3)
    for unit, size in DURATION_UNITS.items():
        if left >= size or (unit == "s" and left):
            n = left // size if unit != "s" else left
            out += f"{n:g}{unit}"
            left -= n * size
    return out


def _from_v2(d: dict) -> dict:
    """Version 2 had no architecture, optimizer or schedule choice: nanoGPT's GPT-2 model,
    AdamW, cosine decay, peak lr 1e-3 unless set."""
    return {"arch": "gpt2", "optimizer": "adamw", "schedule": "cosine", "lr": 1e-3, **d}


def _from_v1(d: dict) -> dict:
    """Version 1 (no config_version key) had no betas or bias fields: it trained with
    biases and betas (0.9, 0.95). Spelled out here so a later default cannot change it."""
    return {"bias": True, "beta1": 0.9, "beta2": 0.95, **d}


# version N -> a function turning an N mapping into an N+1 mapping (renames go here too)
MIGRATIONS = {1: _from_v1, 2: _from_v2}


def migrate(d: dict, source: str = "config") -> dict:
    """A saved mapping (checkpoint, run config, preset, settings) brought to CONFIG_VERSION."""
    d = dict(d)
    version = d.pop("config_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ConfigError(
            f"{source}: config_version: expected a whole number >= 1, got {version!r}"
        )
    if version > CONFIG_VERSION:
        raise ConfigError(
            f"{source}: config_version {version} is newer than this TrainDeck understands "
            f"({CONFIG_VERSION}); update TrainDeck"
        )
    for v in range(version, CONFIG_VERSION):
        d = MIGRATIONS[v](d)
    return d


def from_dict(d: dict, base: TrainConfig | None = None, source: str = "config") -> TrainConfig:
    """Fill a config from a mapping; unknown keys are an error naming them and the source."""
    if not isinstance(d, dict):
        raise ConfigError(f"{source}: expected a mapping of field: value")
    d = migrate(d, source)
    unknown = sorted(set(d) - set(SPECS))
    if unknown:
        raise ConfigError(
            f"{source}: unknown field {unknown[0]!r}; allowed fields: {', '.join(sorted(SPECS))}"
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
        if f.name == "vocab_size" and saved.tokenizer == requested.tokenizer != "bpe":
            continue  # bytes have 256 tokens, a pretrained model its own, whatever it says
        if f.name in PRETRAINED_SHAPE and saved.init_from and requested.init_from:
            continue  # the base model's shape decides (and a v2 config says gpt2 for any)
        change = f"{f.name} {old!r} -> {new!r}"
        if f.name in ARCH_FIELDS:
            refused.append(f"{change} (architecture)")
        elif f.name in STREAM_FIELDS:
            refused.append(f"{change} (data stream)")
        elif f.name in STATE_FIELDS:
            refused.append(f"{change} (optimizer state)")
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
