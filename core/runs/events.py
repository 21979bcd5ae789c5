"""How the trainer talks to its front ends: an events object out, a control object in.

The CLI and the GUI both subclass TrainEvents; the trainer reads TrainControl once a step.
Events carry plain data (dicts, strings, numbers) so a GUI can pass them across threads.
"""

from __future__ import annotations

import threading
from pathlib import Path

# Requests another process leaves in a run folder for the trainer training there: the trainer
# looks for them once a second (core.training.time_budget.RequestWatch) and acts on each as on
# the window's button of the same name. `python -m core.train --finish RUN` and the web
# monitor's control mode (core.monitor) leave them; they work on every system.
REQUEST_FILES = {"stop": "STOP", "save": "SAVE", "finish": "FINISH"}


def leave_request(run_dir: str | Path, action: str) -> Path:
    """Ask the trainer in run_dir to stop, save now or finish (an action of REQUEST_FILES)."""
    path = Path(run_dir) / REQUEST_FILES[action]
    path.write_text(action + "\n", encoding="utf-8")
    return path


def clear_requests(run_dir: str | Path) -> None:
    """Drop requests left for an earlier session of the run (a Stop pressed as it ended): a
    run starting or resuming reads only the ones made for it."""
    for name in REQUEST_FILES.values():
        (Path(run_dir) / name).unlink(missing_ok=True)


class TrainEvents:
    """Override what you need; every hook is a no-op by default."""

    def on_train_start(self, info: dict) -> None:
        """run_dir, start_step, max_steps, n_params, device, precision, config, ..."""

    def on_prepare(self, phase: str, done_bytes: int, total_bytes: int) -> None:
        """Data preparation progress (reading, learning BPE, tokenizing)."""

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

    def on_compiled(self, info: dict) -> None:
        """A compiled run's first step is done: step, seconds it took (mostly compiling),
        compiled (False: compiling failed and the run goes on eager)."""

    def on_train_end(self, result: dict) -> None:
        """status: finished | stopped | failed; step; error (when failed); run_dir."""


class FanOut(TrainEvents):
    """Send every event to several consumers (a progress bar and TensorBoard, say)."""

    def __init__(self, *targets: TrainEvents):
        self.targets = targets

    def __getattribute__(self, name):
        if not name.startswith("on_"):
            return object.__getattribute__(self, name)
        targets = object.__getattribute__(self, "targets")

        def call(*args):
            for target in targets:
                getattr(target, name)(*args)

        return call


class TensorBoardEvents(TrainEvents):
    """Optional TensorBoard logging into <run>/tensorboard (pip install -e .[tensorboard])."""

    def __init__(self):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            from core.errors import ConfigError

            raise ConfigError(
                "tensorboard: the tensorboard package is not installed; "
                "run: pip install -e .[tensorboard]"
            ) from None
        self.make_writer = SummaryWriter
        self.writer = None

    def on_train_start(self, info):
        # Made here, not in __init__, so a run refused at setup leaves no folder behind.
        self.writer = self.make_writer(info["run_dir"] + "/tensorboard")

    def on_train_batch_end(self, record):
        step = record["step"]
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)):
                self.writer.add_scalar(f"train/{key}", value, step)

    def on_eval(self, record):
        self.writer.add_scalar("eval/val_loss", record["val_loss"], record["step"])

    def on_sample(self, step, text):
        self.writer.add_text("sample", text, step)

    def on_train_end(self, result):
        if self.writer is not None:
            self.writer.close()


class TrainControl:
    """Thread-safe requests from a front end, read by the trainer once per step."""

    def __init__(self, stop_event=None, save_event=None, finish_event=None):
        # Any objects with set/is_set/clear: multiprocessing Events let a window in another
        # process steer a trainer (core.training.child_process).
        self.stop_event = stop_event or threading.Event()
        self.save_event = save_event or threading.Event()
        self.finish_event = finish_event or threading.Event()

    def request_stop(self) -> None:
        self.stop_event.set()

    def request_finish(self) -> None:
        """Decay the lr now over a short cooldown, then save and stop (core.training.schedule)."""
        self.finish_event.set()

    def take_finish_request(self) -> bool:
        """True once per request_finish call."""
        return _take(self.finish_event)

    def request_save(self) -> None:
        self.save_event.set()

    def request(self, action: str) -> None:
        """An action of REQUEST_FILES, by name."""
        {"stop": self.request_stop, "save": self.request_save, "finish": self.request_finish}[
            action
        ]()

    @property
    def stop_requested(self) -> bool:
        return self.stop_event.is_set()

    def stop_set(self) -> bool:
        """The raw stop flag, for work that runs before the first step (data preparation)."""
        return self.stop_event.is_set()

    def take_save_request(self) -> bool:
        """True once per request_save call."""
        return _take(self.save_event)


def _take(event) -> bool:
    """Whether the event was set; clears it, so each request is acted on once."""
    if event.is_set():
        event.clear()
        return True
    return False
