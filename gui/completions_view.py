"""GRPO's latest sampled completions with each one's rewards (the run folder's
completions.jsonl, its last step): the view that shows reward hacking before the curves do.
A prompt that showed images names them in an image column (file names)."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtWidgets import (
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

TAIL_BYTES = 1 << 20  # a step's rows are a few hundred KB at most
IMAGE_KEYS = ("image", "images")  # a row's prompt's images (GRPO prompts with images)


def last_step(path: Path) -> dict | None:
    """The last whole line of completions.jsonl, read from its tail."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:
            continue  # a line being written, or cut by the tail
    return None


def image_names(row: dict) -> str:
    """The file names of the images a row's prompt showed ("image": a path, "images": a
    list of them), comma-separated; "" for none."""
    found = []
    for key in IMAGE_KEYS:
        value = row.get(key)
        found += value if isinstance(value, list) else [value] if value else []
    return ", ".join(Path(str(v)).name for v in found)


def _number(v) -> str:
    return "—" if v is None else f"{v:.3f}"


class CompletionsView(QWidget):
    def __init__(self):
        super().__init__()
        self.title = QLabel("GRPO runs show their latest sampled completions here.")
        self.table = QTableWidget(0, 0)
        self.table.setWordWrap(True)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.title)
        layout.addWidget(self.table, 1)
        self.step = None

    def refresh(self, run_dir: Path | None) -> None:
        if run_dir is None:
            return
        latest = last_step(Path(run_dir) / "completions.jsonl")
        if latest is None or latest.get("step") == self.step:
            return
        self.show_rows(latest["step"], latest["rows"])

    def show_rows(self, step: int, rows: list[dict]) -> None:
        self.step = step
        names = list(rows[0]["rewards"]) if rows else []
        fixed = ("prompt", "completion", "rewards", "reward", "advantage", *IMAGE_KEYS)
        extra = [k for k in (rows[0] if rows else {}) if k not in fixed]
        seen = any(image_names(r) for r in rows)  # a column for prompts that showed images
        headers = ["prompt", *(["image"] if seen else []), "completion", "reward", "advantage"]
        headers += [*names, *extra]
        self.table.setColumnCount(len(headers))
        self.table.setHorizontalHeaderLabels(headers)
        self.table.setRowCount(len(rows))
        for i, row in enumerate(rows):
            cells = [
                row["prompt"],
                *([image_names(row)] if seen else []),
                row["completion"],
                _number(row["reward"]),
                _number(row["advantage"]),
                *(_number(row["rewards"][n]) for n in names),
                *(str(row.get(k, "")) for k in extra),
            ]
            for j, text in enumerate(cells):
                self.table.setItem(i, j, QTableWidgetItem(text))
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setSectionResizeMode(headers.index("completion"), QHeaderView.ResizeMode.Stretch)
        self.table.setColumnWidth(0, 220)
        mean = sum(r["reward"] or 0 for r in rows) / max(1, len(rows))
        self.title.setText(f"step {step}: {len(rows)} sampled completions, mean reward {mean:.3f}")
