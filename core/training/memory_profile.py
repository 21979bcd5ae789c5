"""Where one training step's memory goes, by component: the Python and torch baseline, the
weights, LoRA and optimizer, saved activations, the recomputed layer, attention, MLP
intermediates, logits and loss, activation gradients in backward, and the allocator's slack.

On the CPU (`profile_step`): torch's profiler with profile_memory records every allocation and
free (address, bytes, time) and the ranges they happen in; the tensors live at the step's peak
are attributed by the innermost labelled range (the model's attention, MLP and blocks, labelled
here by hooks) or, in backward, by the forward op their autograd node belongs to. On CUDA
(`attribute_snapshot`): the same components from `torch.cuda.memory._snapshot()` after
`_record_memory_history`, each block by the Python frames that allocated it.
"""

from __future__ import annotations

import bisect
import json
import os
import tempfile
from dataclasses import dataclass, field

import torch

from core.models.labels import LABEL, labelled
from core.models.quant import NF4Experts

MB = 1024**2
BASELINE = "Python and torch"
WEIGHTS = "weights"
TRAINABLE = "LoRA and optimizer"
SAVED = "saved activations"
RECOMPUTE = "recomputed layer"
ATTENTION = "attention"
MLP = "MLP intermediates"
LOSS = "logits and loss"
GRADS = "activation gradients"
SLACK = "allocator slack"
VISION = "vision tower"  # a vision model's tower activations (the estimate's row)
ORDER = (BASELINE, WEIGHTS, TRAINABLE, SAVED, RECOMPUTE, ATTENTION, MLP, LOSS, GRADS, SLACK)

PHASES = ("forward", "backward", "optimizer")


@dataclass
class Profile:
    parts: dict[str, float] = field(default_factory=dict)  # bytes by component
    peak_rss: float = 0.0  # the measured peak the parts add up to (bytes; 0: not measured)

    def total(self) -> float:
        return sum(self.parts.values())

    def lines(self) -> list[str]:
        total = self.total() or 1
        rows = [
            f"  {name:<22} {self.parts.get(name, 0) / MB:9,.0f} MB "
            f"{100 * self.parts.get(name, 0) / total:5.1f}%"
            for name in ORDER
            if name in self.parts
        ]
        return [*rows, f"  {'total':<22} {self.total() / MB:9,.0f} MB"]


def classify(scopes: list[str], phase: str) -> str:
    """The component of an allocation made inside these labelled scopes (outermost first) in
    this phase of the step."""
    if phase == "optimizer" or "AccumulateGrad" in scopes:
        return TRAINABLE
    for scope in reversed(scopes):
        if scope == "attention":
            return ATTENTION
        if scope == "mlp":
            return MLP
        if scope == "block":
            return SAVED if phase == "forward" else RECOMPUTE
    return LOSS if phase == "forward" else GRADS


def static_bytes(model, optimizer) -> dict[str, float]:
    """What exists before a step: frozen weights; trainable weights and optimizer states."""
    frozen = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    frozen += sum(m.nbytes() for m in model.modules() if isinstance(m, NF4Experts))
    trained = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    states = sum(
        t.numel() * t.element_size()
        for opt in getattr(optimizer, "all", [optimizer])  # core.training.optim.Optimizers
        for state in opt.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor)
    )
    return {WEIGHTS: frozen, TRAINABLE: trained + states}


def profile_step(model, step) -> tuple[dict[str, float], float]:
    """Run step(phase) once under the profiler: step calls phase("forward"), phase("backward")
    and phase("optimizer") as context managers around its parts. Returns the bytes by component
    live at the step's peak, and that peak as the profiler's own count saw it."""
    from torch.profiler import ProfilerActivity, profile

    def phase(name):
        return torch.autograd.profiler.record_function(LABEL + name)

    with labelled(model), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        step(phase)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        p.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    return attribute_trace(trace["traceEvents"] if isinstance(trace, dict) else trace)


def attribute_trace(events: list[dict]) -> tuple[dict[str, float], float]:
    """Components of the tensors live at the peak of a chrome trace's [memory] events."""
    memory = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    live, at_peak, total, peak, reported = {}, {}, 0, 0, 0
    for e in memory:
        addr, size = e["args"]["Addr"], e["args"]["Bytes"]
        if size > 0:
            live[addr] = (size, e["ts"], e.get("tid"))
            total += size
        elif addr in live:  # frees of blocks from before the profile are not counted
            total -= live.pop(addr)[0]
        reported = max(reported, e["args"].get("Total Allocated", 0))
        if total > peak:
            peak, at_peak = total, dict(live)
    ranges = _ranges(events)
    parts = dict.fromkeys(ORDER[2:-1], 0.0)
    for size, ts, tid in at_peak.values():
        scopes = ranges.scopes(tid, ts)
        phase = next((s for s, _ in reversed(scopes) if s in PHASES), "forward")
        parts[classify(ranges.resolve(scopes), phase)] += size
    return parts, float(reported)


