"""The training thread: supervises one training run and turns its events into Qt signals.

The Trainer runs in a child process (core.training.child_process) whose events this thread reads
from a pipe; Stop and save-now go to it through core's TrainControl. Signals carry plain
data (dicts, strings, ints) and are queued to the GUI thread, so no widget is ever
touched from here.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

import torch
from PySide6.QtCore import QThread, Signal

from core.config.spec import TrainConfig
from core.errors import failure_kind, failure_message
from core.platform.device import cuda_device_count, gpu_index
from core.runs.events import TrainControl, TrainEvents
from core.training.child_process import BATCH, FAILED, RESULT, ChildRun, child_control
from core.training.ranked import RankedRun
from core.training.trainer import Trainer

# Train in a child process (core.training.child_process): the window's repaints then cost the
# trainer nothing, and a crash there leaves the window up. Tests that patch the trainer
# in this process turn it off.
TRAIN_IN_CHILD = True
TRAINING_SWITCH_S = 0.0001


def cpu_training_threads() -> int:
    """Torch threads for a CPU run started from the window: all cores but one.

    The core left over is the window's: OpenMP workers spin-wait at every barrier, and one
    of them descheduled by a repaint stalls a whole step (measured 10x slower with 2
    threads on 2 cores while the plots redraw).
    """
    return max(1, (os.cpu_count() or 1) - 1)


def shard_processes() -> int:
    """A sharded run's processes: one a CUDA card."""
    return cuda_device_count()


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
        self.thread.batches.emit([record])

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

    def on_compiled(self, info):
        self.thread.compiled.emit(info)

    def on_train_end(self, result):
        self.thread.train_ended.emit(result)


class TrainThread(QThread):
    """Runs `Trainer(cfg, run_dir, resume_from).run(...)`; errors become `failed`."""

    train_started = Signal(dict)
    preparing = Signal(str, float, float)  # phase, bytes done, bytes in all
    batches = Signal(list)  # step records, oldest first: one per step, a log window's at a time
    evaluated = Signal(dict)
    checkpoint_saved = Signal(str, int)
    sampled = Signal(int, str)
    logged = Signal(str)
    oom = Signal(dict)
    compiled = Signal(dict)  # a compiled run's first step done: step, seconds
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
        self.in_child = TRAIN_IN_CHILD
        self.control = child_control() if self.in_child else TrainControl()
        self.result: dict | None = None
        self.child: ChildRun | RankedRun | None = None  # the training process, once started
        self.child_stats: dict | None = None  # its sending and CPU figures, with the result

    def request_stop(self) -> None:
        self.control.request_stop()

    def request_save(self) -> None:
        self.control.request_save()

    def request_finish(self) -> None:
        """A short lr cooldown, then save and stop as finished (schedule.finish_plan)."""
        self.control.request_finish()

    def run(self) -> None:
        if self.in_child:
            self._run_in_child()
        else:
            self._run_here()

    def _threads(self) -> int | None:
        return cpu_training_threads() if self._on_cpu() else None

    def _run_in_child(self) -> None:
        if self.cfg.shard:  # one process a card, through torchrun (core.training.ranked)
            child = RankedRun(
                self.cfg, self.run_dir, self.resume_from, self.control, shard_processes()
            )
        else:
            child = ChildRun(
                self.cfg, self.run_dir, self.resume_from, self.control, self._threads()
            )
        self.child = child
        events = _SignalEvents(self)
        try:
            child.start()
        except Exception as e:  # e.g. no memory for a new process
            self._fail("crash", f"could not start the training process: {e}")
            return
        for name, args in child.messages():
            if name == BATCH:  # many steps' records in one message (and one signal)
                self.batches.emit(args[0])
            elif name == RESULT:
                self.result = args[0]
                self.child_stats = args[1] if len(args) > 1 else None
            elif name == FAILED:
                self._fail(*args)
            else:
                getattr(events, name)(*args)
        if self.result is None:
            self._fail(
                "crash",
                f"the training process ended without a result ({child.exit_description()}); "
                f"Resume continues from the last checkpoint in {self.run_dir}",
            )

    def _run_here(self) -> None:
        """In this process (tests that patch the trainer): slower, the GIL is shared."""
        threads, switch = torch.get_num_threads(), sys.getswitchinterval()
        # The trainer re-takes the GIL after every torch op; while the GUI thread runs
        # Python (a repaint), each re-take waits out the switch interval (5 ms by default).
        sys.setswitchinterval(TRAINING_SWITCH_S)
        if wanted := self._threads():
            torch.set_num_threads(wanted)
        try:
            trainer = Trainer(self.cfg, self.run_dir, resume_from=self.resume_from)
            self.result = trainer.run(_SignalEvents(self), self.control)
        except Exception as e:  # the thread must never die silently
            self._fail(failure_kind(e), failure_message(e))
        finally:
            torch.set_num_threads(threads)
            sys.setswitchinterval(switch)

    def _on_cpu(self) -> bool:
        return gpu_index(self.cfg.device, cuda_device_count()) is None

    def _fail(self, kind: str, message: str) -> None:
        self.result = {"status": "failed", "error": message, "run_dir": str(self.run_dir)}
        self.failed.emit(kind, message)
