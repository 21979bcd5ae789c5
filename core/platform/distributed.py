"""Multi-GPU through PyTorch's own launcher: `torchrun --nproc_per_node N -m core.train ...`.

torchrun sets WORLD_SIZE/RANK/LOCAL_RANK; with one process nothing here does anything, so a
single-GPU or CPU run takes exactly the code path it always did.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class World:
    size: int = 1
    rank: int = 0
    local_rank: int = 0
    owns_group: bool = field(default=False, compare=False)  # init() created the group

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

    def init(self, device: torch.device) -> bool:
        """Join the process group; True if this call created it."""
        if not self.enabled or dist.is_initialized():
            return False
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        self.owns_group = True
        return True

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
