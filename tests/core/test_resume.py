import pytest
from helpers import Recorder, StopAfter, tiny_config

from core.errors import CheckpointError, ConfigError
from core.runs import checkpoint as ckpt
from core.runs.events import TrainControl
from core.runs.folder import RunFolder, interrupted_run, read_metrics, resolve_resume
from core.training.trainer import Trainer


def losses(run_dir):
    train, evals = read_metrics(run_dir / "metrics.jsonl")
    return [(r["step"], r["loss"]) for r in train], [(r["step"], r["val_loss"]) for r in evals]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted reference run."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    result = Trainer(tiny_config(), run_dir).run()
    assert result["status"] == "finished" and result["step"] == 20
    return run_dir


def test_run_folder_has_everything(straight):
    names = {p.name for p in straight.iterdir()}
    assert {"config.yaml", "metrics.jsonl", "samples.txt", "train.log", "checkpoints"} <= names
    ckpts = {p.name for p in (straight / "checkpoints").iterdir()}
    assert {"latest.pt", "best.pt", "step-000010.pt", "step-000020.pt"} <= ckpts
    train, evals = losses(straight)
    assert [s for s, _ in train] == list(range(1, 21))
    assert [s for s, _ in evals] == [10, 20]
    assert RunFolder(straight).read_status()["state"] == "finished"
    assert "--- step 10 ---" in (straight / "samples.txt").read_text()


def test_stop_then_resume_is_bitwise_identical_to_an_uninterrupted_run(straight, tmp_path):
    run_dir = tmp_path / "run"
    events = Recorder()
    first = Trainer(tiny_config(), run_dir).run(events, StopAfter(13))
    assert first["status"] == "stopped" and first["step"] == 13
    assert ("on_checkpoint", (str(run_dir / "checkpoints" / "latest.pt"), 13)) in events.calls
    assert ckpt.load(run_dir / "checkpoints" / "latest.pt")["step"] == 13
    assert interrupted_run(tmp_path).path == run_dir

    second = Trainer(tiny_config(), run_dir, resume_from=run_dir / "checkpoints" / "latest.pt")
    assert second.run()["status"] == "finished"
    assert losses(run_dir) == losses(straight)  # exact float equality, every step
    assert interrupted_run(tmp_path) is None


def test_resume_after_a_crash_redoes_the_lost_steps_exactly(straight, tmp_path):
    run_dir = tmp_path / "run"

    def crash(step, micro):
        if step == 17:
            raise RuntimeError("power cut")

    with pytest.raises(RuntimeError, match="power cut"):
        Trainer(tiny_config(), run_dir, fault=crash).run()
    assert RunFolder(run_dir).read_status()["state"] == "failed"
    ckpt_file, run = resolve_resume("latest", tmp_path)
    assert run.path == run_dir and ckpt.load(ckpt_file)["step"] == 10
    Trainer(tiny_config(), run_dir, resume_from=ckpt_file).run()
    assert losses(run_dir) == losses(straight)  # steps 11-16 logged twice are not duplicated


def test_resume_refuses_architecture_changes_before_touching_anything(tmp_path):
    run_dir = tmp_path / "run"
    Trainer(tiny_config(max_steps=6, ckpt_every=3), run_dir).run(None, StopAfter(4))
    before = (run_dir / "metrics.jsonl").read_bytes()
    changed = tiny_config(hidden_dim=64, n_heads=4)
    with pytest.raises(CheckpointError, match=r"hidden_dim 32 -> 64 \(architecture\)"):
        Trainer(changed, run_dir, resume_from=run_dir / "checkpoints" / "latest.pt").run()
    assert (run_dir / "metrics.jsonl").read_bytes() == before
    assert ckpt.load(run_dir / "checkpoints" / "latest.pt")["step"] == 4


def test_resume_allows_and_logs_a_longer_schedule(tmp_path):
    run_dir = tmp_path / "run"
    Trainer(tiny_config(max_steps=6), run_dir).run()
    events = Recorder()
    longer = tiny_config(max_steps=9)
    result = Trainer(longer, run_dir, resume_from=run_dir / "checkpoints" / "latest.pt").run(events)
    assert result["step"] == 9
    assert any("allowed change max_steps 6 -> 9" in a[0] for a in events.named("on_log"))
    assert RunFolder(run_dir).read_config().max_steps == 9


def test_a_new_run_never_overwrites_an_existing_one(straight):
    before = (straight / "metrics.jsonl").read_bytes()
    with pytest.raises(ConfigError, match="already holds a run"):
        Trainer(tiny_config(), straight).run()
    assert (straight / "metrics.jsonl").read_bytes() == before


def test_save_now_writes_a_checkpoint_at_that_step(tmp_path):
    control = TrainControl()
    events = Recorder()
    trainer = Trainer(tiny_config(max_steps=8, ckpt_every=100, eval_every=100), tmp_path / "r")
    real_step = trainer._train_step

    def step_and_ask(starts, lr):
        if trainer.step == 4:
            control.request_save()
        return real_step(starts, lr)

    trainer._train_step = step_and_ask
    trainer.run(events, control)
    saved = [args[1] for args in events.named("on_checkpoint")]
    assert saved == [5, 8]


def test_epochs_set_the_number_of_steps(tmp_path):
    cfg = tiny_config(max_steps=None, max_epochs=0.01)
    trainer = Trainer(cfg, tmp_path / "r")
    result = trainer.run()
    expected = -(-int(0.01 * trainer.data.train_tokens) // cfg.tokens_per_step)
    assert result["step"] == trainer.max_steps
    assert abs(trainer.max_steps - expected) <= 1


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path, monkeypatch):
    from core.runs import folder as runs

    monkeypatch.setattr(runs.time, "strftime", lambda fmt: "20260101-120000")
    first = runs.new_run_dir(tmp_path, "gpu")
    first.mkdir()
    second = runs.new_run_dir(tmp_path, "gpu")
    assert (first.name, second.name) == ("gpu-20260101-120000", "gpu-20260101-120000-2")
