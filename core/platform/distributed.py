"""Multi-GPU through PyTorch's own launcher: `torchrun --nproc_per_node N -m core.train ...`.

torchrun sets WORLD_SIZE/RANK/LOCAL_RANK; with one process nothing here does anything, so a
single-GPU or CPU run takes exactly the code path it always did.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from core.errors import ConfigError

TIMEOUT_ENV = "TRAINDECK_DIST_TIMEOUT"  # seconds a collective waits for every process
DEFAULT_TIMEOUT_S = 600.0  # NCCL's own default; a checkpoint or evaluation fits in it
# What gloo and NCCL say when a peer is gone or silent (they raise plain RuntimeErrors)
LOST_PEER_WORDS = ("Connection reset", "Connection closed", "Timed out", "NCCL", "gloo")


def timeout_s() -> float:
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ConfigError(f"{TIMEOUT_ENV}: expected seconds above 0, got {text!r}")
    return value


def nccl_available(platform: str = sys.platform) -> bool:
    """NCCL, which CUDA's process groups use, is not built into PyTorch on Windows."""
    return platform != "win32"


def check_backend(device_type: str, platform: str = sys.platform) -> None:
    if device_type == "cuda" and not nccl_available(platform):
        raise ConfigError(
            "device: several processes on CUDA GPUs need NCCL, which PyTorch on Windows does "
            "not have; on Windows train in one process: one GPU, or the layers split across "
            "them with --devices cuda:0,cuda:1 (docs/multi-gpu.md)",
            field="device",
        )


class Terminated(RuntimeError):
    """SIGTERM reached a rank: torchrun stops the others this way when one of them died."""


def _raise_terminated(signum, frame):
    if sys.exc_info()[1] is not None:
        return  # already failing (a collective saw the peer go): that error names it
    raise Terminated("SIGTERM")


def _alive(pid: int) -> bool:
    """A process on this machine that has not exited (a zombie has)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@dataclass
class World:
    size: int = 1
    rank: int = 0
    local_rank: int = 0
    owns_group: bool = field(default=False, compare=False)  # init() created the group
    pids: list[int] = field(default_factory=list, compare=False)  # by rank, after init()

    @classmethod
    def from_env(cls) -> World:
        env = os.environ
        return cls(
            int(env.get("WORLD_SIZE", "1")),
            int(env.get("RANK", "0")),
            int(env.get("LOCAL_RANK", "0")),
        )

    @property
    def launched(self) -> bool:
        """Started by torchrun (which sets WORLD_SIZE), with one process or several."""
        return "WORLD_SIZE" in os.environ

    @property
    def enabled(self) -> bool:
        return self.size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def device_name(self, requested: str) -> str:
        """Each process takes the GPU of its local rank."""
        if self.enabled and requested in ("auto", "cuda") and torch.cuda.is_available():
            return f"cuda:{self.local_rank}"
        return requested

    def init(self, device: torch.device, alone_too: bool = False) -> bool:
        """Join the process group (alone_too: torchrun's one process as well, which FSDP2
        needs); True if this call created it. A collective that waits longer than
        timeout_s() for another process fails instead of hanging."""
        if not (self.enabled or (alone_too and self.launched)) or dist.is_initialized():
            return False
        if device.type == "cuda":
            check_backend(device.type)
            torch.cuda.set_device(device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = datetime.timedelta(seconds=timeout_s())
        dist.init_process_group(backend, timeout=timeout)
        self.owns_group = True
        if self.enabled and threading.current_thread() is threading.main_thread():
            # As an exception, so the run can say why it ends (a peer died) and where to resume
            # from, instead of vanishing with no line.
            signal.signal(signal.SIGTERM, _raise_terminated)
        # Every process's id, so a failed collective can name the one that died.
        self.pids = self.gather(torch.tensor([os.getpid()])).tolist()
        return True

    def failure_line(self, err: BaseException) -> str | None:
        """One line for a collective that failed because another process died or hangs
        (None: err is something else)."""
        text = str(err)
        if not self.enabled or not (
            isinstance(err, (dist.DistError, Terminated)) or any(w in text for w in LOST_PEER_WORDS)
        ):
            return None
        # torchrun sends SIGTERM once it saw a rank exit: no need to wait for one to show
        dead = self._dead_peers(0.0 if isinstance(err, Terminated) else 3.0)
        if dead:
            names = ", ".join(f"rank {r} (pid {self.pids[r]})" for r in dead)
            return f"{names} stopped (killed or crashed), so rank {self.rank} stops too"
        if isinstance(err, Terminated):
            return f"rank {self.rank} was told to stop (SIGTERM) by its launcher"
        if "timed out" in text.lower() or "timeout" in text.lower():
            return (
                f"rank {self.rank} waited {timeout_s():g} s for the other processes in a "
                f"collective and gave up: one of them hangs ({TIMEOUT_ENV} sets the wait)"
            )
        return f"rank {self.rank} lost the other processes of the run ({text.splitlines()[0]})"

    def _dead_peers(self, wait_s: float = 3.0) -> list[int]:
        """The ranks whose process has exited; a socket closes as a killed process is torn
        down, a moment before it counts as exited, so this looks again for a while."""
        end = time.monotonic() + wait_s
        while True:
            dead = [r for r, pid in enumerate(self.pids) if r != self.rank and not _alive(pid)]
            if dead or time.monotonic() > end:
                return dead
            time.sleep(0.1)

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            t /= self.size
        return t

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        """Every process's t (the same shape on each) along dim 0, in rank order; t itself
        with one process. Returned on t's device."""
        if not self.enabled:
            return t
        local = t.to(self._collective_device(), torch.uint8 if t.dtype == torch.bool else t.dtype)
        parts = [torch.empty_like(local) for _ in range(self.size)]
        dist.all_gather(parts, local.contiguous())
        return torch.cat(parts).to(t.device, t.dtype)

    def flags_from_main(self, *flags: bool) -> list[bool]:
        """The main process's stop/save requests, so every rank acts on the same step."""
        if not self.enabled:
            return list(flags)
        t = torch.tensor([float(f) for f in flags], device=self._collective_device())
        dist.broadcast(t, 0)
        return [bool(v) for v in t.tolist()]

    def _collective_device(self) -> torch.device:
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
