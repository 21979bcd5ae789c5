"""A run's clock: elapsed time across sessions, and the time spent outside training steps
(evaluation, samples, checkpoint copies), which tokens/s and time budgets leave out."""

from __future__ import annotations

import contextlib
import time


class Clock:
    def __init__(self):
        self.before = 0.0  # elapsed seconds of earlier sessions (from the checkpoint)
        self.paused_total = 0.0  # seconds not training, over the whole run
        self.paused_window = 0.0  # the same since the last metrics window
        self.t0: float | None = None  # this session's start
        self.window_start = 0.0
        self._depth = 0

    def start(self) -> None:
        self.t0 = self.window_start = time.perf_counter()

    def elapsed(self) -> float:
        now = time.perf_counter() - self.t0 if self.t0 is not None else 0.0
        return round(self.before + now, 3)

    def training_seconds(self) -> float:
        """Training time since the last call: a metrics window, pauses left out."""
        now = time.perf_counter()
        seconds = now - self.window_start - self.paused_window
        self.window_start, self.paused_window = now, 0.0
        return max(seconds, 1e-9)

    @contextlib.contextmanager
    def not_training(self):
        """Time spent inside is left out of tokens_per_s (nested uses count once)."""
        self._depth += 1
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                paused = time.perf_counter() - t0
                self.paused_window += paused
                self.paused_total += paused
