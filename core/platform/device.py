"""Where a run trains and in which precision: decided here, for the trainer, CLI and window."""

from __future__ import annotations

import torch

from core.errors import ConfigError


def gpu_index(device: str, gpu_count: int) -> int | None:
    """The CUDA index a device setting trains on, or None for the CPU (existence unchecked)."""
    if device == "cpu" or (device == "auto" and gpu_count == 0):
        return None
    return int(device.split(":")[1]) if ":" in device else 0


def cuda_device_count() -> int:
    """How many CUDA GPUs torch can use here (0 without a usable CUDA build or driver)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def inference_device(busy: bool) -> str:
    """Where the window generates text: the GPU when one exists and no run is training on
    it (busy), else the CPU, so a training run keeps the GPU and its memory to itself."""
    return "cuda" if not busy and cuda_device_count() > 0 else "cpu"


def resolve_device(name: str) -> torch.device:
    """The torch.device for a config's device setting; a missing GPU is a ConfigError."""
    count = cuda_device_count()
    index = gpu_index(name, count)
    if index is None:
        return torch.device("cpu")
    if count == 0:
        build = "a CPU-only build" if torch.version.cuda is None else "no usable GPU"
        raise ConfigError(
            f"device: {name} requested but CUDA is not available (torch {torch.__version__}, "
            f"{build}); use --device cpu or install a CUDA build of torch"
        )
    if index >= count:
        raise ConfigError(
            f"device: {name} does not exist; this machine has "
            f"{count} GPU(s): cuda:0..cuda:{count - 1}"
        )
    return torch.device("cuda", index) if ":" in name else torch.device("cuda")


def pick_precision(requested: str, on_gpu: bool, bf16_ok: bool = True) -> str:
    """What "auto" means: bf16 (fp16 where the GPU lacks bf16) on a GPU, fp32 on a CPU.

    auto never picks bf16 on a CPU: on many CPUs bf16 matmuls are hundreds of times slower.
    """
    if requested != "auto":
        return requested
    if on_gpu:
        return "bf16" if bf16_ok else "fp16"
    return "fp32"


def resolve_precision(precision: str, device: torch.device) -> str:
    """pick_precision for a real device, refusing what it cannot run."""
    on_gpu = device.type == "cuda"
    bf16_ok = on_gpu and torch.cuda.is_bf16_supported()
    chosen = pick_precision(precision, on_gpu, bf16_ok)
    if on_gpu and chosen == "bf16" and not bf16_ok:
        raise ConfigError("precision: bf16 is not supported by this GPU; use fp16 or auto")
    if not on_gpu and chosen == "fp16":
        raise ConfigError("precision: fp16 needs a CUDA GPU; on the CPU use fp32 (or auto)")
    return chosen


def is_oom(err: BaseException) -> bool:
    """A CUDA (or CPU allocator) out-of-memory error, whichever class torch raised it as."""
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and "out of memory" in str(err)
    )
