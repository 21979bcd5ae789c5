"""Where a run trains and in which precision: decided here, for the trainer, CLI and window."""

from __future__ import annotations

import re
import sys

import torch

from core.errors import ConfigError


def flush_denormals() -> None:
    """Denormal floats (under 1.2e-38) send x86's kernels down a slow path, about 100x (a
    Qwen3.5 DeltaNet layer's triangular solves make them). Flushed to zero from here on: first
    thing in a training process, as threads torch starts later inherit the setting and those
    it started before keep theirs (docs/performance.md)."""
    torch.set_flush_denormal(True)


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


TORCH_INDEX = "https://download.pytorch.org/whl"  # PyTorch's own wheel index (the launchers')


def _archs(arch_list: list[str], prefix: str) -> list[int]:
    return [int(re.sub(r"\D", "", a[len(prefix) :])) for a in arch_list if a.startswith(prefix)]


def build_problem(
    gpu: str,
    capability: tuple[int, int],
    arch_list: list[str],
    torch_version: str = torch.__version__,
    python: str = sys.executable,
) -> str | None:
    """One line when this torch build has no kernels for the GPU (an RTX 50 card, sm_120, on a
    build older than cu128): torch only warns, then fails at the first kernel. A cubin runs on
    its major version's later minors; PTX (compute_XY) on any later GPU."""
    sms, ptx = _archs(arch_list, "sm_"), _archs(arch_list, "compute_")
    if not sms and not ptx:
        return None  # a build that does not say: nothing to judge
    major, minor = capability
    cap = major * 10 + minor
    if any(s // 10 == major and s <= cap for s in sms) or any(p <= cap for p in ptx):
        return None
    newer = all(a < cap for a in sms + ptx)
    variant = "cu128" if major >= 10 else "cu126"  # Blackwell (sm_100, sm_120) needs CUDA 12.8
    span = f"sm_{min(sms + ptx)}..sm_{max(sms + ptx)}"
    base = torch_version.split("+")[0]
    return (
        f"GPU {gpu} (sm_{cap}) is {'newer' if newer else 'older'} than this torch build "
        f"({torch_version}, kernels for {span}); reinstall a {variant}"
        f'{" or newer" if newer else ""} build: "{python}" -m pip install --force-reinstall '
        f"torch=={base}+{variant} --index-url {TORCH_INDEX}/{variant}"
    )


def gpu_build_problem(index: int) -> str | None:
    """build_problem for this machine's CUDA GPU number index."""
    arch_list = torch.cuda.get_arch_list()  # [] on a CPU build: nothing to compare
    if not arch_list:
        return None
    props = torch.cuda.get_device_properties(index)
    return build_problem(props.name, (props.major, props.minor), arch_list)


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
            f"{build}); use --device cpu or install a CUDA build of torch",
            field="device",
        )
    if index >= count:
        raise ConfigError(
            f"device: {name} does not exist; this machine has "
            f"{count} GPU(s): cuda:0..cuda:{count - 1}",
            field="device",
        )
    problem = gpu_build_problem(index)
    if problem:  # before any training: torch would fail at its first kernel
        raise ConfigError(f"device: {problem}", field="device")
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
        raise ConfigError(
            "precision: bf16 is not supported by this GPU; use fp16 or auto", field="precision"
        )
    if not on_gpu and chosen == "fp16":
        raise ConfigError(
            "precision: fp16 needs a CUDA GPU; on the CPU use fp32 (or auto)", field="precision"
        )
    return chosen


def is_oom(err: BaseException) -> bool:
    """A CUDA (or CPU allocator) out-of-memory error, whichever class torch raised it as."""
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and "out of memory" in str(err)
    )
