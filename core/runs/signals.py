"""The signals a run's step and evaluation records carry, and the plots that draw them: one
list for every front end that plots a run (the window's plots, gui/plots.py, and the web
monitor's page, core/monitor). Each method's own curves and a mixture of experts' routing
come from their declarations (core.config.methods, core.runs.experts)."""

from __future__ import annotations

from core.config import methods
from core.config.methods.base import Curve
from core.runs import experts

CURVES: list[Curve] = [
    Curve("loss", "loss", "train loss", "#1f77b4", 1.0),
    Curve("val_loss", "loss", "validation loss", "#d62728", 2.0, symbol="o", antialias=True),
    Curve(
        "val_bpb",
        "loss",
        "validation bits/byte (right axis)",
        "#9467bd",
        1.5,
        symbol="t",
        right_axis=True,
        antialias=True,
    ),
    Curve(
        "eval_data_loss",
        "loss",
        "second validation set",
        "#ff7f0e",
        2.0,
        symbol="s",
        antialias=True,
    ),
    Curve("mem_allocated_mb", "memory", "allocated", "#1f77b4"),
    Curve("mem_reserved_mb", "memory", "reserved", "#ff7f0e"),
    Curve("mem_peak_mb", "memory", "peak", "#d62728"),
    Curve("nvml_used_mb", "memory", "device used (NVML)", "#2ca02c"),
    Curve("rss_mb", "memory", "process RSS", "#9467bd"),
    Curve("tokens_per_s", "throughput", "tokens/s", "#2ca02c"),
    Curve("lr", "lr", "learning rate", "#8c564b", antialias=True),
    Curve("gpu_util", "gpu", "utilization %", "#1f77b4"),
    Curve("gpu_temp_c", "gpu", "temperature °C", "#d62728"),
    Curve("gpu_power_w", "gpu", "power W (right axis)", "#ff7f0e", right_axis=True),
]
# each method's own curves, in its own plot (core.config.methods: DPO's preference, GRPO's
# rewards), after the common ones
CURVES += list(methods.curves())
CURVES += list(experts.CURVES)  # a mixture of experts' routing, beside its Experts strip

# name: (title, unit of the left axis)
PLOTS = {
    "loss": ("Loss", "loss"),
    "memory": ("VRAM / RAM", "MiB"),
    "throughput": ("Throughput", "tokens/s"),
    "lr": ("Learning rate", "lr"),
    "gpu": ("GPU (NVML)", "% / °C"),
    **{p.name: (p.title, p.unit) for p in methods.plots()},
    experts.PLOT: (experts.ROUTING.title, experts.ROUTING.unit),
}
# the right axes' labels (a plot without one has none)
RIGHT_LABELS = {
    "loss": "bits/byte",
    "gpu": "power W",
    **{p.name: p.right_label for p in methods.plots()},
    experts.PLOT: experts.ROUTING.right_label,
}
# Read from evaluation records; every other curve from the step records.
EVAL_KEYS = (
    "val_loss",
    "val_bpb",
    "eval_data_loss",
    *(c.key for c in methods.curves() if c.evaluation),
)
