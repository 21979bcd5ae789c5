"""benchmarks/gpu_check.py, the prepared GPU check, runs every section at toy size on the CPU,
so it cannot rot before a GPU appears; its budget logic and its sizing are checked too."""

from __future__ import annotations

import argparse
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
    assert list(data["sections"]) == names and names[0] == "speed"  # the speed section first
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


def test_the_speed_section_holds_raw_rows_of_every_side_it_ran(smoke):
    """The speed section's JSON: raw figures in the rows the issue names (no ratios), the
    device's name; on the CPU TrainDeck's runs are uncompiled, the transformers side of full
    fine-tuning runs, and peft's sides are left out of a smoke run with a line."""
    _, out, data = smoke
    speed = data["sections"]["speed"]
    assert speed["device"] == data["device_name"]
    lora, full, presets = speed["lora"], speed["full"], speed["presets"]
    assert [(r["side"], r["checkpointing"]) for r in lora] == [
        ("traindeck", False),
        ("traindeck", True),
    ]
    assert [(r["side"], r["checkpointing"]) for r in full] == [
        ("traindeck", False),
        ("transformers", False),
    ]
    for row in lora + full:
        assert set(row) >= {"side", "checkpointing", "tokens_per_s", "peak_mib"}
        assert row["tokens_per_s"] > 0 and row["peak_mib"] is None  # no allocator on a CPU
        assert not any("ratio" in key or "/" in key for key in row)
    for row in lora + full[:1]:
        assert row["compiled"] is False and row["first_step_s"] > 0
    assert [r["preset"] for r in presets] == list(gpu_check.COMPILE_ORDER)
    for row in presets:
        assert row["compiled"] is False and row["tokens_per_s"] > 0 and row["first_step_s"] > 0
        assert row["mfu"] is None  # no peak for a CPU
    # TrainDeck's LoRA step under the profiler: its 12 operators with the most time
    assert len(speed["profile"]) == 12 and all(r["ms"] >= 0 for r in speed["profile"])
    lines = speed["lines"]
    assert any(line.startswith("transformers + peft: left out of a smoke run") for line in lines)
    assert any(line.startswith("transformers + peft + Liger: left out") for line in lines)
    md = (out / "gpu_check.md").read_text()
    assert "full, without checkpointing: TrainDeck" in md and "transformers's tokens/s" in md


def test_a_failing_side_costs_the_speed_section_only_its_row(tmp_path, monkeypatch):
    """On a lent GPU there is no second try: a side that fails (a Liger kernel, say) is a
    line, and the section's other rows still run; the check's exit code says it failed."""

    def broken(*args, **kwargs):
        raise RuntimeError("a kernel failed")

    monkeypatch.setattr(gpu_check, "hf_side", broken)
    args = ["--smoke", "--device", "cpu", "--out", str(tmp_path), "--only", "speed"]
    assert gpu_check.main(args) == 1
    speed = json.loads((tmp_path / "gpu_check.json").read_text())["sections"]["speed"]
    assert speed["status"] == "failed"
    assert "transformers full failed: RuntimeError: a kernel failed" in speed["lines"]
    assert [r["side"] for r in speed["full"]] == ["traindeck"]
    assert len(speed["lora"]) == 2 and len(speed["presets"]) == len(gpu_check.COMPILE_ORDER)


