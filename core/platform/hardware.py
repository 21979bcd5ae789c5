"""What hardware is here, and how much memory a run is using (torch allocator, NVML, RSS)."""

from __future__ import annotations

import os
import platform
import threading
import time

import psutil
import torch

from core.platform.device import gpu_build_problem

MB = 1024**2

_nvml = None  # the pynvml module once initialised, False when NVML is unavailable


def nvml():
    """pynvml, initialised once; None where there is no NVIDIA driver."""
    global _nvml
    if _nvml is None:
        try:
            import pynvml

            pynvml.nvmlInit()
            _nvml = pynvml
        except Exception:  # no driver, no library, no GPU: all mean "no NVML"
            _nvml = False
    return _nvml or None


def _nvml_handle(index: int):
    lib = nvml()
    if lib is None:
        return None, None
    try:
        return lib, lib.nvmlDeviceGetHandleByIndex(index)
    except Exception:
        return None, None


def nvml_stats(index: int) -> dict:
    """Device-wide used/total memory, utilisation, temperature and power; {} without NVML."""
    lib, h = _nvml_handle(index)
    if h is None:
        return {}
    out = {}
    readers = {
        "nvml_used_mb": lambda: lib.nvmlDeviceGetMemoryInfo(h).used / MB,
        "nvml_total_mb": lambda: lib.nvmlDeviceGetMemoryInfo(h).total / MB,
        "gpu_util": lambda: float(lib.nvmlDeviceGetUtilizationRates(h).gpu),
        "gpu_temp_c": lambda: float(lib.nvmlDeviceGetTemperature(h, lib.NVML_TEMPERATURE_GPU)),
        "gpu_power_w": lambda: lib.nvmlDeviceGetPowerUsage(h) / 1000.0,
    }
    for key, read in readers.items():
        try:
            out[key] = round(read(), 1)
        except Exception:  # a field this card or driver does not report
            continue
    return out


class NvmlWatch:
    """NVML read on its own thread, every interval_s: a train record takes the latest
    reading, so no step waits on the driver (a reading costs milliseconds)."""

    def __init__(self, index: int, interval_s: float = 1.0, read=None):
        self.index, self.interval_s = index, interval_s
        self.read = read or nvml_stats
        self.latest: dict = {}  # replaced whole, never changed: a reader sees one reading
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="traindeck-nvml", daemon=True)

    def start(self) -> NvmlWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            self.latest = self.read(self.index)
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


def memory_stats(device: torch.device, watch: NvmlWatch | None = None) -> dict:
    """Memory fields for a train record: the allocator's counters (host-side, no sync) and,
    on a GPU, NVML's latest reading from watch (None: read here)."""
    if device.type == "cuda":
        idx = device.index or 0
        out = {
            "mem_allocated_mb": round(torch.cuda.memory_allocated(idx) / MB, 1),
            "mem_reserved_mb": round(torch.cuda.memory_reserved(idx) / MB, 1),
            "mem_peak_mb": round(torch.cuda.max_memory_allocated(idx) / MB, 1),
        }
        out.update(watch.latest if watch is not None else nvml_stats(idx))
        return out
    return {"rss_mb": round(psutil.Process().memory_info().rss / MB, 1)}


CARD_FIELDS = ("card_reserved_mb", "card_used_mb")  # a layer split's, by device name


def card_stats(devices: list[torch.device], watches: dict) -> dict:
    """A layer split's memory per card for a train record, each field {device: MiB}: the
    allocator's reserved bytes, and NVML's used memory where every card's watch (watches:
    {device: NvmlWatch}) has read it."""
    reserved = {str(d): round(torch.cuda.memory_reserved(d) / MB, 1) for d in devices}
    out = {"card_reserved_mb": reserved}
    used = {str(d): (watches.get(d).latest if watches.get(d) else {}) for d in devices}
    used = {k: v.get("nvml_used_mb") for k, v in used.items()}
    if all(v is not None for v in used.values()):
        out["card_used_mb"] = used
    return out


