"""How a config field is declared: its Spec (help, form label and group, range, resume rules,
CLI flag) carried in the dataclass field's metadata by spec(), and the form's group names.
core.config.fields and each method's declaration (core.config.methods) declare with it."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    placeholder: str = ""  # a text widget's hint while empty
    repeat: bool = False  # the flag may be given again, each adding a value (--data, --reward)


def spec(default, help: str, **kw):
    """A dataclass field carrying its Spec; a list default is copied per instance."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"spec": Spec(help, **kw)})
    return field(default=default, metadata={"spec": Spec(help, **kw)})


MODEL, BATCH, EXECUTION, INTERVALS, DATA, ADVANCED = (
    "Model",
    "Batch and schedule",
    "Execution",
    "Intervals (steps)",
    "Data",
    "Advanced",
)
