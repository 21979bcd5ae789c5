"""Will it fit? core's memory estimate against free VRAM (or free RAM on the CPU)."""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QGroupBox, QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout

from core.config.spec import TrainConfig
from core.training import sharding, split
from core.training.estimate import SAFETY_MARGIN, base_saving, estimate, usable_bytes
from core.training.planner import (
    Rung,
    checkpoint_line,
    context_line,
    fine_tune_choices,
    heap_line,
)
from gui.hardware_panel import HardwareInfo

GiB = 1024**3
BAR_SCALE = 1000  # the bar's range: fraction of the usable memory in thousandths


@dataclass
class Fit:
    need: int  # bytes the run is estimated to take at its peak
    free: int | None  # bytes free on the device it runs on; None when unknown
    on_gpu: bool
    report: str
    components: list[str] = field(default_factory=list)  # the peak by component, a line each
    heap: str = ""  # the CPU: which C heap the estimate is for, and what this machine's holds
    cards: list = field(default_factory=list)  # a layer split or shard: each card's CardRow
    title: str = ""  # what cards are (a split's layers by default)

    @property
    def usable(self) -> int | None:
        return None if self.free is None else usable_bytes(self.free)

    @property
    def fits(self) -> bool:
        if self.cards:
            return all(c.fits is not False for c in self.cards)
        return self.usable is None or self.need <= self.usable

    def describe(self) -> str:
        if self.cards:  # a layer split: each card's share against its own free memory
            lines = [
                f"{c.device}: {c.layers}, ~{c.total / GiB:.2f} GiB (free unknown)"
                if c.free is None
                else f"{c.device}: {c.layers}, ~{c.total / GiB:.2f} GiB of {c.free / GiB:.1f} "
                f"GiB free — {'fits' if c.fits else 'does NOT fit'}"
                for c in self.cards
            ]
            title = self.title or f"layers split over {len(self.cards)} GPUs"
            return f"{title}:\n" + "\n".join(lines)
        where = "VRAM" if self.on_gpu else "RAM"
        if self.free is None:
            return f"needs ~{self.need / GiB:.2f} GiB (free {where} unknown)"
        verdict = "fits" if self.fits else "does NOT fit"
        return f"~{self.need / GiB:.2f} GiB of {self.free / GiB:.1f} GiB free {where} — {verdict}"


def judge(cfg: TrainConfig, info: HardwareInfo) -> Fit:
    if cfg.devices and info.gpus:
        return judge_split(cfg, info)
    if cfg.shard and len(info.gpus) >= 2:
        return judge_shard(cfg, info)
    gpu = info.gpu_for(cfg.device)
    if gpu is not None:
        est = estimate(cfg, on_gpu=True)
        free, on_gpu = gpu.get("free_bytes"), True
    else:
        est = estimate(cfg, on_gpu=False)  # core resolves "auto" to fp32 on the CPU
        free, on_gpu = info.cpu.get("ram_free_bytes"), False
    heap = "" if on_gpu else heap_line(cfg, peak=est.device_total)
    return Fit(est.device_total, free, on_gpu, est.report(), est.components_lines(), heap)


def judge_split(cfg: TrainConfig, info: HardwareInfo) -> Fit:
    """A layer split: each card's estimate (core.training.split); the bar shows the card
    nearest its limit."""
    est = estimate(cfg, on_gpu=True)
    rows = split.card_rows(cfg, est, split.free_of(cfg, info.gpus, info.cpu.get("ram_free_bytes")))
    return cards_fit(est, rows)


def judge_shard(cfg: TrainConfig, info: HardwareInfo) -> Fit:
    """Sharded over every card (one process each): each holds a share (core.training.sharding)."""
    est = estimate(cfg, on_gpu=True)
    rows = sharding.card_rows(cfg, est, [g.get("free_bytes") for g in info.gpus])
    return cards_fit(est, rows, f"sharded over {len(rows)} GPUs (a process each)")


def cards_fit(est, rows: list, title: str = "") -> Fit:
    """Several cards' rows; the bar shows the card nearest its limit."""
    worst = max(rows, key=lambda r: r.total / max(1, usable_bytes(r.free or 0)))
    lines = est.components_lines()
    return Fit(worst.total, worst.free, True, est.report(), lines, cards=rows, title=title)


def context_hint(cfg: TrainConfig, info: HardwareInfo) -> tuple[str, bool]:
    """The longest context that fits the device cfg runs on, and whether cfg's is past it;
    ("", False) when what is free is unknown, or for a layer split (each card's share is in
    the estimate)."""
    if cfg.devices or cfg.shard:
        return "", False
    gpu = info.gpu_for(cfg.device)
    free = gpu.get("free_bytes") if gpu is not None else info.cpu.get("ram_free_bytes")
    if free is None:
        return "", False
    return context_line(cfg, free, gpu is not None)


def both_estimates(cfg: TrainConfig, on_gpu: bool) -> str:
    """Full fine-tuning vs LoRA (with activation checkpointing) at this batch."""
    full_cfg, lora_cfg = fine_tune_choices(cfg)
    full, low = estimate(full_cfg, on_gpu=on_gpu), estimate(lora_cfg, on_gpu=on_gpu)
    return (
        f"full fine-tune ~{full.device_total / GiB:.2f} GiB · LoRA r{lora_cfg.lora_rank} "
        "+ checkpointing "
        f"~{low.device_total / GiB:.2f} GiB"
    )


def base_line(cfg: TrainConfig) -> str:
    """A 4- or 8-bit base: its bits and what it saves against a 16-bit one; else empty."""
    saving = base_saving(cfg)
    if saving is None:
        return ""
    bits, saved = saving
    return f"{bits}-bit base: saves ~{saved / GiB:.2f} GiB against a 16-bit base"


