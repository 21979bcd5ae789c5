import pytest
import torch
from helpers import Recorder, StopAfter, tiny_config

from core.errors import TrainingError
from core.runs import checkpoint as ckpt
from core.runs.folder import RunFolder, read_metrics
from core.training.trainer import Trainer, smaller_micro_batch


def oom_at(step, micro):
    """Raise one CUDA-style out-of-memory error at that step and micro-batch."""
    fired = []

    def fault(s, m):
        if (s, m) == (step, micro) and not fired:
            fired.append(s)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    return fault


def train_losses(run_dir):
    return {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl")[0]}


def test_halving_keeps_the_effective_batch_exact():
    assert smaller_micro_batch(8, 1) == (4, 2)
    assert smaller_micro_batch(4, 2) == (2, 4)
    assert smaller_micro_batch(6, 1) == (3, 2)
    assert smaller_micro_batch(3, 1) == (1, 3)
    assert smaller_micro_batch(1, 4) is None


def test_oom_halves_the_micro_batch_and_matches_a_run_that_used_it_from_that_step(tmp_path):
    recovered = tmp_path / "recovered"
    events = Recorder()
    cfg = tiny_config(batch_size=4, grad_accum=2, max_steps=12)
    result = Trainer(cfg, recovered, fault=oom_at(step=6, micro=1)).run(events)
    assert result["status"] == "finished" and result["step"] == 12
    assert events.named("on_oom") == [({"step": 6, "batch_size": 2, "grad_accum": 4},)]
    assert RunFolder(recovered).read_config().batch_size == 2  # the new values are kept

    # Reference: 5 steps at 4x2, then the smaller micro-batch from step 6 on.
    reference = tmp_path / "reference"
    Trainer(cfg, reference).run(None, StopAfter(5))
    smaller = tiny_config(batch_size=2, grad_accum=4, max_steps=12)
    Trainer(smaller, reference, resume_from=reference / "checkpoints" / "latest.pt").run()

    got, want = train_losses(recovered), train_losses(reference)
    assert sorted(got) == list(range(1, 13))  # no step lost or counted twice
    assert got == want


def test_oom_at_micro_batch_one_saves_stops_and_says_what_to_change(tmp_path):
    run_dir = tmp_path / "run"

    def always_from_step_4(step, micro):
        if step >= 4:
            raise torch.OutOfMemoryError("CUDA out of memory")

    cfg = tiny_config(batch_size=2, grad_accum=1, max_steps=10)
    with pytest.raises(TrainingError) as err:
        Trainer(cfg, run_dir, fault=always_from_step_4).run()
    message = str(err.value)
    assert "even with batch_size 1" in message and "checkpoint saved at step 3" in message
    assert message.index("batch_size first") < message.index("hidden_dim")
    assert message.index("hidden_dim") < message.index("n_layers") < message.index("CPU")
    assert ckpt.load(run_dir / "checkpoints" / "latest.pt")["step"] == 3
    assert RunFolder(run_dir).read_status()["state"] == "failed"

    # Once memory is available again the run resumes where it stopped.
    resumed = Trainer(
        tiny_config(batch_size=1, grad_accum=2, max_steps=10),
        run_dir,
        resume_from=run_dir / "checkpoints" / "latest.pt",
    ).run()
    assert resumed["status"] == "finished"
    assert sorted(train_losses(run_dir)) == list(range(1, 11))


def test_errors_other_than_oom_are_not_swallowed(tmp_path):
    def broken(step, micro):
        if step == 2:
            raise RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED")

    with pytest.raises(RuntimeError, match="CUBLAS"):
        Trainer(tiny_config(max_steps=4), tmp_path / "r", fault=broken).run()


def test_a_run_that_fails_while_building_its_model_says_so_in_its_status(tmp_path, monkeypatch):
    """The folder exists by then: status.json tells the window and `--resume` what happened,
    with the run's planned length, instead of nothing."""
    from core.training import inputs

    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory while building")

    monkeypatch.setattr(inputs, "build_model", no_memory)
    with pytest.raises(torch.OutOfMemoryError):
        Trainer(tiny_config(max_steps=7), tmp_path / "run").run()
    status = RunFolder(tmp_path / "run").read_status()
    assert status["state"] == "failed" and status["max_steps"] == 7 and status["step"] == 0
    assert "out of memory while building" in status["error"]