def test_a_device_record_is_kept_only_when_its_speed_rows_are_whole(smoke, tmp_path, capsys):
    """--record keeps a GPU's gpu_check.json as docs/gpu/<device>-<date>.json; a smoke run,
    a row without a figure or an existing record is refused in one line."""
    _, out, data = smoke
    assert gpu_check.main(["--record", str(out / "gpu_check.json"), str(tmp_path)]) == 2
    assert "only a GPU's full-size run is kept" in capsys.readouterr().err
    device = dict(data, smoke=False, capability="9.0", device_name="NVIDIA H100 80GB HBM3")
    speed = device["sections"]["speed"]
    for row in speed["lora"] + speed["full"]:
        row["peak_mib"] = 1000.0
    source = tmp_path / "gpu_check.json"
    source.write_text(json.dumps(device))
    folder = tmp_path / "docs-gpu"
    assert gpu_check.main(["--record", str(source), str(folder)]) == 0
    kept = folder / f"nvidia-h100-80gb-hbm3-{data['date']}.json"
    assert capsys.readouterr().out.strip() == str(kept)
    assert json.loads(kept.read_text())["sections"]["speed"]["lora"] == speed["lora"]
    assert gpu_check.main(["--record", str(source), str(folder)]) == 2  # never overwritten
    assert "exists" in capsys.readouterr().err
    speed["lora"][0]["tokens_per_s"] = None
    source.write_text(json.dumps(device))
    assert gpu_check.main(["--record", str(source), str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --record {source}: speed.lora[0].tokens_per_s: None is not a float"]


def test_the_warm_start_child_trains_the_same_config_from_a_file(tmp_path, capsys):
    """The speed section's second process (on a GPU its compiled code comes from the cache),
    here in this process: the first run's config round-trips through JSON and trains."""
    import argparse

    args = argparse.Namespace(smoke=True, device="cpu", budget=60, out=str(tmp_path), only=None)
    ck = gpu_check.Check(args)
    try:
        cfg = gpu_check.speed_cfg(ck, gpu_check.model_folder(ck), "lora", False, steps=3)
        cfg_file = tmp_path / "cfg.json"
        cfg_file.write_text(json.dumps(cfg.to_dict(), default=str))
        cmd = gpu_check.warm_command(cfg_file, tmp_path / "warm")
        assert gpu_check.main(cmd[cmd.index("--warm-start-child") :]) == 0
    finally:
        shutil.rmtree(ck.work, ignore_errors=True)
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["status"] == "finished" and out["compiled"] is False
    assert out["first_step_s"] > 0 and out["first_step_at"] > 0
    assert len(gpu_check.losses_of(tmp_path / "warm" / "run")) == cfg.max_steps


def test_liger_patch_is_undone_for_the_plain_sides_after_it():
    """Liger's Qwen2 patch changes transformers' module for the whole process; the speed
    section's plain transformers sides run after it, so the patch is undone."""
    from transformers.models.qwen2 import modeling_qwen2

    from benchmarks.sides import liger_patched

    mlp, forward = modeling_qwen2.Qwen2MLP, modeling_qwen2.Qwen2ForCausalLM.forward
    with liger_patched():
        modeling_qwen2.Qwen2MLP = object
        modeling_qwen2.Qwen2ForCausalLM.forward = lambda self: None
    assert modeling_qwen2.Qwen2MLP is mlp
    assert modeling_qwen2.Qwen2ForCausalLM.forward is forward


def test_cuda_only_parts_say_they_were_skipped(smoke):
    _, _, data = smoke
    s = data["sections"]
    assert "CPU: skipped, NCCL needs CUDA" in s["torchrun"]["lines"]
    assert any("fp16 with the GradScaler skipped" in line for line in s["precision"]["lines"])
    assert any("out-of-memory error is injected" in line for line in s["oom"]["lines"])
    assert any("transformers + peft side is left out" in line for line in s["vs_peft"]["lines"])
    assert "CPU: the two points train at 256 tokens, no memory fraction" in s["long"]["lines"]


def test_the_full_check_is_predicted_to_fit_its_budget_on_an_h100(smoke):
    """Sizing without a GPU: what must run (everything but the optional compiled rows) is
    predicted to fit the default budget with room for the last row's overrun, and the speed
    section within its own 240 s."""
    _, _, data = smoke
    assert 60 < data["predicted_gpu_essential_s"] <= gpu_check.BUDGET_S - 25
    speed = data["sections"]["speed"]
    assert speed["essential_gpu_s"] <= speed["predicted_gpu_s"] <= gpu_check.SPEED_LIMIT_S
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
        "error: --only: unknown section 'nope'; allowed: s speed, a memory, b throughput, "
        "c vs_peft, d oom, e precision, f nvml, g torchrun, h tiers, i long, j multi_gpu"
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
    """The transformers + peft side of sections c and s, which --smoke leaves out, on the toy
    model, with and without checkpointing; and full fine-tuning's transformers side."""
    import argparse

    args = argparse.Namespace(smoke=True, device="cpu", budget=60, out=str(tmp_path), only=None)
    ck = gpu_check.Check(args)
    try:
        folder = gpu_check.model_folder(ck)
        rows = [
            gpu_check.hf_side(folder, side, 2, 32, 4, device="cpu", checkpointing=ckpt)
            for side, ckpt in (("peft", False), ("peft", True), ("transformers", False))
        ]
    finally:
        shutil.rmtree(ck.work, ignore_errors=True)
    for row in rows:
        assert row["tokens/s"] > 0
        first, last = (float(v) for v in row["loss first, last"].split(", "))
        assert last < first  # the model learns the repeated batch
    assert rows[0]["trainable"] == rows[1]["trainable"] < rows[2]["trainable"]  # adapters only
    assert rows[0]["loss first, last"].split(", ")[0] == rows[1]["loss first, last"].split(", ")[0]


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


def test_the_multi_gpu_section_says_it_needs_two_gpus_where_fewer_are_visible(smoke):
    _, _, data = smoke
    sec = data["sections"]["multi_gpu"]
    assert sec["status"] == "ok" and sec["rows"] == []
    assert sec["lines"] == ["skipped: 0 CUDA GPU(s) visible; this section needs 2 or more"]
    assert sec["predicted_gpu_s"] == 0  # the one-H100 plan holds none of it


def test_the_multi_gpu_section_plans_a_model_that_fits_neither_card_alone(tmp_path, monkeypatch):
    """Two mocked 16 GiB cards: the estimate of the chosen model's whole run is over one
    card's usable memory, a sharded process's share of the same global batch and each card's
    part of the layer split are under it; the commands run it sharded under torchrun and
    split over both cards."""
    from core.training.estimate import usable_bytes

    args = argparse.Namespace(smoke=True, device="cpu", budget=60, out=str(tmp_path), only=None)
    ck = gpu_check.Check(args)
    card = 16 * gpu_check.GiB
    monkeypatch.setattr(gpu_check, "cuda_count", lambda ck: 2)
    monkeypatch.setattr(gpu_check, "card_bytes", lambda ck: card)
    cfg, predicted = gpu_check.multi_model(ck, card)
    usable = usable_bytes(card) / gpu_check.GiB
    assert predicted["whole_GiB"] > usable >= predicted["sharded_GiB_per_card"]
    assert max(predicted["split_GiB_per_card"]) <= usable
    assert predicted["split_layers"][0].startswith("layers 0-")
    smaller = gpu_check.dataclasses.replace(cfg, n_layers=cfg.n_layers - 2)
    from core.training.planner import need

    assert need(smaller) <= usable_bytes(card)  # the fewest layers that outgrow one card
    jobs = gpu_check.plan_multi(ck, False)
    assert [j.label for j in jobs] == ["sharded over 2 GPUs", "split over 2 GPUs"]
    assert gpu_check.plan_multi(ck, True) == []
    cmds = gpu_check.multi_commands(cfg, tmp_path)
    sharded, split = cmds["sharded"], cmds["split"]
    assert sharded[sharded.index("--nproc_per_node") + 1] == "2" and "--shard" in sharded
    assert sharded[sharded.index("--batch-size") + 1] == str(cfg.batch_size // 2)
    assert split[split.index("--devices") + 1] == "cuda:0,cuda:1" and "--shard" not in split
    assert split[split.index("--batch-size") + 1] == str(cfg.batch_size)
    for cmd in (sharded, split):
        assert cmd[cmd.index("--n-layers") + 1] == str(cfg.n_layers)
    # the flags parse as core.train's
    from core.cli.train import build_parser

    parsed = build_parser().parse_args(split[split.index("core.train") + 1 :])
    assert parsed.devices == "cuda:0,cuda:1" and parsed.n_layers == cfg.n_layers
