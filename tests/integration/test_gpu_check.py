"""benchmarks/gpu_check.py, the prepared GPU check, runs every section at toy size on the CPU,
so it cannot rot before a GPU appears; its budget logic and its sizing are checked too."""

from __future__ import annotations

import json
import shutil
import signal

import pytest

from benchmarks import gpu_check


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    rc = gpu_check.main(["--smoke", "--device", "cpu", "--out", str(out)])
    return rc, out, json.loads((out / "gpu_check.json").read_text())


def test_the_smoke_run_runs_every_section_and_writes_its_files(smoke):
    rc, out, data = smoke
    assert rc == 0
    names = [name for name, _ in gpu_check.SECTIONS.values()]
    assert list(data["sections"]) == names
    assert {s["status"] for s in data["sections"].values()} == {"ok"}
    # At most three files, and no scratch left behind in DIR.
    assert {p.name for p in out.iterdir()} <= {"gpu_check.json", "gpu_check.md", "gpu_check.png"}
    md = (out / "gpu_check.md").read_text()
    for sec in gpu_check.SECTIONS.values():
        assert sec[1] in md
    assert data["device_name"].endswith("cores") and data["torch"]


def test_the_smoke_rows_hold_what_each_section_checks(smoke):
    _, _, data = smoke
    s = data["sections"]
    runs = [r["run"] for r in s["memory"]["rows"]]
    dense = [*gpu_check.TIER_PRESETS, "0.5B full", "0.5B lora", "0.5B lora+ckpt"]
    # the MoE and hybrid starts: a Qwen3-MoE and a Qwen3.5 from their configs
    assert runs == [*dense, "MoE 0.5B lora", "Hybrid 0.5B lora"]
    assert all(row["estimate alloc MiB"] > 0 for row in s["memory"]["rows"][-2:])
    assert [r["preset"] for r in s["throughput"]["rows"]][0] == "gpu-8gb eager"
    assert all(r["tokens/s"] > 0 for r in s["throughput"]["rows"])
    oom = s["oom"]["rows"][0]
    assert oom["OOM recoveries"] == 1 and oom["same effective batch"]
    assert "recovered with the same effective batch" in s["oom"]["lines"]
    assert (
        "exact resume: every step's loss equal to the uninterrupted run's"
        in s["precision"]["lines"]
    )
    assert [r["preset"] for r in s["tiers"]["rows"]] == list(gpu_check.TIER_PRESETS)
    assert all(r["OOM recoveries"] == 0 for r in s["tiers"]["rows"])
    assert len(data["curves"]) >= len(gpu_check.TIER_PRESETS)
    # long context: 2 models x 2 cards x offload or not, predicted; offloading and a larger
    # card buy context, a larger model costs it; the two points trained
    line = s["long"]["lines"][0].split(": ", 1)[1]
    longest = {
        p.rsplit(" ", 1)[0]: int(p.rsplit(" ", 1)[1].replace(",", "")) for p in line.split("; ")
    }
    assert len(longest) == 8 and all(v > 0 for v in longest.values())
    for model in ("0.5B", "1.5B"):
        assert longest[f"{model} 16 GB offloaded"] >= longest[f"{model} 16 GB"]
        assert longest[f"{model} 24 GB"] >= longest[f"{model} 16 GB"]
    assert longest["1.5B 16 GB"] < longest["0.5B 16 GB"]
    assert longest["1.5B 16 GB offloaded"] > longest["1.5B 16 GB"]  # where offloading decides
    points = s["long"]["rows"]
    assert [r["status"] for r in points] == ["finished"] * 2 and points[1]["point"].endswith("True")


def test_cuda_only_parts_say_they_were_skipped(smoke):
    _, _, data = smoke
    s = data["sections"]
    assert "CPU: skipped, NCCL needs CUDA" in s["torchrun"]["lines"]
    assert any("fp16 with the GradScaler skipped" in line for line in s["precision"]["lines"])
    assert any("out-of-memory error is injected" in line for line in s["oom"]["lines"])
    assert any("transformers + peft side is left out" in line for line in s["vs_peft"]["lines"])
    assert "CPU: the two points train at 256 tokens, no memory fraction" in s["long"]["lines"]


