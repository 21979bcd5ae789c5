"""One training run at a time: its thread, its state, its result. No widgets here."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from core.config.spec import TrainConfig
from gui.worker import TrainThread, settle_heap


class RunState(str, Enum):
    """Where the run is; a str, so it compares equal to "running" and friends."""

    READY = "ready"
    STARTING = "starting"
    RUNNING = "running"
    FINISHING = "finishing"  # cooling the lr down, then saving and stopping
    STOPPING = "stopping"
    STOPPED = "stopped"
    FINISHED = "finished"
    FAILED = "failed"


# how a thread's result status ends the session
END_STATES = {
    "finished": RunState.FINISHED,
    "stopped": RunState.STOPPED,
    "cancelled": RunState.STOPPED,  # data preparation stopped before the first step
}


class RunSession(QObject):
    """Starts a TrainThread, turns its life into states, and says when it has ended.

    The window connects its displays to `worker`'s signals after `launch`; the session
    itself only listens for what changes the state (started, failed, ended, finished).
    """

    state_changed = Signal(str)
    failed = Signal(str, str)  # kind, message (see TrainThread.failed)
    ended = Signal(dict)  # the run's result, once its thread has finished

    def __init__(self, parent=None):
        super().__init__(parent)
        self.worker: TrainThread | None = None
        self.state = RunState.READY
        self.run_dir: Path | None = None
        self.result: dict | None = None

    @property
    def running(self) -> bool:
        return self.worker is not None

    def launch(self, cfg: TrainConfig, run_dir: Path, resume_from: Path | None) -> TrainThread:
        """Create the thread (not yet started: connect to it, then call `begin`)."""
        self.result = None
        self.run_dir = Path(run_dir)
        worker = TrainThread(cfg, self.run_dir, resume_from, self)
        worker.train_started.connect(self._started)
        worker.train_ended.connect(self._ended)
        worker.failed.connect(self._failed)
        worker.finished.connect(self._finished)
        self.worker = worker
        self._set(RunState.STARTING)
        return worker

    def begin(self) -> None:
        settle_heap()
        self.worker.start()

    def stop(self) -> bool:
        """Ask the run to stop after this step (a checkpoint is saved first)."""
        if self.worker is None:
            return False
        self.worker.request_stop()
        self._set(RunState.STOPPING)
        return True

    def finish(self) -> bool:
        """Ask the run to cool its learning rate down, save and end as finished."""
        if self.worker is None or self.state == RunState.STOPPING:
            return False
        self.worker.request_finish()
        self._set(RunState.FINISHING)
        return True

    def save_now(self) -> bool:
        if self.worker is None:
            return False
        self.worker.request_save()
        return True

    def _set(self, state: RunState) -> None:
        self.state = state
        self.state_changed.emit(state.value)

    def _started(self, info: dict) -> None:
        if self.state not in (RunState.STOPPING, RunState.FINISHING):
            self._set(RunState.RUNNING)

    def _ended(self, result: dict) -> None:
        self.result = result

    def _failed(self, kind: str, message: str) -> None:
        self.result = {"status": "failed", "error": message, "kind": kind}
        self._set(RunState.FAILED)
        self.failed.emit(kind, message)

    def _finished(self) -> None:
        worker, self.worker = self.worker, None
        result = dict(self.result or worker.result or {"status": "failed"})
        result.setdefault("run_dir", str(self.run_dir))
        self.result = result
        worker.deleteLater()
        self._set(END_STATES.get(result.get("status"), RunState.FAILED))
        self.ended.emit(result)
