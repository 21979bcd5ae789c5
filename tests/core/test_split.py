"""The layer split in one process (--devices, core.training.split), with two CPU devices
standing in for two cards: the placement follows the planner, every block boundary moves the
stream and its extras (the moves are counted), and logits, gradients and whole runs equal one
device's, exactly: the computation is the same, kernel for kernel."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import StopAfter, tiny_config

from core.config.spec import TrainConfig, validate
from core.errors import ConfigError
from core.models.model import GPT, GPTConfig
from core.platform.distributed import World
from core.runs import checkpoint as ckpt
from core.runs.folder import read_metrics
from core.training import split
from core.training.estimate import estimate
from core.training.trainer import Trainer

GIB = 1024**3


def losses(run_dir):
    train, evals = read_metrics(run_dir / "metrics.jsonl")
    return [(r["step"], r["loss"]) for r in train], [(r["step"], r["val_loss"]) for r in evals]


def test_the_planner_shares_the_layers_in_proportion_to_free_memory():
    # a 24 GiB card beside one with 8 free: three quarters of the load on the first
    p = split.plan(["cuda:0", "cuda:1"], [24 * GIB, 8 * GIB], 0, [GIB] * 8)
    assert p.counts() == [6, 2] and p.blocks == [0] * 6 + [1] * 2
    # the root (embeddings, head, logits) counts on the first card: it takes fewer blocks
    p = split.plan(["cuda:0", "cuda:1"], [16 * GIB, 16 * GIB], 4 * GIB, [GIB] * 8)
    assert p.counts() == [2, 6] and p.loads == [6 * GIB, 6 * GIB]
    # three cards, each gets one block at least even where one has far more memory
    p = split.plan(["cuda:0", "cuda:1", "cuda:2"], [80 * GIB, GIB, GIB], 0, [GIB] * 4)
    assert p.counts() == [2, 1, 1]
    assert "cuda:0: layers 0-1 + embeddings" in p.describe()
    with pytest.raises(ConfigError, match="devices: 3 devices but the model has 2 layers"):
        split.plan(["cpu", "cpu", "cpu"], [GIB] * 3, 0, [GIB] * 2)


def test_the_estimate_per_card_adds_up_to_one_devices():
    cfg = tiny_config(n_layers=4, devices="cuda:0,cuda:1")
    est = estimate(cfg, "bf16", on_gpu=True)
    plan, cards = split.card_estimates(est, cfg, [8 * GIB, 8 * GIB])
    assert plan.counts() in ([2, 2], [1, 3])
    for name in ("weights", "gradients", "optimizer", "activations", "logits"):
        parts = sum(getattr(c, name) for c in cards)
        assert parts == pytest.approx(getattr(est, name), rel=0.02, abs=64), name
    assert cards[1].logits == 0 and cards[0].logits == est.logits
    assert all(c.cuda_context == est.cuda_context for c in cards)  # each card has its own


def test_wrong_setups_are_one_line_before_any_work(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match="devices: a layer split needs two or more"):
        tiny_config(devices="cuda:0")
    with pytest.raises(ConfigError, match="devices: a layer split needs two or more"):
        tiny_config(devices="cuda:1,cuda:1")
    with pytest.raises(ConfigError, match="devices: expected cuda:N"):
        tiny_config(devices="cuda:0,gpu1")
    with pytest.raises(ConfigError, match="devices: cards only"):
        tiny_config(devices="cuda:0,cpu")
    cfg = tiny_config(devices="cuda:0,cuda:1")
    with pytest.raises(ConfigError, match=r"devices: cuda:1 does not exist.*cuda:0\.\.cuda:0"):
        split.check(cfg, World(), cuda_count=1)
    with pytest.raises(ConfigError, match="devices: .* no CUDA GPU"):
        split.check(cfg, World(), cuda_count=0)
    with pytest.raises(ConfigError, match="does not combine with --shard or torchrun"):
        split.check(tiny_config(devices="cpu,cpu", shard=True), World(), 2)
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun's one process
    with pytest.raises(ConfigError, match="does not combine with --shard or torchrun"):
        split.check(tiny_config(devices="cpu,cpu"), World(), 2)


def test_a_split_run_is_refused_before_its_folder_exists(tmp_path, capsys):
    from core.cli.train import main as train_main

    run_dir = tmp_path / "run"
    code = train_main(["--preset", "cpu-tiny", "--devices", "cuda:0,cuda:7", "--out", str(run_dir)])
    assert code == 2 and not run_dir.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(r"devices: cuda:[07] does not exist", err[0])


def counting_moves(monkeypatch) -> list:
    """Every value the split moves, with the device it moves it to."""
    seen = []
    moved = split._moved

    def counted(value, device):
        seen.append((type(value).__name__, str(device)))
        return moved(value, device)

    monkeypatch.setattr(split, "_moved", counted)
    return seen


def two_models(c: GPTConfig) -> tuple[GPT, GPT]:
    torch.manual_seed(0)
    one = GPT(c)
    two = GPT(c)
    two.load_state_dict(one.state_dict())
    where = [0] * (c.n_layers - 1) + [1]
    split.place(two, split.Plan(["cpu", "cpu"], where, [0, 0]))
    return one, two


def gemma4_like() -> dict:
    """Gemma 4's per-layer inputs and a layer reusing another's keys and values: what
    reaches the blocks beside the stream (Side), moved with it."""
    from core.models.per_layer import PerLayer

    per_layer = PerLayer(input_dim=8, kv_shared_layers=1, layer_scalar=True)
    return {"per_layer": per_layer, "layer_types": ["sliding_attention", "full_attention"] * 2}


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("extra", [{}, "gemma4"])
def test_logits_and_gradients_equal_one_devices(monkeypatch, packed, extra):
    more = gemma4_like() if extra == "gemma4" else {}
    n = 4 if more else 3
    c = GPTConfig(
        hidden_dim=32,
        n_layers=n,
        n_heads=2,
        seq_len=16,
        vocab_size=64,
        dropout=0.0,
        sliding_window=4 if more else None,
        **more,
    )
    c.positions, c.norm, c.mlp, c.bias = "rope", "rmsnorm", "swiglu", False
    c.grad_checkpointing = True
    one, two = two_models(c)
    assert [b.split_device for b in two.blocks] == [torch.device("cpu")] * n
    assert [type(b).__name__ for b in two.blocks] == ["PlacedBlock"] * n
    assert two.state_dict().keys() == one.state_dict().keys()  # checkpoints keep their names
    seen = counting_moves(monkeypatch)
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    segments = torch.tensor([[0] * 6 + [1] * 10, [0] * 16]) if packed else None
    for m in (one, two):
        m.train()
        _, loss = m(idx, idx.roll(-1, 1), segments=segments)
        loss.backward()
        m.loss = loss
    assert torch.equal(one.loss, two.loss)
    for (name, a), b in zip(one.named_parameters(), two.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name
    # each block took its stream and rope's (cos, sin) to its device (again when recomputed),
    # the segments too when packed; the last gave its output back
    kinds = {k for k, _ in seen}
    assert {"tuple", "Tensor"} <= kinds and ("Segments" in kinds) == packed
    assert "Side" in kinds  # what the blocks take beside the stream (Gemma 4: its inputs)
    one.eval(), two.eval()
    assert torch.equal(one.logits(idx), two.logits(idx))
    a, _ = one.forward_cached(idx)
    b, _ = two.forward_cached(idx)
    assert torch.equal(a, b)  # generation's cached step goes through the same moves


def split_config(**kw) -> TrainConfig:
    return tiny_config(n_layers=3, max_steps=8, eval_every=4, eval_batches=1, **kw)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("split") / "run"
    assert Trainer(split_config(), run_dir).run()["status"] == "finished"
    return run_dir


def test_a_split_run_trains_as_one_device_and_resumes_across_split_and_unsplit(straight, tmp_path):
    run_dir = tmp_path / "run"
    cfg = split_config(devices="cpu,cpu")
    first = Trainer(cfg, run_dir).run(None, StopAfter(3))
    assert first["step"] == 3
    log = (run_dir / "train.log").read_text()
    assert "layer split over 2 devices: cpu: layers 0-" in log
    assert losses(run_dir)[0] == losses(straight)[0][:3]  # the same steps, exactly
    train, _ = read_metrics(run_dir / "metrics.jsonl")
    assert not any("card_reserved_mb" in r for r in train)  # no cards: records as they were
    # the split's checkpoint resumes on one device ...
    latest = run_dir / "checkpoints" / "latest.pt"
    Trainer(split_config(), run_dir, resume_from=latest).run(None, StopAfter(2))
    assert ckpt.load(latest)["step"] == 5
    # ... and one device's on the split again, to the same end as the uninterrupted run
    Trainer(cfg, run_dir, resume_from=latest).run()
    assert losses(run_dir) == losses(straight)


def test_a_resumed_split_gives_up_the_split_where_device_is_given():
    from core.config.spec import for_processes

    cfg = validate(TrainConfig(devices="cuda:0,cuda:1", max_steps=3))
    assert for_processes(cfg, 1, 1, False, {}).devices == "cuda:0,cuda:1"
    assert for_processes(cfg, 1, 1, False, {"device": "cuda:0"}).devices == ""
    assert for_processes(cfg, 1, 2, True, {}).devices == ""


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    pytest.importorskip("transformers")
    from hf_models import TEXT, make_model

    root = tmp_path_factory.mktemp("split-pretrained")
    shape = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}
    make_model(root / "model", "llama", num_key_value_heads=2, num_hidden_layers=3, **shape)
    (root / "text.txt").write_text(TEXT * 5, encoding="utf-8")
    return root


@pytest.mark.parametrize("bits", ["auto", "4"])
def test_lora_and_a_4_bit_base_train_split_as_on_one_device(pretrained, tmp_path, bits):
    if bits == "4":
        pytest.importorskip("bitsandbytes")
    runs = {}
    for devices in ("", "cpu,cpu"):
        cfg = tiny_config(
            init_from=str(pretrained / "model"),
            tokenizer="model",
            lr=None,
            data=str(pretrained / "text.txt"),
            lora_rank=8,
            base_bits=bits,
            max_steps=3,
            eval_every=3,
            ckpt_every=3,
            eval_batches=1,
            dropout=0.0,
            sample_tokens=0,
            devices=devices,
        )
        run_dir = tmp_path / (devices or "one")
        assert Trainer(cfg, run_dir).run()["status"] == "finished"
        runs[devices] = losses(run_dir)
    assert runs["cpu,cpu"] == runs[""]
    assert "layer split over 2 devices" in (tmp_path / "cpu,cpu" / "train.log").read_text()
    if bits == "auto":  # the split run's adapter exports as one device's does, byte for byte
        from core.use.export import export

        for name in ("one", "cpu,cpu"):
            export(tmp_path / name, "peft", tmp_path / f"peft-{name}", which="latest")
        one, two = (
            tmp_path / f"peft-{n}" / "adapter_model.safetensors" for n in ("one", "cpu,cpu")
        )
        assert one.read_bytes() == two.read_bytes()


def test_estimate_prints_a_row_per_card(monkeypatch, capsys):
    from core.cli.train import main as train_main
    from core.platform import hardware

    cards = [
        {"index": 0, "name": "RTX 4090", "free_bytes": 22 * GIB, "total_bytes": 24 * GIB},
        {"index": 1, "name": "RTX 3090", "free_bytes": 11 * GIB, "total_bytes": 24 * GIB},
    ]
    monkeypatch.setattr(hardware, "gpus", lambda: cards)
    code = train_main(["--preset", "cpu", "--devices", "cuda:0,cuda:1", "--estimate"])
    assert code == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("  cuda:")]
    assert [r[0] for r in rows] == ["cuda:0", "cuda:1"]
    assert "22.0 GiB free - fits" in out and "11.0 GiB free - fits" in out
    # the 22 GiB card takes the larger share of the 6 layers, the embeddings and head too
    assert rows[0][1:3] == ["layers", "0-3"] and rows[1][1:3] == ["layers", "4-5"]


def test_a_split_runs_records_carry_each_cards_memory(monkeypatch):
    from core.platform import hardware

    reserved = {0: 900 * 1024**2, 1: 512 * 1024**2}
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: reserved[d.index])

    class Watch:
        def __init__(self, used):
            self.latest = {"nvml_used_mb": used} if used is not None else {}

    cards = [torch.device("cuda", 0), torch.device("cuda", 1)]
    stats = hardware.card_stats(cards, {cards[0]: Watch(1200.0), cards[1]: Watch(800.0)})
    assert stats == {
        "card_reserved_mb": {"cuda:0": 900.0, "cuda:1": 512.0},
        "card_used_mb": {"cuda:0": 1200.0, "cuda:1": 800.0},
    }
    # without NVML (or before its first reading) only the allocator's figures
    stats = hardware.card_stats(cards, {cards[0]: None, cards[1]: Watch(None)})
    assert set(stats) == {"card_reserved_mb"}


def test_nccl_on_windows_points_to_the_split():
    from core.platform import distributed

    with pytest.raises(ConfigError, match="NCCL.*--devices cuda:0,cuda:1"):
        distributed.check_backend("cuda", "win32")


def test_estimate_says_when_a_cards_free_memory_is_unknown(monkeypatch, capsys):
    from core.cli.train import main as train_main
    from core.platform import hardware

    monkeypatch.setattr(hardware, "gpus", lambda: [])  # planned on another machine
    assert train_main(["--preset", "cpu", "--devices", "cuda:0,cuda:1", "--estimate"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  cuda:")]
    assert len(rows) == 2 and all(r.endswith("MiB (free memory unknown)") for r in rows)
