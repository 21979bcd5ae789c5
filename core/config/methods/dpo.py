"""DPO's declaration: preference pairs, its beta and label smoothing, its checks, a tenth of a
fine-tune's learning rate, and its preference plot (TRL's signal names). Its runtime:
core/training/dpo.py."""

from __future__ import annotations

from dataclasses import dataclass

from core.config.declare import ADVANCED, DATA, spec
from core.config.methods.base import PAIRS, Curve, Method, Plot
from core.errors import ConfigError

NAME = "dpo"
# Peers ship 5e-7..5e-6 for full DPO against 1e-5..2e-5 for SFT: its gradients push on two
# answers a pair with no limit.
LR_FACTOR = 0.1


@dataclass
class DPOFields:
    """DPO's settings."""

    dpo_beta: float = spec(
        0.1,
        "dpo: how far the model may move from the reference (higher: closer to it)",
        label="DPO beta",
        group=DATA,
        low=1e-4,
        high=100.0,
    )
    dpo_label_smoothing: float = spec(
        0.0,
        "dpo: the share of pairs assumed mislabelled (conservative DPO; 0: plain DPO)",
        label="DPO label smoothing",
        group=ADVANCED,
        low=0.0,
        high=0.49,
    )


def check(values: dict) -> None:
    if values["init_from"] is None:
        raise ConfigError(
            f"method: {NAME} tunes a model that can already answer; give init_from (a "
            "pretrained model or a finished run)",
            field="method",
        )
    if values["data_format"] in ("text", "chat"):
        raise ConfigError(
            f"method: {NAME} learns from preference pairs, not data_format "
            f"{values['data_format']}; use data_format preference or auto",
            field="method",
        )


def rows_per_example(cfg) -> int:
    return 2  # a pair's two sequences


PLOT = "preference"
# rewards are beta x how far the model moved from the reference
CURVES = (
    Curve("rewards/chosen", PLOT, "chosen reward", "#2ca02c", 1.0),
    Curve("rewards/rejected", PLOT, "rejected reward", "#d62728", 1.0),
    Curve("rewards/margins", PLOT, "margin", "#1f77b4", 1.0),
    Curve(
        "eval_rewards/margins",
        PLOT,
        "validation margin",
        "#0b3d91",
        2.0,
        symbol="o",
        antialias=True,
        evaluation=True,
    ),
    Curve("rewards/accuracies", PLOT, "accuracy (right axis)", "#9467bd", 1.0, right_axis=True),
    Curve(
        "eval_rewards/accuracies",
        PLOT,
        "validation accuracy (right axis)",
        "#ff7f0e",
        2.0,
        symbol="s",
        right_axis=True,
        antialias=True,
        evaluation=True,
    ),
)

METHOD = Method(
    name=NAME,
    help="preference tuning (Direct Preference Optimization) on pairs of a chosen and a "
    "rejected answer, from a pretrained model or a finished run (init_from)",
    runtime="core.training.dpo:DPO",
    data=PAIRS,
    fields=DPOFields,
    check=check,
    rows_per_example=rows_per_example,
    lr_factor=LR_FACTOR,
    plot=Plot(
        PLOT, "Preference (DPO)", "reward", "accuracy", ("rewards/margins", "eval_rewards/margins")
    ),
    curves=CURVES,
)
