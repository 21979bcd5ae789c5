"""A sharded run (--shard) started by a front end: torchrun with N processes, rank 0's events
over a local socket, Stop, Save and Finish back over it.

The window's one-process runs use core.training.child_process; FSDP2 needs one process per
GPU, which only torchrun starts. RankedRun has ChildRun's interface (start, messages, events,
exit_description), so the window reads either the same way. Rank 0 connects to the
parent's listener (127.0.0.1, a random key in the environment) and sends what PipeEvents
sends; the other ranks report nothing (rank 0 says when one of them fails).
"""

from __future__ import annotations

import os
import pickle
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Client, Listener
from pathlib import Path

from core.runs.events import TrainControl, TrainEvents
from core.training.child_process import BATCH_S, PipeEvents, train_and_report, unpacked

ADDRESS_ENV = "TRAINDECK_EVENTS_ADDRESS"  # host:port of the window's listener
KEY_ENV = "TRAINDECK_EVENTS_KEY"  # its authentication key, hex
CONNECT_S = 600.0  # torchrun's start, imports and rendezvous come before rank 0 connects
POLL_S = 0.1


def torchrun_command(processes: int, inputs: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(processes),
        "-m",
        "core.training.ranked",
        str(inputs),
    ]


class RankedRun:
    """The parent's handle on a torchrun run: start it, read rank 0's messages until the
    run ends, pass the control's requests on."""

    def __init__(self, cfg, run_dir: Path, resume_from, control: TrainControl, processes: int):
        self.control = control
        self.processes = processes
        self._key = secrets.token_bytes(32)
        self._listener = Listener(("127.0.0.1", 0), authkey=self._key)
        self._folder = Path(tempfile.mkdtemp(prefix="traindeck-ranked-"))
        self._inputs = self._folder / "inputs.pkl"
        self._inputs.write_bytes(pickle.dumps((cfg, str(run_dir), resume_from)))
        self._log = self._folder / "torchrun.log"
        self._log_text = ""  # torchrun's output, read once it has ended
        self._conn = None
        self._stop_sent = False
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        host, port = self._listener.address
        env = {**os.environ, ADDRESS_ENV: f"{host}:{port}", KEY_ENV: self._key.hex()}
        root = str(Path(__file__).resolve().parents[2])  # core's parent, wherever started
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        with open(self._log, "wb") as log:
            self.process = subprocess.Popen(
                torchrun_command(self.processes, self._inputs),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )

    def messages(self):
        """Yield (name, args) from rank 0 until the run ends; then reap torchrun."""
        try:
            self._conn = self._accept()
            while self._conn is not None:
                self._pass_requests(self._conn)
                try:
                    if self._conn.poll(POLL_S):
                        yield self._conn.recv()
                except (EOFError, OSError):
                    break
        finally:
            self._close()

    def events(self):
        """Like messages, with each batch unpacked into on_train_batch_end messages."""
        return unpacked(self.messages())

    def exit_description(self) -> str:
        code = None if self.process is None else self.process.returncode
        last = last_error_line(self._log_text)
        return f"torchrun exit code {code}" + (f": {last}" if last else "")

    def _accept(self):
        """Rank 0's connection; None if torchrun ends before it connects."""
        got: list = []
        waiter = threading.Thread(target=lambda: got.append(self._try_accept()), daemon=True)
        waiter.start()
        end = time.monotonic() + CONNECT_S
        while waiter.is_alive():
            waiter.join(POLL_S)
            gone = self.process is None or self.process.poll() is not None
            # a Stop pressed meanwhile goes to rank 0 once it connects (its imports first)
            if gone or time.monotonic() > end:
                self._terminate()
                self._listener.close()  # the waiting accept ends with an error
                waiter.join(5)
                return None
        return got[0] if got else None

    def _try_accept(self):
        try:
            return self._listener.accept()
        except (OSError, EOFError):
            return None

    def _pass_requests(self, conn) -> None:
        """The window's Stop, Save now and Finish, to rank 0 (which tells the others)."""
        c = self.control
        for action, wanted in (
            ("stop", c.stop_requested),
            ("save", c.take_save_request()),
            ("finish", c.take_finish_request()),
        ):
            if wanted and not (action == "stop" and self._stop_sent):
                try:
                    conn.send(action)
                except OSError:
                    return
                self._stop_sent = self._stop_sent or action == "stop"

    def _terminate(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # torchrun passes SIGTERM to its ranks

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._listener.close()
        if self.process is not None:
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log_text = self._log.read_text(encoding="utf-8", errors="replace")
        shutil.rmtree(self._folder, ignore_errors=True)


def last_error_line(text: str) -> str:
    """The ranks' own one-line error (core.cli.base's form), else ''."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("error:")]
    return lines[-1][len("error:") :].strip() if lines else ""


def _listen_for_requests(conn, control: TrainControl) -> None:
    """Rank 0: the window's requests into this run's control; the window gone: stop."""
    while True:
        try:
            control.request(conn.recv())
        except (EOFError, OSError):
            control.request_stop()  # save and stop rather than train unwatched
            return


def rank_main(inputs: str) -> int:
    """One rank's entry point under torchrun; rank 0 reports to the window."""
    import torch.distributed as dist

    from core.platform.device import flush_denormals

    cfg, run_dir, resume_from = pickle.loads(Path(inputs).read_bytes())
    flush_denormals()
    control = TrainControl()
    rank = int(os.environ.get("RANK", "0"))
    if rank != 0:
        return _train_unreported(cfg, run_dir, resume_from, control, rank)
    host, port = os.environ[ADDRESS_ENV].rsplit(":", 1)
    conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ[KEY_ENV]))
    threading.Thread(target=_listen_for_requests, args=(conn, control), daemon=True).start()
    try:
        pipe = PipeEvents(conn, control, BATCH_S, cfg.log_every)
        return train_and_report(cfg, run_dir, resume_from, pipe)
    finally:
        conn.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _train_unreported(cfg, run_dir, resume_from, control: TrainControl, rank: int) -> int:
    """A rank other than 0: rank 0 names it if it fails; its own reason goes to the log."""
    import torch.distributed as dist

    from core.errors import exit_code, failure_message
    from core.training.trainer import Trainer

    try:
        Trainer(cfg, Path(run_dir), resume_from=resume_from).run(TrainEvents(), control)
        return 0
    except Exception as e:
        print(f"error: rank {rank}: {failure_message(e)}", file=sys.stderr)
        return exit_code(e)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(rank_main(sys.argv[1]))
