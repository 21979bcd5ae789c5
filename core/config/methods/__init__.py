"""The training methods' declarations, one module each (sft, dpo, grpo): what config/, data/,
runs/ and gui/ ask about a method (its fields and checks, data kind, plots, Compare's measure,
the resume dialog's best value), as plain data in the config layer, so every layer above can
read it; the objective that trains (core/training/sft.py, dpo.py, grpo.py) is the runtime a
declaration names. Nothing outside these modules and the objectives compares a method's name
(tests/core/test_method_names.py). Imports core.errors and core.config.declare only."""

from __future__ import annotations

import dataclasses

from core.config.methods import dpo, grpo, sft
from core.config.methods.base import Curve, Measure, Method, Plot

# The order is the method field's choices and help, and which plot wins when two could show.
METHODS: dict[str, Method] = {m.name: m for m in (sft.METHOD, dpo.METHOD, grpo.METHOD)}
NAMES = tuple(METHODS)
DEFAULT = NAMES[0]
HELP = "; ".join(f"{m.name}: {m.help}" for m in METHODS.values())


def get(name: str) -> Method:
    """A method by its name; an unknown name (a config not yet validated) reads as the default,
    as a config with no method would."""
    return METHODS.get(name, METHODS[DEFAULT])


def of(cfg) -> Method:
    return get(cfg.method)


def taking(data: str) -> Method:
    """The first method that trains on this kind of data (base.WINDOWS, PAIRS, PROMPTS)."""
    return next(m for m in METHODS.values() if m.data == data)


def owns(cfg, field: str) -> bool:
    """Whether the config's method declares this field (GRPO: reward)."""
    own = of(cfg).fields
    return own is not None and field in {f.name for f in dataclasses.fields(own)}


def field_classes() -> tuple[type, ...]:
    """The methods' own field dataclasses, in their order (TrainConfig joins them)."""
    return tuple(m.fields for m in METHODS.values() if m.fields is not None)


def plots() -> tuple[Plot, ...]:
    return tuple(m.plot for m in METHODS.values() if m.plot is not None)


def curves() -> tuple[Curve, ...]:
    return tuple(c for m in METHODS.values() for c in m.curves)


def measures() -> tuple[Measure, ...]:
    return tuple(m.measure for m in METHODS.values() if m.measure is not None)


def status_fields() -> tuple[tuple[str, str], ...]:
    return tuple(s for m in METHODS.values() for s in m.status)
