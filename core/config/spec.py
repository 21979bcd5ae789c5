"""TrainConfig: the one validated object a run is described by.

Presets, the GUI form and CLI flags only fill it in; `validate` names the field and the
allowed range in every message.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, fields

from core.config import methods
from core.config.declare import Spec
from core.config.fields import (
    DataFields,
    ExecutionFields,
    IntervalFields,
    ModelFields,
    ReadingFields,
    ScheduleFields,
)
from core.config.methods.grpo import BUILTIN_REWARDS as BUILTIN_REWARDS  # where rewards look
from core.config.methods.grpo import reward_weights as reward_weights
from core.config.methods.grpo import split_reward as split_reward
from core.errors import ConfigError

CONFIG_VERSION = (
    4  # bump with a MIGRATIONS entry whenever a field is renamed or its meaning changes
)


@dataclass
class TrainConfig(
    IntervalFields,
    ReadingFields,
    *reversed(methods.field_classes()),
    DataFields,
    ExecutionFields,
    ScheduleFields,
    ModelFields,
):
    """Every setting of a run (fields in core.config.fields and each method's own in
    core.config.methods, in the order of the bases from the last: model, schedule, execution,
    data, the methods' in registry order, reading, intervals)."""

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
        """Tokens through the model a step; a DPO pair is two sequences (chosen, rejected),
        a GRPO prompt num_generations (its completions)."""
        rows = methods.of(self).rows_per_example(self)
        return self.batch_size * self.grad_accum * self.seq_len * rows


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


def check_value(name: str, value):
    """One field's value on its own (type, range, choices), coerced; ConfigError naming it."""
    value = _coerce(name, value)
    if SPECS[name].choices and value not in SPECS[name].choices:
        raise ConfigError(
            f"{name}: expected one of {', '.join(SPECS[name].choices)}, got {value!r}"
        )
    return value


def _coerce(name: str, value):
    """Turn YAML/CLI/GUI values into the field's type, or raise naming the field."""
    if name in BOOL_FIELDS:
        if isinstance(value, bool) or (value is None and SPECS[name].optional):
            return value
        raise ConfigError(f"{name}: expected true or false, got {value!r}", field=name)
    if name in LIMITS:
        kind, low, high, _ = LIMITS[name]
        if value is None and SPECS[name].optional:
            return None
        if isinstance(value, bool) or value is None:
            raise ConfigError(f"{name}: expected {describe_limit(name)}, got {value!r}", field=name)
        try:
            number = kind(value)
        except (TypeError, ValueError):
            raise ConfigError(
                f"{name}: expected {describe_limit(name)}, got {value!r}", field=name
            ) from None
        if kind is int and isinstance(value, float) and value != number:
            raise ConfigError(f"{name}: expected {describe_limit(name)}, got {value!r}", field=name)
        if (low is not None and number < low) or (high is not None and number > high):
            raise ConfigError(f"{name}: expected {describe_limit(name)}, got {value!r}", field=name)
        return number
    return value


def _devices(text) -> str:
    """--devices: two or more of cpu / cuda:N, comma-separated; "" (or None): one device.
    cpu may repeat (it stands in for cards in tests) but not mix with cards; a card may not
    repeat."""
    if not text:
        return ""
    if isinstance(text, list | tuple):
        text = ",".join(str(t) for t in text)
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    for name in names:
        if name != "cpu" and not (name.startswith("cuda:") and name[5:].isdigit()):
            raise ConfigError(
                f"devices: expected cuda:N (or cpu) names separated by commas, got {name!r}",
                field="devices",
            )
    cards = [n for n in names if n != "cpu"]
    if cards and len(cards) < len(names):  # a card's kernels (Liger, Triton) on CPU tensors
        raise ConfigError(
            f"devices: cards only (cuda:0,cuda:1), or cpu,cpu standing in for them; got {text!r}",
            field="devices",
        )
    if len(names) < 2 or len(set(cards)) < len(cards):
        raise ConfigError(
            f"devices: a layer split needs two or more different devices, got {text!r}; "
            "for one device use --device",
            field="devices",
        )
    return ",".join(names)


def validate(cfg: TrainConfig) -> TrainConfig:
    """Check every field; return a new config with values coerced to their types."""
    values = {}
    for f in fields(cfg):
        values[f.name] = _coerce(f.name, getattr(cfg, f.name))
    for name, s in SPECS.items():
        if s.choices and values[name] not in s.choices:
            raise ConfigError(
                f"{name}: expected one of {', '.join(s.choices)}, got {values[name]!r}", field=name
            )
    device = values["device"]
    if not isinstance(device, str) or not (
        device in ("auto", "cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit())
    ):
        raise ConfigError(
            f"device: expected auto, cpu, cuda or cuda:N, got {device!r}", field="device"
        )
    values["devices"] = _devices(values["devices"])
    if values["hidden_dim"] % values["n_heads"]:
        raise ConfigError(
            f"hidden_dim: {values['hidden_dim']} must be divisible by n_heads "
            f"({values['n_heads']})",
            field="hidden_dim",
        )
    if values["max_steps"] is None and values["max_epochs"] is None and not values["max_time"]:
        raise ConfigError("max_steps: set max_steps, max_epochs or max_time", field="max_steps")
    exts = values["data_extensions"]
    if isinstance(exts, str):
        exts = [e.strip() for e in exts.split(",") if e.strip()]
    if not isinstance(exts, list) or not exts or not all(isinstance(e, str) for e in exts):
        raise ConfigError(
            "data_extensions: expected a list of file endings such as ['.txt']",
            field="data_extensions",
        )
    values["data_extensions"] = [e if e.startswith(".") else "." + e for e in exts]
    for name in ("data", "init_from", "eval_data"):
        if values[name] is not None and not isinstance(values[name], str):
            raise ConfigError(f"{name}: expected a path, got {values[name]!r}", field=name)
        if values[name] == "":
            values[name] = None
    for name in [n for n in SPECS if n.endswith("_column")]:  # a data table's column names
        if values[name] is not None and not isinstance(values[name], str):
            raise ConfigError(f"{name}: expected a column name, got {values[name]!r}", field=name)
        values[name] = (values[name] or "").strip() or None
    _check_arch(values)
    _check_mix(values)
    if values["max_time"] is not None:
        values["max_time"] = format_duration(parse_duration(values["max_time"]))
    _check_base_bits(values)
    _check_method(values)
    _check_experts(values)
    _check_vision(values)
    if values["offload_checkpoints"] and not values["grad_checkpointing"]:
        raise ConfigError(
            "offload_checkpoints: offloads gradient checkpointing's saved inputs; turn on "
            "grad_checkpointing too",
            field="offload_checkpoints",
        )
    if values["lora_rank"] == 0 and values["lora_alpha"] is not None:
        raise ConfigError(
            "lora_alpha: set only with lora_rank > 0 (rank 0 is full fine-tuning)",
            field="lora_alpha",
        )
    if values["thinking"] != "default" and values["init_from"] is None:
        raise ConfigError(
            f"thinking: {values['thinking']} needs a pretrained model whose chat template has a "
            "thinking switch (init_from); a new model's default (ChatML) template has none",
            field="thinking",
        )
    if (values["tokenizer"] == "model") != (values["init_from"] is not None):
        raise ConfigError(
            "tokenizer: 'model' is the pretrained model's own tokenizer and goes with init_from "
            "alone; a pretrained model cannot use bytes or bpe",
            field="tokenizer",
        )
    return TrainConfig(**values)


# A new model's architecture fields: for a pretrained start its own config.json decides them.
PRETRAINED_SHAPE = ("arch", "n_kv_heads", "qk_norm")


def _check_base_bits(values: dict) -> None:
    bits = values["base_bits"]
    if bits in ("4", "8") and values["init_from"] is None:
        raise ConfigError(
            f"base_bits: a {bits}-bit base needs a pretrained start (init_from)", field="base_bits"
        )
    if bits in ("4", "8") and not values["lora_rank"]:
        raise ConfigError(
            f"base_bits: a {bits}-bit base trains only with LoRA (lora_rank > 0); full "
            "fine-tuning needs base_bits 16, 32 or auto",
            field="base_bits",
        )


def _check_experts(values: dict) -> None:
    """The MoE switches need experts, which only a pretrained start has (the model's own
    check, core.weights.loader.apply_pretrained, says when it has none)."""
    if values["lora_experts"] and not values["lora_rank"]:
        raise ConfigError(
            "lora_experts: adapters on the experts need LoRA (lora_rank > 0)",
            field="lora_experts",
        )
    for name in ("lora_experts", "train_router"):
        if values[name] and values["init_from"] is None:
            raise ConfigError(
                f"{name}: needs a pretrained mixture-of-experts model (init_from); a new "
                "model has no experts",
                field=name,
            )


def _check_vision(values: dict) -> None:
    """The tower trains only where there is one: a pretrained vision model's."""
    if values.get("train_vision") and values["init_from"] is None:
        raise ConfigError(
            "train_vision: needs a pretrained vision model (init_from); a new model has no "
            "vision tower",
            field="train_vision",
        )


def _check_method(values: dict) -> None:
    """Every method tidies its own fields; the chosen one checks them."""
    for method in methods.METHODS.values():
        method.tidy(values)
    methods.get(values["method"]).check(values)


def _check_mix(values: dict) -> None:
    """extra_data as a list of paths; data_weights as text that parses, one per source."""
    extra = values["extra_data"]
    extra = [] if extra is None else [extra] if isinstance(extra, str) else extra
    if not isinstance(extra, list) or not all(isinstance(e, str) and e for e in extra):
        raise ConfigError(
            f"extra_data: expected a list of paths, got {extra!r}", field="extra_data"
        )
    values["extra_data"] = list(extra)
    weights = values["data_weights"]
    if isinstance(weights, (list, tuple)):  # a YAML list
        weights = ",".join(str(w) for w in weights)
    if isinstance(weights, (int, float)) and not isinstance(weights, bool):
        weights = str(weights)
    if weights is not None and not isinstance(weights, str):
        raise ConfigError(
            f"data_weights: expected numbers such as 0.8,0.2, got {weights!r}", field="data_weights"
        )
    values["data_weights"] = weights or None
    if weights:
        parse_weights(weights, 1 + len(extra))


def parse_weights(text: str, count: int) -> list[float]:
    """The numbers of a data_weights text such as '0.8,0.2', one per data source; a one-line
    ConfigError naming data_weights when they do not parse, are negative, all zero, or their
    count is not the sources' count."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        numbers = [float(p) for p in parts]
    except ValueError:
        raise ConfigError(
            f"data_weights: expected numbers separated by commas such as 0.8,0.2, got {text!r}",
            field="data_weights",
        ) from None
    if any(not math.isfinite(n) or n < 0 for n in numbers):
        raise ConfigError(
            f"data_weights: weights must be 0 or more, got {text!r}", field="data_weights"
        )
    if not any(numbers):
        raise ConfigError(
            f"data_weights: at least one weight must be above 0, got {text!r}", field="data_weights"
        )
    if len(numbers) != count:
        raise ConfigError(
            f"data_weights: {len(numbers)} weight(s) for {count} data source(s); give one "
            "per --data, in the same order",
            field="data_weights",
        )
    return numbers


def _check_arch(values: dict) -> None:
    heads, kv = values["n_heads"], values["n_kv_heads"]
    if kv is not None and heads % kv:
        raise ConfigError(f"n_kv_heads: {kv} must divide n_heads ({heads})", field="n_kv_heads")
    if values["arch"] == "gpt2" and values["init_from"] is None:
        if values["qk_norm"]:
            raise ConfigError("qk_norm: needs arch llama (GPT-2 has no q/k norms)", field="qk_norm")
        if kv not in (None, heads):
            raise ConfigError(
                "n_kv_heads: needs arch llama (GPT-2 has no grouped-query attention)",
                field="n_kv_heads",
            )
    if values["optimizer"] == "muon" and values["lora_rank"]:
        raise ConfigError(
            "optimizer: muon trains whole weight matrices; LoRA uses adamw", field="optimizer"
        )


DURATION_UNITS = {"h": 3600, "m": 60, "s": 1}
DURATION_HELP = "a duration such as 90s, 45m, 2h or 1h30m"


def parse_duration(text) -> float:
    """Seconds in '1h30m', '45m', '90s', '2.5h'; ConfigError naming max_time otherwise."""
    rest, total = str(text).strip().lower().replace(" ", ""), 0.0
    if isinstance(text, bool) or not isinstance(text, str) or not rest:
        raise ConfigError(f"max_time: expected {DURATION_HELP}, got {text!r}", field="max_time")
    for unit in DURATION_UNITS:
        number, sep, tail = rest.partition(unit)
        if not sep:
            continue
        try:
            total += float(number) * DURATION_UNITS[unit]
        except ValueError:
            raise ConfigError(
                f"max_time: expected {DURATION_HELP}, got {text!r}", field="max_time"
            ) from None
        rest = tail
    if rest or total <= 0:
        raise ConfigError(f"max_time: expected {DURATION_HELP}, got {text!r}", field="max_time")
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


def _from_v3(d: dict) -> dict:
    """Version 3's compile was true or false, false by default; version 4's default (None)
    compiles on a CUDA GPU only. A saved false was almost always that default: it becomes
    the new one, so remembered settings and old presets compile on a GPU too."""
    if d.get("compile") is False:
        d = {**d, "compile": None}
    return d


def _from_v2(d: dict) -> dict:
    """Version 2 had no architecture, optimizer or schedule choice: nanoGPT's GPT-2 model,
    AdamW, cosine decay, peak lr 1e-3 unless set."""
    return {"arch": "gpt2", "optimizer": "adamw", "schedule": "cosine", "lr": 1e-3, **d}


def _from_v1(d: dict) -> dict:
    """Version 1 (no config_version key) had no betas or bias fields: it trained with
    biases and betas (0.9, 0.95). Spelled out here so a later default cannot change it."""
    return {"bias": True, "beta1": 0.9, "beta2": 0.95, **d}


# version N -> a function turning an N mapping into an N+1 mapping (renames go here too)
MIGRATIONS = {1: _from_v1, 2: _from_v2, 3: _from_v3}


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


def for_processes(
    cfg: TrainConfig, saved: int, processes: int, launched: bool, changes: dict
) -> TrainConfig:
    """A resumed config on another number of processes than saved it: the same sequences a
    step (batch_size x grad_accum x processes), by grad_accum where it divides, else by
    batch_size; and without torchrun (launched false) not sharded, unless asked for; a
    layer split (devices) given up where --device or torchrun says otherwise.
    What the user set on the command line (changes) is theirs."""
    if cfg.shard and not launched and "shard" not in changes:
        cfg = dataclasses.replace(cfg, shard=False)
    # A layer split's checkpoint holds whole tensors: --device (or torchrun) resumes it on
    # one device per process, unsplit.
    if cfg.devices and "devices" not in changes and (launched or "device" in changes):
        cfg = dataclasses.replace(cfg, devices="")
    if saved == processes or {"batch_size", "grad_accum"} & set(changes):
        return cfg
    per_step = cfg.batch_size * cfg.grad_accum * saved
    for batch, accum in (
        (cfg.batch_size, per_step // (cfg.batch_size * processes)),
        (per_step // (cfg.grad_accum * processes), cfg.grad_accum),
    ):
        if accum >= 1 and batch >= 1 and batch * accum * processes == per_step:
            return dataclasses.replace(cfg, batch_size=batch, grad_accum=accum)
    raise ConfigError(
        f"batch_size: the run trained on {per_step} sequences a step ({saved} processes), which "
        f"{processes} processes cannot share evenly; resume on a number of processes that "
        f"divides {per_step}, or set --batch-size and --grad-accum (the run changes)",
        field="batch_size",
    )


def compare_for_resume(
    saved: TrainConfig, requested: TrainConfig, saved_processes: int = 1, processes: int = 1
) -> tuple[list[str], list[str]]:
    """Return (refused, allowed) human-readable differences between two configs; the
    effective batch counts each one's processes (torchrun)."""
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
        if f.name == "base_bits":
            refused.append(f"{change} (the base model's precision the adapters trained on)")
        elif f.name in ARCH_FIELDS:
            refused.append(f"{change} (architecture)")
        elif f.name in STREAM_FIELDS:
            refused.append(f"{change} (data stream)")
        elif f.name in STATE_FIELDS:
            refused.append(f"{change} (optimizer state)")
        elif f.name in ("batch_size", "grad_accum"):
            continue  # judged together below
        else:
            allowed.append(change)
    old_eff = saved.batch_size * saved.grad_accum * saved_processes
    new_eff = requested.batch_size * requested.grad_accum * processes
    if (saved.batch_size, saved.grad_accum, saved_processes) != (
        requested.batch_size,
        requested.grad_accum,
        processes,
    ):
        change = (
            f"batch_size x grad_accum {saved.batch_size}x{saved.grad_accum} -> "
            f"{requested.batch_size}x{requested.grad_accum}"
        )
        if saved_processes != processes:
            change += f", processes {saved_processes} -> {processes}"
        if old_eff == new_eff:
            allowed.append(change + " (same effective batch)")
        else:
            refused.append(change + " (effective batch changes)")
    return refused, allowed
