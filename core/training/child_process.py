"""Run a Trainer in a child process: events go out over a pipe, Stop and Save come in.

A front end with a busy thread of its own (the window: plots, repaints) shares the GIL
with an in-process trainer and slows it; in a child process the trainer has its own
interpreter, and a crash there (a driver fault, a killed process) cannot take the window
down. The parent reads `(hook name, args)` messages and calls the same TrainEvents hooks;
per-step records come in batches (PipeEvents), one message for many steps.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

from core.runs.events import TrainControl, TrainEvents

# spawn everywhere: Windows has nothing else, and a fork of a process running Qt is unsafe
START_METHOD = "spawn"
RESULT, FAILED = "result", "failed"
BATCH = "batch"  # args: (list of on_train_batch_end records,)
BATCH_S = 0.25  # at most about this many seconds between batches of step records
PREPARE_S = 0.1  # data preparation progress: at most 10 messages a second


class PipeEvents(TrainEvents):
    """Trainer hooks become pipe messages; if the parent is gone, ask the trainer to stop.

    Per-step records are batched: they are held and go out as one BATCH message (a list of
    records) at the end of a log window once `batch_s` has passed since the last batch, so
    a fast run sends a few messages a second instead of one per step. Every other event
    (eval, checkpoint, log, sample, oom, train end, the result or failure) first sends what
    is held, then itself: nothing is reordered, nothing waits for the end of the run. A
    record is held until a log window ends at least `batch_s` after the last batch, or
    another event is sent; batch_s <= 0 sends one message per step. Data preparation
    progress is thinned to PREPARE_S (the window shows no more).
    """

    def __init__(self, conn, control: TrainControl, batch_s: float = BATCH_S, log_every=None):
        self.conn = conn
        self.control = control
        self.parent_gone = False
        self.batch_s = batch_s
        self.log_every = log_every  # a record whose step is a multiple ends a log window
        self._held: list[dict] = []
        self._last_batch = float("-inf")  # the first records go out at once
        self._last_prepare = float("-inf")
        # What sending costs the trainer (benchmarks/window.py prints it)
        self.events = self.messages = 0
        self.send_s = 0.0
        self._cpu_at_start: float | None = None

    def send(self, name: str, args: tuple) -> None:
        """Send one event, after any records held before it."""
        self.events += 1
        self.flush()
        self._send(name, args)

    def flush(self) -> None:
        if self._held:
            records, self._held = self._held, []
            self._last_batch = time.perf_counter()
            self._send(BATCH, (records,))

    def _send(self, name: str, args: tuple) -> None:
        if self.parent_gone:
            return
        t = time.perf_counter()
        try:
            self.conn.send((name, args))
        except OSError:  # the window closed or crashed: save and stop rather than train blind
            self.parent_gone = True
            self.control.request_stop()
        self.messages += 1
        self.send_s += time.perf_counter() - t

    def on_train_batch_end(self, record: dict) -> None:
        if self.batch_s <= 0:  # unbatched: one message per step
            self.send("on_train_batch_end", (record,))
            return
        self.events += 1
        self._held.append(record)
        window_end = not self.log_every or record["step"] % self.log_every == 0
        if window_end and time.perf_counter() - self._last_batch >= self.batch_s:
            self.flush()

    def on_train_start(self, info: dict) -> None:
        self._cpu_at_start = _cpu_s()
        self.send("on_train_start", (info,))

    def on_prepare(self, phase: str, done_bytes: int, total_bytes: int) -> None:
        now = time.perf_counter()
        if done_bytes < total_bytes and now - self._last_prepare < PREPARE_S:
            return
        self._last_prepare = now
        self.send("on_prepare", (phase, done_bytes, total_bytes))

    def stats(self) -> dict:
        """This process's sending and CPU figures, sent with the result."""
        import psutil
        import torch

        cpu = _cpu_s()
        return {
            "events": self.events,
            "messages": self.messages,
            "send_s": self.send_s,
            "cpu_s": cpu,  # user + system, all threads, since the process started
            "cpu_before_train_s": self._cpu_at_start,
            "torch_threads": torch.get_num_threads(),
            "os_threads": psutil.Process().num_threads(),
        }


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def _forwarder(name: str):
    def forward(self, *args):
        self.send(name, args)

    return forward