def ladder_html(gpu_name: str, rungs: list[Rung], why: str, note: str = "") -> str:
    """Every rung of the fit ladder with its need, which was chosen, and why (note: added
    after the headline in brackets)."""
    rows = []
    for r in rungs:
        fit = "does not fit"
        if r.fitted is not None:
            f = r.fitted
            fit = f"fits: batch {f.batch_size} x {f.grad_accum}, ~{r.need / GiB:.1f} GiB"
            if ckpt := checkpoint_line(f):
                fit += f", {ckpt}"
        mark = "<b>◀ chosen</b>" if r.chosen else ""
        style = " style='background:#e8f5e9'" if r.chosen else ""
        rows.append(
            f"<tr{style}><td>{html.escape(r.name)}</td><td align='right'>"
            f"{r.need_at_one / GiB:.1f} GiB</td><td>{fit}</td>"
            f"<td align='right'>{r.longest:,}</td><td>{mark}</td></tr>"
        )
    head = (
        "<tr><th align='left'>Fit ladder</th><th>at batch 1</th>"
        "<th align='left'>largest micro-batch</th><th>longest context</th><th></th></tr>"
    )
    headline = why.split("; at batch 1 ")[0]  # the rungs above are in the table
    if note:
        headline += f" ({note})"
    return (
        f"<b>{html.escape(gpu_name)}</b>: {html.escape(headline)}"
        f"<table cellspacing='0' cellpadding='2'>{head}{''.join(rows)}</table>"
    )


class EstimatePanel(QGroupBox):
    """A bar of estimated peak memory vs what is free, and "Fit to my GPU"."""

    fit_requested = Signal()

    def __init__(self, info: HardwareInfo, parent=None):
        super().__init__("Memory estimate", parent)
        self.info = info
        self.fit: Fit | None = None
        self.bar = QProgressBar()
        self.bar.setRange(0, BAR_SCALE)
        self.bar.setTextVisible(True)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.fit_button = QPushButton("Fit to my GPU")
        self.fit_button.clicked.connect(self.fit_requested)
        row = QHBoxLayout()
        row.addWidget(self.bar, 1)
        row.addWidget(self.fit_button)
        layout = QVBoxLayout(self)
        self.choice = QLabel()  # what "Fit to my GPU" chose for a pretrained start, and why
        self.choice.setWordWrap(True)
        self.choice.setVisible(False)
        # the estimate's peak by component, as benchmarks/long_context.py measures it
        self.details_button = QPushButton("Details")
        self.details_button.setCheckable(True)
        self.details = QLabel()
        self.details.setTextFormat(Qt.TextFormat.RichText)
        self.details.setWordWrap(True)  # the heap's line under the table
        self.details.setVisible(False)
        self.details_button.toggled.connect(self.details.setVisible)
        layout.addLayout(row)
        layout.addWidget(self.label)
        layout.addWidget(self.details_button, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addWidget(self.details)
        layout.addWidget(self.choice)
        self.set_info(info)

    def set_info(self, info: HardwareInfo) -> None:
        self.info = info
        if info.gpus:
            self.fit_button.setEnabled(True)
            self.fit_button.setToolTip(
                "Largest micro-batch that fits the free VRAM; grad accumulation keeps the "
                "effective batch the same"
            )
        else:
            self.fit_button.setEnabled(False)
            self.fit_button.setToolTip("No CUDA GPU found: there is no VRAM to fit to")

    def set_choice(self, text: str) -> None:
        self.choice.setText(text)
        self.choice.setVisible(bool(text))

    def set_ladder(self, gpu_name: str, rungs: list[Rung], why: str, note: str = "") -> None:
        """The fit ladder as a table: every rung's need, the chosen one and why."""
        self.choice.setTextFormat(Qt.TextFormat.RichText)
        self.set_choice(ladder_html(gpu_name, rungs, why, note))

    def update_for(self, cfg: TrainConfig | None) -> None:
        """Show the estimate for a valid config, or a blank bar for an invalid one."""
        if cfg is None:
            self.fit = None
            self.bar.setValue(0)
            self.bar.setFormat("—")
            self.label.setText("Fix the flagged setting to see the estimate.")
            self.details.setText("")
            return
        self.fit = judge(cfg, self.info)
        share = self.fit.need / self.fit.usable if self.fit.usable else 0.0
        self.bar.setValue(min(BAR_SCALE, int(share * BAR_SCALE)))
        shown = f"{share:.0%}" if share >= 0.01 else "<1%"
        self.bar.setFormat(f"{shown} of usable {'VRAM' if self.fit.on_gpu else 'RAM'}")
        color = "#43a047" if share < 0.75 else "#fb8c00" if share <= 1.0 else "#e53935"
        self.bar.setStyleSheet(f"QProgressBar::chunk {{ background: {color}; }}")
        text = self.fit.describe()
        if ckpt := checkpoint_line(cfg, self.fit.on_gpu):
            text += f" · {ckpt}"
        if cfg.init_from:  # the estimate for both ways of fine-tuning
            text += "\n" + both_estimates(cfg, self.fit.on_gpu)
            if line := base_line(cfg):
                text += "\n" + line
        self.label.setText(text)
        lines = html.escape("\n".join(["peak by component (estimate):", *self.fit.components]))
        heap = f"<p>{html.escape(self.fit.heap)}</p>" if self.fit.heap else ""
        self.details.setText(f"<pre>{lines}</pre>{heap}")
        self.setToolTip(
            self.fit.report + f"\n\n{SAFETY_MARGIN:.0%} of free memory is kept as a margin."
        )