class _Ranges:
    """The labelled ranges and autograd nodes of a trace, and which enclose a moment."""

    def __init__(self, spans: dict, forward_at: dict):
        self.spans = spans  # tid -> sorted [(start, end, name, seq)]
        self.starts = {tid: [s[0] for s in v] for tid, v in spans.items()}
        self.forward_at = forward_at  # sequence number -> (tid, ts) of its forward op

    def scopes(self, tid, ts) -> list:
        spans = self.spans.get(tid, [])
        n = bisect.bisect_right(self.starts.get(tid, []), ts)
        return [(name, seq) for start, end, name, seq in spans[:n] if end >= ts]

    def resolve(self, scopes: list) -> list[str]:
        """Scope names; an autograd node (backward) stands for its forward op's scopes."""
        names = []
        for name, seq in scopes:
            if name.startswith("autograd::engine::evaluate_function"):
                if "AccumulateGrad" in name:
                    names.append("AccumulateGrad")
                elif seq in self.forward_at:  # a block's own ops: activation gradients
                    tid, ts = self.forward_at[seq]
                    names += [n for n, _ in self.scopes(tid, ts) if n in _KINDS[1:]]
            elif name in _KINDS or name in PHASES:
                names.append(name)
        return names


_KINDS = ("block", "attention", "mlp")


def _ranges(events: list[dict]) -> _Ranges:
    spans, forward_at = {}, {}
    for e in events:
        if e.get("ph") != "X":
            continue
        name, args = e.get("name", ""), e.get("args", {})
        seq = args.get("Sequence number")
        if name.startswith(LABEL):
            name = name[len(LABEL) :]
        elif not name.startswith("autograd::engine::evaluate_function"):
            if seq is not None and seq not in forward_at and "Fwd thread id" not in args:
                forward_at[seq] = (e.get("tid"), e["ts"])
            continue
        spans.setdefault(e.get("tid"), []).append((e["ts"], e["ts"] + e["dur"], name, seq))
    for v in spans.values():
        v.sort()
    return _Ranges(spans, forward_at)


# CUDA: what allocated a block, read off its Python frames; the first rule any frame matches.
_FRAMES = (
    ("step", "optim", TRAINABLE),
    ("_scores", "model.py", ATTENTION),
    ("softcapped_attention", "model.py", ATTENTION),
    ("_attend", "model.py", ATTENTION),
    ("inner", "model.py", MLP),
    ("lm_loss", "loss.py", LOSS),
    ("recompute_fn", "checkpoint.py", RECOMPUTE),
    ("unpack_hook", "checkpoint.py", RECOMPUTE),
    ("backward", "", GRADS),
    ("forward", "model.py", SAVED),
)


def frame_component(frames: list[dict]) -> str:
    """The component of a CUDA block allocated under these frames."""
    for name, filename, component in _FRAMES:
        for f in frames:
            if f.get("name") == name and filename in f.get("filename", ""):
                return component
    return WEIGHTS


def attribute_snapshot(snapshot: dict) -> dict[str, float]:
    """Bytes by component of a torch.cuda.memory._snapshot() taken at a step's peak (with
    _record_memory_history(stacks="python") on before the model was made): each allocated
    block by its frames, the segments' unallocated rest as allocator slack."""
    parts = dict.fromkeys(ORDER[1:], 0.0)
    for segment in snapshot.get("segments", []):
        used = 0
        for block in segment.get("blocks", []):
            if block.get("state") != "active_allocated":
                continue
            used += block["size"]
            parts[frame_component(block.get("frames", []))] += block["size"]
        parts[SLACK] += segment["total_size"] - used
    return parts


HISTORY_ENTRIES = 1_000_000  # allocator events kept: a long-context step makes ~10^4-10^5


def profile_cuda_step(step, device: torch.device) -> dict[str, float]:
    """Run step(phase) once with CUDA's allocator history on (stacks="python") and split the
    step's peak by component (attribute_trace_cuda). phase is a no-op here: the frames that
    allocated each block say where it belongs."""
    import contextlib

    memory = torch.cuda.memory
    before = torch.cuda.memory_allocated(device)
    memory._record_memory_history(max_entries=HISTORY_ENTRIES, stacks="python")
    try:
        step(lambda name: contextlib.nullcontext())
        snapshot = memory._snapshot()
    finally:
        memory._record_memory_history(enabled=None)
    return attribute_trace_cuda(snapshot, device.index or 0, before)


def attribute_trace_cuda(snapshot: dict, device: int, before: float) -> dict[str, float]:
    """The blocks live at the peak of a snapshot's device trace (its alloc and free events
    replayed), each by its frames; what was allocated before the step (weights, adapters,
    optimizer state) under weights; the segments' reserve beyond the peak as slack."""
    live, at_peak, total, peak = {}, {}, 0, 0
    for e in snapshot.get("device_traces", [[]])[device]:
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], e.get("frames", []))
            total += e["size"]
        elif e["action"] == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])[0]
        if total > peak:
            peak, at_peak = total, dict(live)
    parts = dict.fromkeys(ORDER[1:], 0.0)
    parts[WEIGHTS] = float(before)
    for size, frames in at_peak.values():
        parts[frame_component(frames)] += size
    reserved = sum(s["total_size"] for s in snapshot.get("segments", []) if s["device"] == device)
    parts[SLACK] = max(0.0, reserved - before - peak)
    return parts