for _name in [n for n in vars(TrainEvents) if n.startswith("on_")]:
    if _name not in vars(PipeEvents):
        setattr(PipeEvents, _name, _forwarder(_name))


def child_main(
    cfg, run_dir, resume_from, conn, events3, threads: int | None, batch_s: float = BATCH_S
) -> None:
    """The child's entry point: train, then send the result (or the failure) last.

    The result message is (RESULT, (result, stats)): stats as PipeEvents.stats gives them.
    """
    import torch

    from core.platform.device import flush_denormals

    # Ctrl+C in the terminal reaches the whole process group; the parent decides (it asks
    # for a clean stop), so the child must not die of it half-way through a save.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    flush_denormals()  # before torch's threads start
    if threads:
        torch.set_num_threads(threads)
    control = TrainControl(*events3)  # stop, save, finish
    try:
        train_and_report(
            cfg, run_dir, resume_from, PipeEvents(conn, control, batch_s, cfg.log_every)
        )
    finally:
        conn.close()


def train_and_report(cfg, run_dir, resume_from, events: PipeEvents) -> int:
    """Train, then send the result or the failure last (never a silent exit); the exit code."""
    from core.errors import exit_code, failure_kind, failure_message
    from core.training.trainer import Trainer

    try:
        trainer = Trainer(cfg, Path(run_dir), resume_from=resume_from)
        result = trainer.run(events, events.control)
        events.send(RESULT, (result, events.stats()))
        return 0
    except Exception as e:  # reported to the parent, which shows it
        events.send(FAILED, (failure_kind(e), failure_message(e)))
        return exit_code(e)


def unpacked(messages):
    """(name, args) messages with each BATCH unpacked into on_train_batch_end messages."""
    for name, args in messages:
        if name == BATCH:
            for record in args[0]:
                yield "on_train_batch_end", (record,)
        else:
            yield name, args


def child_control() -> TrainControl:
    """A TrainControl whose requests reach a child process."""
    ctx = mp.get_context(START_METHOD)
    return TrainControl(ctx.Event(), ctx.Event(), ctx.Event())


class ChildRun:
    """The parent's handle: start the child, read its messages until it ends."""

    def __init__(
        self, cfg, run_dir: Path, resume_from, control: TrainControl, threads=None, batch_s=None
    ):
        ctx = mp.get_context(START_METHOD)
        self._recv, send = ctx.Pipe(duplex=False)
        events = (control.stop_event, control.save_event, control.finish_event)
        batch_s = BATCH_S if batch_s is None else batch_s
        args = (cfg, str(run_dir), resume_from, send, events, threads, batch_s)
        self.process = ctx.Process(target=child_main, args=args, daemon=True)
        self._send = send
        # Process.start() drops its args; the events' semaphores must outlive the child.
        self.control = control

    def start(self) -> None:
        self.process.start()
        self._send.close()  # the child holds the only writer: EOF means it has ended

    def messages(self):
        """Yield (name, args) until the child closes its end; then reap it.

        A BATCH message comes through as it is: the reader unpacks its records (see
        `events`, which yields each record as an on_train_batch_end message)."""
        while True:
            try:
                yield self._recv.recv()
            except (EOFError, OSError):
                break
        self.process.join()
        self._recv.close()

    def events(self):
        """Like `messages`, with each batch unpacked into on_train_batch_end messages."""
        return unpacked(self.messages())

    def exit_description(self) -> str:
        code = self.process.exitcode
        if code is not None and code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"
