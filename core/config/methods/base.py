"""What a training method declares about itself, as plain data (no torch): its config fields and
checks, what data it trains on, its learning-rate factor, its plot and curves, the measure
Compare draws for its runs, and what the resume dialog and the status line show. Its runtime,
the objective that trains (core.training), is named by `runtime` and imported at setup."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# What a method trains on (the data layer picks its reading by this, never by the name):
WINDOWS = "windows"  # token windows of text or chat examples
PAIRS = "pairs"  # preference pairs (prompt, chosen, rejected)
PROMPTS = "prompts"  # prompts to sample completions of (no token cache)


@dataclass(frozen=True)
class Curve:
    """One curve of the window's plots: a record field drawn in a plot."""

    key: str  # the record field
    plot: str  # which plot it is drawn in
    label: str
    color: str
    width: float = 1.5
    symbol: str | None = None
    right_axis: bool = False  # drawn against the plot's second (right) y axis
    antialias: bool = False
    evaluation: bool = False  # read from evaluation records, not the training steps'


@dataclass(frozen=True)
class Plot:
    """A method's own plot, placed beside the loss once a run reports one of `shown_by`."""

    name: str
    title: str
    unit: str
    right_label: str  # its right axis
    shown_by: tuple[str, ...]


@dataclass(frozen=True)
class Measure:
    """A curve Compare can draw instead of the loss; runs that all have it draw it first."""

    name: str  # as the measure box lists it
    train_key: str
    eval_key: str
    help: str  # the measure box's tooltip line
    higher_is_better: bool = True


@dataclass(frozen=True)
class Best:
    """How the resume dialog shows the best evaluation a checkpoint records."""

    label: str
    key: str  # the checkpoint summary's field
    negated_val_loss: bool = False  # older checkpoints saved minus it as val_loss


def _nothing(values: dict) -> None:
    """No checks of its own."""


def _one(cfg) -> int:
    return 1


@dataclass(frozen=True)
class Method:
    name: str
    help: str  # what it does, for the method field's help (after "name: ")
    runtime: str  # "module:Class" of its objective (core.training), imported at setup
    data: str  # WINDOWS, PAIRS or PROMPTS
    fields: type | None = None  # a dataclass of its own config fields (core.config.declare)
    form_group: str | None = None  # a form box shown for this method alone
    tidy: Callable[[dict], None] = _nothing  # its fields' values normalized, whatever the method
    check: Callable[[dict], None] = _nothing  # its checks when chosen (ConfigError with field)
    rows_per_example: Callable[..., int] = _one  # sequences through the model per batch element
    lr_factor: float = 1.0  # a fine-tune's default learning rate times this
    plot: Plot | None = None
    curves: tuple[Curve, ...] = ()
    measure: Measure | None = None
    best: Best | None = None
    status: tuple[tuple[str, str], ...] = ()  # (label, evaluation field) for the status line
    sampling_row: str = ""  # the memory estimate's row for what its sampling holds (GRPO)
