"""NVML and CUDA paths, exercised with fakes: CI has no GPU (real runs are in docs/gpu.md)."""

import types

import pytest
import torch

from core.errors import ConfigError
from core.platform import hardware
from core.platform.device import (
    build_problem,
    cuda_device_count,
    gpu_index,
    inference_device,
    pick_precision,
    resolve_device,
    resolve_precision,
)


def fake_pynvml(used_mb=3000, total_mb=8192):
    mib = 1024**2
    return types.SimpleNamespace(
        NVML_TEMPERATURE_GPU=0,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(
            used=used_mb * mib, total=total_mb * mib
        ),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=87),
        nvmlDeviceGetTemperature=lambda h, kind: 64,
        nvmlDeviceGetPowerUsage=lambda h: 215_500,  # milliwatts
        nvmlSystemGetDriverVersion=lambda: "560.94",
    )


def test_nvml_fields_are_read_in_plain_units(monkeypatch):
    monkeypatch.setattr(hardware, "_nvml", fake_pynvml())
    assert hardware.nvml_stats(0) == {
        "nvml_used_mb": 3000.0,
        "nvml_total_mb": 8192.0,
        "gpu_util": 87.0,
        "gpu_temp_c": 64.0,
        "gpu_power_w": 215.5,
    }


def test_a_field_the_card_does_not_report_is_left_out(monkeypatch):
    nv = fake_pynvml()

    def unsupported(h):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    nv.nvmlDeviceGetPowerUsage = unsupported
    monkeypatch.setattr(hardware, "_nvml", nv)
    stats = hardware.nvml_stats(0)
    assert "gpu_power_w" not in stats and stats["gpu_util"] == 87.0


def test_no_nvidia_driver_means_no_nvml_fields(monkeypatch):
    monkeypatch.setattr(hardware, "_nvml", False)
    assert hardware.nvml_stats(0) == {}
    cpu = hardware.memory_stats(torch.device("cpu"))
    assert set(cpu) == {"rss_mb"} and cpu["rss_mb"] > 10


def test_gpu_list_with_a_simulated_card(monkeypatch):
    monkeypatch.setattr(hardware, "_nvml", fake_pynvml(used_mb=1024, total_mb=8192))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    props = types.SimpleNamespace(
        name="NVIDIA GeForce RTX 4060", total_memory=8192 * 1024**2, major=8, minor=9
    )
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    (gpu,) = hardware.gpus()
    assert gpu["name"] == "NVIDIA GeForce RTX 4060" and gpu["driver"] == "560.94"
    assert gpu["free_bytes"] == 7168 * 1024**2 and gpu["capability"] == "8.9" and gpu["bf16"]