def gpus() -> list[dict]:
    """Every CUDA GPU: name, VRAM total/free, capability, bf16, driver."""
    if not torch.cuda.is_available():
        return []
    found = []
    driver = ""
    lib = nvml()
    if lib is not None:
        try:
            driver = lib.nvmlSystemGetDriverVersion()
            driver = driver.decode() if isinstance(driver, bytes) else driver
        except Exception:
            driver = ""
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        total = props.total_memory
        free = None
        stats = nvml_stats(i)
        if "nvml_total_mb" in stats:
            free = (stats["nvml_total_mb"] - stats["nvml_used_mb"]) * MB
        else:
            try:
                free, total = torch.cuda.mem_get_info(i)
            except Exception:
                free = None
        found.append(
            {
                "index": i,
                "name": props.name,
                "total_bytes": int(total),
                "free_bytes": int(free) if free is not None else None,
                "capability": f"{props.major}.{props.minor}",
                "bf16": props.major >= 8,
                "tf32": props.major >= 8,
                "driver": driver,
                "build_problem": gpu_build_problem(i),
            }
        )
    return found


def cpu_info() -> dict:
    return {
        "name": platform.processor() or platform.machine(),
        "cores": os.cpu_count() or 1,
        "ram_bytes": psutil.virtual_memory().total,
        "ram_free_bytes": psutil.virtual_memory().available,
    }


def _matmul_tflops(device: str, dtype: torch.dtype, n: int = 1024, reps: int = 5) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b  # warm up
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e12


def test_gpu_report() -> str:
    """The --test-gpu diagnostic: build, CUDA, driver, GPUs, a short matmul speed check."""
    lines = [
        f"Python      {platform.python_version()} ({platform.system()} {platform.machine()})",
        f"torch       {torch.__version__}",
        f"CUDA build  {torch.version.cuda or 'none (this torch is a CPU-only build)'}",
        f"cuDNN       {torch.backends.cudnn.version() or '-'}",
    ]
    found = gpus()
    if not found:
        cpu = cpu_info()
        lines.append("GPU         no CUDA GPU found - training runs on the CPU")
        if torch.version.cuda is None:
            lines.append(
                "            (if this machine has an NVIDIA GPU, install a CUDA build of torch:"
                " run train_gpu.bat / train_gpu.sh, which picks it from PyTorch's wheel index)"
            )
        lines.append(
            f"CPU         {cpu['name']}, {cpu['cores']} cores, "
            f"{cpu['ram_bytes'] / 1024**3:.1f} GiB RAM"
        )
        lines.append(
            f"matmul      fp32 {_matmul_tflops('cpu', torch.float32, 512):.3f} TFLOP/s (CPU)"
        )
        return "\n".join(lines)
    lines.append(f"driver      {found[0]['driver'] or 'unknown (NVML unavailable)'}")
    for g in found:
        free = (
            f"{g['free_bytes'] / 1024**3:.1f} GiB free" if g["free_bytes"] is not None else "free ?"
        )
        lines.append(
            f"GPU {g['index']}       {g['name']}: {g['total_bytes'] / 1024**3:.1f} GiB, {free}, "
            f"capability {g['capability']}, bf16 {'yes' if g['bf16'] else 'no'}, "
            f"TF32 {'yes' if g['tf32'] else 'no'}"
        )
        if g.get("build_problem"):
            lines.append(f"  PROBLEM   {g['build_problem']}")
            continue  # its kernels would fail
        dev = f"cuda:{g['index']}"
        speeds = [f"fp32 {_matmul_tflops(dev, torch.float32, 4096):.1f}"]
        speeds.append(f"fp16 {_matmul_tflops(dev, torch.float16, 4096):.1f}")
        if g["bf16"]:
            speeds.append(f"bf16 {_matmul_tflops(dev, torch.bfloat16, 4096):.1f}")
        lines.append(f"  matmul    {', '.join(speeds)} TFLOP/s")
    return "\n".join(lines)