def test_the_full_check_is_predicted_to_fit_its_budget_on_an_h100(smoke):
    """Sizing without a GPU: what must run (everything but the compiled rows) is predicted to
    take at most 250 of the 360 s, which leaves the compiled rows the rest."""
    _, _, data = smoke
    assert 60 < data["predicted_gpu_essential_s"] <= 250
    assert data["predicted_gpu_total_s"] > data["predicted_gpu_essential_s"]
    for s in data["sections"].values():
        assert s["predicted_gpu_s"] >= s["essential_gpu_s"] >= 0


def test_a_budget_too_small_skips_with_a_line_and_still_writes(tmp_path):
    rc = gpu_check.main(
        ["--smoke", "--device", "cpu", "--out", str(tmp_path), "--budget", "0", "--only", "d,tiers"]
    )
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert rc == 0 and list(data["sections"]) == ["oom", "tiers"]
    for s in data["sections"].values():
        assert s["status"] == "partial" and s["rows"] == []
        assert any(line.startswith("skipped ") and "s to spare" in line for line in s["lines"])


def test_an_unknown_section_is_one_line_and_exit_2(tmp_path, capsys):
    assert gpu_check.main(["--smoke", "--out", str(tmp_path), "--only", "a,nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: --only: unknown section 'nope'; allowed: a memory, b throughput, c vs_peft, "
        "d oom, e precision, f nvml, g torchrun, h tiers, i long"
    ]


def test_the_torchrun_child_all_reduces_then_trains(tmp_path, monkeypatch):
    """What torchrun starts in section g, here in this process with gloo (the GPU: NCCL)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    for key, value in {**env, "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    data = tmp_path / "corpus.txt"
    data.write_text("def add(a, b):\n    return a + b\n" * 400)
    cmd = gpu_check.torchrun_command(tmp_path / "run", data, 3)
    args = cmd[cmd.index("--torchrun-child") + 1 :]
    args[args.index("cuda")] = "cpu"
    args += ["--hidden-dim", "32", "--n-layers", "1", "--n-heads", "2", "--seq-len", "32"]
    args += ["--batch-size", "2", "--grad-accum", "1", "--precision", "fp32"]
    kinds = [signal.SIGINT, *([signal.SIGUSR1] if hasattr(signal, "SIGUSR1") else [])]
    handlers = {k: signal.getsignal(k) for k in kinds}  # core.train installs its own
    try:
        assert gpu_check.main(["--torchrun-child", *args]) == 0
    finally:
        for kind, handler in handlers.items():
            signal.signal(kind, handler)
    assert len(gpu_check.losses_of(tmp_path / "run")) == 3


@pytest.mark.slow  # importing peft alone takes ~8 s on 2 cores
def test_the_peft_side_trains_the_toy_model_on_the_cpu(tmp_path):
    """Section c's transformers + peft side, which --smoke leaves out, on the toy model."""
    import argparse

    args = argparse.Namespace(smoke=True, device="cpu", budget=60, out=str(tmp_path), only=None)
    ck = gpu_check.Check(args)
    try:
        row = gpu_check.peft_side(gpu_check.model_folder(ck), 2, 32, 4, device="cpu")
    finally:
        shutil.rmtree(ck.work, ignore_errors=True)
    assert row["tokens/s"] > 0 and row["trainable"] > 0
    first, last = (float(v) for v in row["loss first, last"].split(", "))
    assert last < first  # the adapters learn the repeated batch


def test_the_shrunk_card_holds_half_the_micro_batch_but_not_all_of_it(monkeypatch):
    """Section d's memory fraction, on a mocked 80 GB card, by the estimate."""
    import dataclasses
    import types

    import torch

    from core.config import presets
    from core.training.estimate import estimate

    total = 80 * 1024**3
    props = types.SimpleNamespace(total_memory=total)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    cfg = presets.to_config(presets.load_preset(gpu_check.OOM_PRESET))
    cfg = dataclasses.replace(cfg, batch_size=cfg.batch_size * 2, grad_accum=1, device="cuda")
    allowed = gpu_check.oom_fraction(cfg) * total
    half = dataclasses.replace(cfg, batch_size=cfg.batch_size // 2)
    assert estimate(half).allocator_peak < allowed < estimate(cfg).allocator_peak
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    assert gpu_check.card_peak() == 989e12
