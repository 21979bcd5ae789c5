"""VRAM spill: on Windows the NVIDIA driver (the "CUDA - Sysmem Fallback Policy", on by default
since driver 536.40) lets a process allocate past the card's dedicated memory into shared
system memory: no out-of-memory error, but every step several times slower. Seen from here:
NVML's dedicated memory is full (used at or past its total), or torch has reserved more than
the card has. Said once, in the log and the window, with the fit ladder's next rung."""

from __future__ import annotations

import sys

from core.config.spec import TrainConfig

FULL_SHARE = 0.99  # NVML's used/total at which dedicated memory counts as full
PREFIX = "⚠ VRAM spill:"  # the window shows log lines starting with it as a warning


def spilling(memory: dict, windows: bool | None = None) -> bool:
    """A train record's memory fields say the run is past dedicated VRAM."""
    used, total = memory.get("nvml_used_mb"), memory.get("nvml_total_mb")
    if not total:
        return False
    if memory.get("mem_reserved_mb", 0) > total:  # only shared memory can hold the rest
        return True
    windows = sys.platform == "win32" if windows is None else windows
    # Elsewhere a full card is just full: the next allocation fails with an OOM instead.
    return windows and used is not None and used >= FULL_SHARE * total


def advice(cfg: TrainConfig) -> str:
    """What to change: the next rung of the fit ladder, or a smaller micro-batch."""
    if cfg.init_from:
        from core.training.planner import next_rung

        rung = next_rung(cfg)
        if rung:
            return f"next rung of the fit ladder: {rung}"
    if cfg.batch_size > 1:
        return "lower batch_size (grad_accum keeps the effective batch) or use grad_checkpointing"
    return "turn on grad_checkpointing, lower seq_len or pick a smaller model"


def message(memory: dict, cfg: TrainConfig) -> str:
    return (
        f"{PREFIX} {memory.get('nvml_used_mb', 0):,.0f} of {memory['nvml_total_mb']:,.0f} MiB "
        "of dedicated VRAM in use; the NVIDIA driver is likely spilling into shared system "
        "memory, so steps run several times slower (no out-of-memory error). "
        f"{_sentence(advice(cfg))}; or set the NVIDIA Control Panel's CUDA - Sysmem "
        "Fallback Policy to Prefer No Sysmem Fallback to get an out-of-memory error instead"
    )


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


class SpillWatch:
    """Looks at each train record's memory; warns once a run."""

    def __init__(self, cfg: TrainConfig, windows: bool | None = None):
        self.cfg, self.windows, self.warned = cfg, windows, False

    def check(self, memory: dict) -> str | None:
        if self.warned or not spilling(memory, self.windows):
            return None
        self.warned = True
        return message(memory, self.cfg)
