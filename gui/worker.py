"""The training thread: owns one Trainer and turns core events into Qt signals.

Signals carry plain data (dicts, strings, ints) and are queued to the GUI thread, so no
widget is ever touched from here. Stop and save-now go through core's TrainControl.
"""

from __future__ import annotations

import gc
import io
import os
import sys
import time
from pathlib import Path

import torch
from PySide6.QtCore import QThread, Signal

from core.config import TrainConfig
from core.device import gpu_index
from core.errors import failure_kind, failure_message
from core.events import TrainControl, TrainEvents
from core.trainer import Trainer

TRAINING_SWITCH_S = 0.0001


def warm_up() -> None:
    """Run, once and in the GUI thread at start-up, what a first training step does lazily.

    The first optimizer imports torch._dynamo (and sympy); the first torch.save builds
    pickling tables. In the training thread both hold the GIL for 100+ ms at a time and
    freeze the window; here, before the window shows, nobody notices.
    """
    import numpy.random  # noqa: F401

    from core.checkpoint import rng_state

    try:
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.AdamW(model.parameters())
        model(torch.zeros(1, 2)).sum().backward()
        optimizer.step()
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save({**state, "rng": rng_state()}, io.BytesIO())
    except Exception:  # only an optimisation: a real problem shows up in the real run
        pass


def settle_heap() -> None:
    """Collect garbage, then take every live object out of the cyclic collector's sight.

    With torch, sympy and pyqtgraph loaded a full collection walks some 300k objects and
    holds the GIL for 100-200 ms, in whichever thread triggers it. Frozen (gc.freeze),
    later collections only walk objects created since, so neither thread stalls the window.
    Collecting first means a finished run's model and optimizer are freed, not frozen.
    """
    gc.collect()
    gc.freeze()


class _SignalEvents(TrainEvents):
    """Forwards every trainer hook to the thread's signals."""

    def __init__(self, thread: TrainThread):
        self.thread = thread
        self._last_prepare = 0.0

    def on_train_start(self, info):
        self.thread.train_started.emit(info)

    def on_prepare(self, phase, done, total):
        now = time.monotonic()
        if done < total and now - self._last_prepare < 0.1:  # at most 10 updates a second
            return
        self._last_prepare = now
        self.thread.preparing.emit(phase, float(done), float(total))

    def on_train_batch_end(self, record):
        self.thread.batch_end.emit(record)

    def on_eval(self, record):
        self.thread.evaluated.emit(record)

    def on_checkpoint(self, path, step):
        self.thread.checkpoint_saved.emit(str(path), int(step))

    def on_sample(self, step, text):
        self.thread.sampled.emit(int(step), text)

    def on_log(self, message):
        self.thread.logged.emit(message)

    def on_oom(self, info):
        self.thread.oom.emit(info)

    def on_train_end(self, result):
        self.thread.train_ended.emit(result)


class TrainThread(QThread):
    """Runs `Trainer(cfg, run_dir, resume_from).run(...)`; errors become `failed`."""

    train_started = Signal(dict)
    preparing = Signal(str, float, float)  # phase, bytes done, bytes in all
    batch_end = Signal(dict)
    evaluated = Signal(dict)
    checkpoint_saved = Signal(str, int)
    sampled = Signal(int, str)
    logged = Signal(str)
    oom = Signal(dict)
    train_ended = Signal(dict)
    # kind is "input" (bad settings, data or checkpoint), "training" (diverged, OOM at
    # batch 1) or "crash" (a bug or an unexpected failure); message is core's text.
    failed = Signal(str, str)

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: Path,
        resume_from: Path | None = None,
        parent=None,
    ):
        super().__init__(parent)
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.resume_from = resume_from
        self.control = TrainControl()
        self.result: dict | None = None

    def request_stop(self) -> None:
        self.control.request_stop()

    def request_save(self) -> None:
        self.control.request_save()

    def run(self) -> None:
        threads, switch = torch.get_num_threads(), sys.getswitchinterval()
        # The trainer re-takes the GIL after every torch op; while the GUI thread runs
        # Python (a repaint), each re-take waits out the switch interval (5 ms by default).
        # 0.1 ms measured 0.64 -> 0.9+ of headless tokens/s for cpu-tiny (benchmarks/window.py).
        sys.setswitchinterval(TRAINING_SWITCH_S)
        if self._on_cpu():
            # Leave a core to the GUI thread: OpenMP workers spin-wait at every barrier, and
            # one of them descheduled by the GUI stalls a whole step (measured 10x slower
            # with 2 threads on 2 cores while the plots redraw).
            torch.set_num_threads(max(1, (os.cpu_count() or 1) - 1))
        try:
            trainer = Trainer(self.cfg, self.run_dir, resume_from=self.resume_from)
            self.result = trainer.run(_SignalEvents(self), self.control)
        except Exception as e:  # the thread must never die silently
            self._fail(failure_kind(e), failure_message(e))
        finally:
            torch.set_num_threads(threads)
            sys.setswitchinterval(switch)

    def _on_cpu(self) -> bool:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return gpu_index(self.cfg.device, count) is None

    def _fail(self, kind: str, message: str) -> None:
        self.result = {"status": "failed", "error": message, "run_dir": str(self.run_dir)}
        self.failed.emit(kind, message)
