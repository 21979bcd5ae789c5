"""--shard (FSDP2) in this process, as torchrun's one process: sharded checkpoints written
whole or not at all, exact resume, resume without --shard, the checks before any work.
Several processes: tests/integration/test_sharded.py."""

import dataclasses
import shutil
import socket
import sys

import pytest
import torch
from helpers import tiny_config

from core.cli.train import main as train_main
from core.config.spec import compare_for_resume, for_processes
from core.errors import ConfigError
from core.platform import distributed
from core.platform.distributed import World
from core.runs import checkpoint as ckpt
from core.runs.folder import read_metrics
from core.training.trainer import Trainer
from core.weights.loader import load


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def torchrun_alone(monkeypatch):
    """The environment torchrun --nproc_per_node 1 gives its process."""
    env = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    for k, v in {**env, "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(k, v)
    yield
    assert not torch.distributed.is_initialized()  # the run released its process group


def losses(run_dir):
    train, evals = read_metrics(run_dir / "metrics.jsonl")
    return [(r["step"], r["loss"]) for r in train], [(r["step"], r["val_loss"]) for r in evals]


def sharded(**kw):
    return tiny_config(shard=True, max_steps=8, eval_every=4, ckpt_every=4, sample_tokens=4, **kw)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted sharded run (one process under torchrun)."""
    run = tmp_path_factory.mktemp("sharded") / "straight"
    with pytest.MonkeyPatch.context() as mp:
        env = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
        for k, v in {**env, "MASTER_PORT": str(free_port())}.items():
            mp.setenv(k, v)
        assert Trainer(sharded(), run).run()["status"] == "finished"
    return run


@pytest.mark.slow  # over ~10 s on 2 cores
def test_sharded_checkpoints_resume_exactly_and_a_failed_save_keeps_the_last(
    straight, tmp_path, torchrun_alone, monkeypatch
):
    ckpts = straight / "checkpoints"
    state = ckpt.load(ckpts / "latest.pt")
    assert "model" not in state and state["shards"] == "shards/step-000008"
    assert sorted(p.name for p in (ckpts / "shards").iterdir()) == ["step-000004", "step-000008"]

    # A save that dies half-way through writing its shards: the step-4 checkpoint is whole.
    run = tmp_path / "run"
    import torch.distributed.checkpoint as dcp

    real_save = dcp.save

    def dies_half_way(state, checkpoint_id):
        if "000008" in str(checkpoint_id):
            checkpoint_id.mkdir(parents=True)
            (checkpoint_id / "__0_0.distcp").write_bytes(b"half")
            raise RuntimeError("power cut")
        return real_save(state, checkpoint_id=checkpoint_id)

    monkeypatch.setattr(dcp, "save", dies_half_way)
    with pytest.raises(RuntimeError, match="power cut"):
        Trainer(sharded(), run).run()
    monkeypatch.setattr(dcp, "save", real_save)
    assert ckpt.load(run / "checkpoints" / "latest.pt")["step"] == 4
    assert (run / "checkpoints" / "shards" / ".tmp-000008").is_dir()  # never renamed in

    # Resumed (sharded) from step 4: the uninterrupted run's losses, bit for bit; the
    # killed save's leftovers are cleared.
    again = Trainer(sharded(), run, resume_from=run / "checkpoints" / "latest.pt")
    assert again.run()["status"] == "finished"
    assert losses(run) == losses(straight)
    assert not list((run / "checkpoints" / "shards").glob(".tmp-*"))

    # The exports' loader reads the shards as one model.
    a, b = load(straight, "latest").model.state_dict(), load(run, "latest").model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_sharded_checkpoint_resumes_in_one_process_without_shard(straight, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    plain = dataclasses.replace(sharded(), shard=False)
    Trainer(plain, run, resume_from=run / "checkpoints" / "step-000004.pt").run()
    # same process, same kernels: unsharded steps equal sharded ones over one process
    assert losses(run) == losses(straight)
    assert "model" in ckpt.load(run / "checkpoints" / "latest.pt")  # a single file again


def test_shard_without_torchrun_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    out = tmp_path / "run"
    assert train_main(["--preset", "cpu-tiny", "--shard", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: shard: shards a model across the")
    assert "torchrun --standalone --nproc_per_node N" in err[0]
    assert not out.exists()


def test_cuda_processes_are_refused_on_windows_in_one_line():
    with pytest.raises(ConfigError, match="NCCL, which PyTorch on Windows does not have"):
        distributed.check_backend("cuda", "win32")
    distributed.check_backend("cuda", "linux")
    distributed.check_backend("cpu", "win32")  # gloo is there


def test_resume_on_another_number_of_processes_keeps_the_sequences_a_step():
    cfg = tiny_config(batch_size=4, grad_accum=1, shard=True)
    one = for_processes(cfg, saved=2, processes=1, launched=False, changes={})
    assert (one.batch_size, one.grad_accum, one.shard) == (4, 2, False)
    four = for_processes(cfg, saved=2, processes=4, launched=True, changes={})
    assert (four.batch_size, four.grad_accum, four.shard) == (2, 1, True)
    assert compare_for_resume(cfg, one, 2, 1)[0] == []
    assert "effective batch changes" in compare_for_resume(cfg, cfg, 2, 1)[0][0]
    with pytest.raises(ConfigError, match="8 sequences a step .* 3 processes cannot share"):
        for_processes(cfg, saved=2, processes=3, launched=True, changes={})
    mine = for_processes(cfg, 2, 1, False, {"batch_size": 4, "shard": True})
    assert (mine.batch_size, mine.grad_accum, mine.shard) == (4, 1, True)  # as the user said


def test_a_dead_peer_is_named_and_a_silent_one_is_a_timeout(tmp_path, monkeypatch):
    import subprocess

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    world = World(2, 0, 0, pids=[0, gone.pid])
    world.pids[0] = __import__("os").getpid()
    line = world.failure_line(RuntimeError("[gloo/pair.cc:537] Read error: Connection reset"))
    assert line == f"rank 1 (pid {gone.pid}) stopped (killed or crashed), so rank 0 stops too"
    # torchrun's SIGTERM after a rank died names that rank; with none dead, the launcher's stop
    line = world.failure_line(distributed.Terminated("SIGTERM"))
    assert line == f"rank 1 (pid {gone.pid}) stopped (killed or crashed), so rank 0 stops too"
    alive = World(2, 0, 0, pids=[world.pids[0], world.pids[0]])
    line = alive.failure_line(distributed.Terminated("SIGTERM"))
    assert line == "rank 0 was told to stop (SIGTERM) by its launcher"
    monkeypatch.setenv("TRAINDECK_DIST_TIMEOUT", "5")
    line = alive.failure_line(RuntimeError("[gloo] Timed out waiting 5000ms for recv"))
    assert line.startswith("rank 0 waited 5 s for the other processes in a collective")
    assert alive.failure_line(ValueError("a bug of ours")) is None
    monkeypatch.setenv("TRAINDECK_DIST_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="TRAINDECK_DIST_TIMEOUT: expected seconds"):
        distributed.timeout_s()


def test_the_estimate_per_sharded_process_divides_the_state_and_adds_the_gathered_units():
    from core.training.estimate import estimate, model_shape
    from core.training.sharding import rank_estimate, unit_params

    cfg = tiny_config(hidden_dim=64, n_layers=4, optimizer="adamw")
    one = estimate(cfg, "fp32", on_gpu=False)
    two = rank_estimate(one, cfg, 2)
    root, block = unit_params(model_shape(cfg))
    assert root + 4 * block == one.n_params
    assert (two.weights, two.optimizer) == (one.weights // 2, one.optimizer // 2)
    assert two.gradients == one.gradients // 2 + 4 * block  # a block's, before its reduce
    assert two.weight_casts == 4 * (root + 2 * block)  # the root, one block and the next
    assert two.allocator_peak < one.allocator_peak


def test_an_8bit_base_is_refused_with_shard_in_one_line(monkeypatch):
    from core.training.sharding import check

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="base_bits: an 8-bit base cannot be sharded"):
        check(dataclasses.replace(tiny_config(shard=True, lora_rank=4), base_bits="8"), None)
    check(dataclasses.replace(tiny_config(shard=True, lora_rank=4), base_bits="4"), None)


GiB = 1024**3


def billion():
    """A ~1.3B model on CUDA: full AdamW needs ~18 GiB on one card, ~11 sharded over two."""
    return tiny_config(
        hidden_dim=2048, n_layers=16, n_heads=16, seq_len=1024, vocab_size=32000,
        batch_size=1, grad_accum=4, precision="auto", device="cuda", dropout=0.0,
    )  # fmt: skip


def test_the_ladder_shards_over_two_cards_a_method_that_does_not_fit_one():
    from core.training import planner
    from core.training.estimate import estimate, usable_bytes
    from core.training.sharding import rank_estimate

    cfg, card = billion(), 16 * GiB
    one = planner.walk_ladder(cfg, card, gpus=1)
    assert not any(r.config.shard for r in one)
    assert [r.name for r in one if r.chosen] == ["full fine-tuning (8-bit AdamW)"]
    assert not one[0].fitted  # full AdamW does not fit one 16 GiB card

    two = planner.walk_ladder(cfg, card, gpus=2)
    chosen = next(r for r in two if r.chosen)
    assert chosen.name == "full fine-tuning (AdamW), sharded over 2 GPUs"
    assert two.index(chosen) == 2  # after the method's one-card rungs, before 8-bit AdamW
    f = chosen.fitted
    assert f.shard and f.batch_size * f.grad_accum == 2  # each process half the batch of 4
    per_card = rank_estimate(estimate(f), f, 2).device_total
    assert chosen.need == per_card <= usable_bytes(card) < estimate(f).device_total
    assert not any("8-bit AdamW" in r.name and r.config.shard for r in two)
    fitted, line = planner.fit_pretrained(cfg, card, gpus=2)
    assert fitted == f and "usable per GPU" in line
    assert "torchrun --standalone --nproc_per_node 2 -m core.train ... --shard" in line


def test_shard_is_automatic_under_torchrun_only_where_one_card_is_too_small(monkeypatch):
    from core.cli import train as cli
    from core.platform import hardware

    cfg, card = billion(), {"name": "RTX 4000", "total_bytes": 16 * GiB}
    monkeypatch.setattr(hardware, "gpus", lambda: [{**card, "free_bytes": 16 * GiB}] * 2)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not cli.auto_shard(cfg).shard  # one process: nothing to shard over
    for k, v in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    assert cli.auto_shard(cfg).shard  # DDP's whole copy does not fit one card; a half does
    monkeypatch.setattr(hardware, "gpus", lambda: [{**card, "free_bytes": 40 * GiB}] * 2)
    assert not cli.auto_shard(cfg).shard  # the whole model fits each card: DDP as asked
    monkeypatch.setattr(hardware, "gpus", lambda: [{**card, "free_bytes": 4 * GiB}] * 2)
    assert not cli.auto_shard(cfg).shard  # nor does a half: the memory check says so


def test_a_sharded_runs_records_carry_every_processs_card_as_a_split_does():
    from core.platform.hardware import CARD_FIELDS
    from core.training.sharding import card_fields, card_memory

    rows = [[0.0, 9000.5, 10240.0], [1.0, 8800.0, 9900.0]]  # gathered in rank order
    fields = card_fields(rows)
    assert set(fields) == set(CARD_FIELDS)  # the window's per-card lines read these
    assert fields["card_reserved_mb"] == {"cuda:0": 9000.5, "cuda:1": 8800.0}
    assert fields["card_used_mb"] == {"cuda:0": 10240.0, "cuda:1": 9900.0}
    assert "card_used_mb" not in card_fields([[0.0, 1.0, 10.0], [1.0, 2.0, -1.0]])  # no NVML
    # one process's own reading, through the gather (itself alone here)
    mine = card_memory(World(), torch.device("cuda", 3), {"mem_reserved_mb": 512.0})
    assert mine == {"card_reserved_mb": {"cuda:3": 512.0}}