def test_precision_choice(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_precision("auto", cpu) == "fp32"  # never bf16 on a CPU by default
    assert resolve_precision("bf16", cpu) == "bf16"  # asked for explicitly
    with pytest.raises(ConfigError, match="fp16 needs a CUDA GPU"):
        resolve_precision("fp16", cpu)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert resolve_precision("auto", cuda) == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert resolve_precision("auto", cuda) == "fp16"  # Turing and older: fp16 + GradScaler
    with pytest.raises(ConfigError, match="bf16 is not supported by this GPU"):
        resolve_precision("bf16", cuda)


def test_one_rule_for_which_gpu_a_device_setting_means():
    assert gpu_index("auto", 0) is None and gpu_index("cpu", 2) is None
    assert gpu_index("auto", 2) == 0 and gpu_index("cuda", 1) == 0 and gpu_index("cuda:3", 4) == 3
    assert pick_precision("auto", on_gpu=False) == "fp32"
    assert pick_precision("auto", on_gpu=True, bf16_ok=False) == "fp16"
    assert pick_precision("fp16", on_gpu=False) == "fp16"  # mapping only; resolve_precision refuses


def test_device_choice(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto").type == "cpu"
    with pytest.raises(ConfigError, match="device: cuda:1 requested but CUDA is not available"):
        resolve_device("cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("auto").type == "cuda"
    with pytest.raises(ConfigError, match=r"cuda:1 does not exist; this machine has 1 GPU"):
        resolve_device("cuda:1")


def test_gpu_count_and_inference_device_follow_torch_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # a driver without usable CUDA
    assert cuda_device_count() == 0
    assert inference_device(busy=False) == "cpu" and inference_device(busy=True) == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cuda_device_count() == 2
    assert inference_device(busy=False) == "cuda"
    assert inference_device(busy=True) == "cpu"  # a training run keeps the GPU to itself


def test_window_and_playground_ask_core_device_where_to_run(monkeypatch):
    from helpers import tiny_config

    from gui.playground import Playground
    from gui.worker import TrainThread

    monkeypatch.setattr(
        torch.cuda, "is_available", lambda: False
    )  # only core.platform.device decides
    monkeypatch.setattr("gui.worker.cuda_device_count", lambda: 1)
    monkeypatch.setattr("core.platform.device.cuda_device_count", lambda: 1)

    def on_cpu(device):
        return TrainThread._on_cpu(types.SimpleNamespace(cfg=tiny_config(device=device)))

    assert not on_cpu("auto") and on_cpu("cpu")
    busy = []
    playground = types.SimpleNamespace(training_active=lambda: bool(busy))
    assert Playground.device(playground) == "cuda"
    busy.append(1)
    assert Playground.device(playground) == "cpu"


def test_bf16_autocast_path_trains_on_the_cpu(tmp_path):
    from helpers import tiny_config

    from core.runs.folder import read_metrics
    from core.training.trainer import Trainer

    result = Trainer(tiny_config(precision="bf16", max_steps=3), tmp_path / "r").run()
    assert result["status"] == "finished"
    train, evals = read_metrics(tmp_path / "r" / "metrics.jsonl")
    assert len(train) == 3 and all(4.0 < r["loss"] < 6.5 for r in train)


CU126 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
CU128 = ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


def test_an_rtx_50_card_on_a_build_without_sm_120_gets_the_reinstall_line():
    line = build_problem("NVIDIA GeForce RTX 5090", (12, 0), CU126, "2.13.0+cu126", "py")
    assert line.startswith("GPU NVIDIA GeForce RTX 5090 (sm_120) is newer than this torch build")
    assert "2.13.0+cu126, kernels for sm_50..sm_90" in line
    assert line.endswith(
        '"py" -m pip install --force-reinstall torch==2.13.0+cu128 '
        "--index-url https://download.pytorch.org/whl/cu128"
    )
    assert build_problem("NVIDIA GeForce RTX 5090", (12, 0), CU128, "2.13.0+cu128") is None


def test_a_gpu_the_build_covers_by_minor_version_or_ptx_is_fine():
    assert build_problem("RTX 4090", (8, 9), CU126) is None  # sm_86 cubins run on sm_89
    assert build_problem("H100", (9, 0), ["sm_80", "compute_80"]) is None  # PTX, compiled JIT
    assert build_problem("A100", (8, 0), ["sm_86"]) is not None  # a later minor does not run
    assert build_problem("any", (12, 0), []) is None  # a build that does not say


def blackwell_on_cu126(monkeypatch):
    monkeypatch.setattr(hardware, "_nvml", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: CU126)
    props = types.SimpleNamespace(
        name="NVIDIA GeForce RTX 5080", total_memory=16 * 1024**3, major=12, minor=0
    )
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (15 * 1024**3, 16 * 1024**3))


def test_training_on_such_a_gpu_is_refused_before_it_starts(monkeypatch):
    blackwell_on_cu126(monkeypatch)
    with pytest.raises(ConfigError, match=r"device: GPU NVIDIA GeForce RTX 5080 \(sm_120\)"):
        resolve_device("auto")
    assert resolve_device("cpu").type == "cpu"  # the CPU still trains
    (gpu,) = hardware.gpus()
    assert "torch==" in gpu["build_problem"] and "/whl/cu128" in gpu["build_problem"]


def test_the_cli_says_it_in_one_line_and_exits_2(monkeypatch, tmp_path, capsys):
    from core.train import main

    blackwell_on_cu126(monkeypatch)
    code = main(["--preset", "cpu-tiny", "--device", "cuda", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "RTX 5080 (sm_120) is newer" in err[0]
    assert not (tmp_path / "run").exists()
