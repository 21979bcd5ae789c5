"""Expert load of a mixture-of-experts run, read from its step records (metrics.jsonl and the
window's step events): the latest layer x expert load strip, the experts that got no tokens,
and the routing curves the window and Compare draw. Dense runs carry none of these keys."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from core.config.methods.base import Curve, Plot

LOAD = "moe/expert_load"  # per MoE layer, each expert's share of the step's assignments
LAYERS = "moe/layers"  # the MoE layers' indices, in LOAD's order
ENTROPY = "moe/router_entropy"
AUX = "moe/aux_loss"

PLOT = "routing"
ROUTING = Plot(PLOT, "Routing (MoE)", "nats", "aux loss", shown_by=(LOAD, ENTROPY, AUX))
CURVES = (
    Curve(ENTROPY, PLOT, "router entropy", "#1f77b4", 1.0),
    Curve(AUX, PLOT, "aux loss (right axis)", "#d62728", 1.0, right_axis=True),
)


@dataclass(frozen=True)
class ExpertLoad:
    """One step's load: `shares[i][e]` is expert e's share of layer `layers[i]`'s
    token-expert assignments (each row sums to 1)."""

    step: int
    layers: tuple[int, ...]
    shares: tuple[tuple[float, ...], ...]

    @property
    def n_experts(self) -> int:
        return max((len(row) for row in self.shares), default=0)

    def idle(self) -> dict[int, list[int]]:
        """{layer: experts that got no token at this step}, layers with none left out. A share
        is a count over a total, so exactly 0 means no token."""
        out = {}
        for layer, row in zip(self.layers, self.shares, strict=True):
            idle = [e for e, share in enumerate(row) if share == 0]
            if idle:
                out[layer] = idle
        return out

    def idle_line(self) -> str:
        """'no idle experts', '2 experts idle in layer 3', '5 experts idle in 3 layers'."""
        idle = self.idle()
        count = sum(len(v) for v in idle.values())
        if not count:
            return "no idle experts"
        noun = "expert" if count == 1 else "experts"
        if len(idle) == 1:
            return f"{count} {noun} idle in layer {next(iter(idle))}"
        return f"{count} {noun} idle in {len(idle)} layers"


def from_record(record: dict) -> ExpertLoad | None:
    """The load a step record carries, or None (a dense run, or a malformed record)."""
    shares = record.get(LOAD)
    if not isinstance(shares, list) or not shares:
        return None
    if not all(isinstance(row, list) and row for row in shares):
        return None
    layers = record.get(LAYERS)
    if not isinstance(layers, list) or len(layers) != len(shares):
        layers = list(range(len(shares)))  # unnamed layers: their order
    try:
        rows = tuple(tuple(float(v) for v in row) for row in shares)
        return ExpertLoad(int(record.get("step", 0)), tuple(int(i) for i in layers), rows)
    except (TypeError, ValueError):
        return None


def latest(records: list[dict]) -> ExpertLoad | None:
    """The last record's load that has one (records oldest first)."""
    for record in reversed(records):
        load = from_record(record)
        if load is not None:
            return load
    return None


def run_load(path: str | Path) -> ExpertLoad | None:
    """A run's final load strip from its metrics.jsonl (None: a dense run)."""
    from core.runs.folder import RunFolder, read_metrics  # torch: not for the web monitor

    train, _ = read_metrics(RunFolder(Path(path)).metrics_file)
    return latest(train)
