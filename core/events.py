"""How the trainer talks to its front ends: an events object out, a control object in.

The CLI and the GUI both subclass TrainEvents; the trainer reads TrainControl once a step.
Events carry plain data (dicts, strings, numbers) so a GUI can pass them across threads.
"""

from __future__ import annotations

import threading


class TrainEvents:
    """Override what you need; every hook is a no-op by default."""

    def on_train_start(self, info: dict) -> None:
        """run_dir, start_step, max_steps, n_params, device, precision, config, ..."""

    def on_train_batch_end(self, record: dict) -> None:
        """One optimizer step's metrics: step, loss, lr, tokens_per_s, memory fields."""

    def on_eval(self, record: dict) -> None:
        """step, val_loss."""

    def on_checkpoint(self, path: str, step: int) -> None:
        pass

    def on_sample(self, step: int, text: str) -> None:
        pass

    def on_log(self, message: str) -> None:
        pass

    def on_oom(self, info: dict) -> None:
        """Out-of-memory recovered: step, batch_size, grad_accum (the new values)."""

    def on_train_end(self, result: dict) -> None:
        """status: finished | stopped | failed; step; error (when failed); run_dir."""


class TrainControl:
    """Thread-safe requests from a front end, read by the trainer once per step."""

    def __init__(self):
        self._stop = threading.Event()
        self._save = threading.Event()

    def request_stop(self) -> None:
        self._stop.set()

    def request_save(self) -> None:
        self._save.set()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def take_save_request(self) -> bool:
        """True once per request_save call."""
        if self._save.is_set():
            self._save.clear()
            return True
        return False
