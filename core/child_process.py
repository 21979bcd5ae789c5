"""Run a Trainer in a child process: events go out over a pipe, Stop and Save come in.

A front end with a busy thread of its own (the window: plots, repaints) shares the GIL
with an in-process trainer and slows it; in a child process the trainer has its own
interpreter, and a crash there (a driver fault, a killed process) cannot take the window
down. The parent reads `(hook name, args)` messages and calls the same TrainEvents hooks.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
from pathlib import Path

from .events import TrainControl, TrainEvents

# spawn everywhere: Windows has nothing else, and a fork of a process running Qt is unsafe
START_METHOD = "spawn"
RESULT, FAILED = "result", "failed"


class PipeEvents(TrainEvents):
    """Every hook becomes one message; if the parent is gone, ask the trainer to stop."""

    def __init__(self, conn, control: TrainControl):
        self.conn = conn
        self.control = control
        self.parent_gone = False

    def send(self, name: str, args: tuple) -> None:
        if self.parent_gone:
            return
        try:
            self.conn.send((name, args))
        except OSError:  # the window closed or crashed: save and stop rather than train blind
            self.parent_gone = True
            self.control.request_stop()


def _forwarder(name: str):
    def forward(self, *args):
        self.send(name, args)

    return forward


for _name in [n for n in vars(TrainEvents) if n.startswith("on_")]:
    setattr(PipeEvents, _name, _forwarder(_name))


def child_main(cfg, run_dir, resume_from, conn, stop, save, threads: int | None) -> None:
    """The child's entry point: train, then send the result (or the failure) last."""
    import torch

    from .errors import failure_kind, failure_message
    from .trainer import Trainer

    # Ctrl+C in the terminal reaches the whole process group; the parent decides (it asks
    # for a clean stop), so the child must not die of it half-way through a save.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if threads:
        torch.set_num_threads(threads)
    control = TrainControl(stop, save)
    events = PipeEvents(conn, control)
    try:
        result = Trainer(cfg, Path(run_dir), resume_from=resume_from).run(events, control)
        events.send(RESULT, (result,))
    except Exception as e:  # reported to the parent, which shows it; never a silent exit
        events.send(FAILED, (failure_kind(e), failure_message(e)))
    finally:
        conn.close()


def child_control() -> TrainControl:
    """A TrainControl whose requests reach a child process."""
    ctx = mp.get_context(START_METHOD)
    return TrainControl(ctx.Event(), ctx.Event())


class ChildRun:
    """The parent's handle: start the child, read its messages until it ends."""

    def __init__(self, cfg, run_dir: Path, resume_from, control: TrainControl, threads=None):
        ctx = mp.get_context(START_METHOD)
        self._recv, send = ctx.Pipe(duplex=False)
        events = (control.stop_event, control.save_event)
        args = (cfg, str(run_dir), resume_from, send, *events, threads)
        self.process = ctx.Process(target=child_main, args=args, daemon=True)
        self._send = send
        # Process.start() drops its args; the events' semaphores must outlive the child.
        self.control = control

    def start(self) -> None:
        self.process.start()
        self._send.close()  # the child holds the only writer: EOF means it has ended

    def messages(self):
        """Yield (name, args) until the child closes its end; then reap it."""
        while True:
            try:
                yield self._recv.recv()
            except (EOFError, OSError):
                break
        self.process.join()
        self._recv.close()

    def exit_description(self) -> str:
        code = self.process.exitcode
        if code is not None and code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"
