"""A new model's architecture, optimizer and schedule choices; time budgets; Finish."""

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import FakeTime, Recorder, StopAfter, cached_forward, tiny_config

from core.config import recipe
from core.config.spec import TrainConfig, compare_for_resume, from_dict, parse_duration, validate
from core.errors import ConfigError
from core.models.model import GPT, GPTConfig
from core.runs import checkpoint as ckpt
from core.runs.events import TrainControl
from core.runs.folder import read_metrics
from core.training import clock, optim
from core.training.schedule import Plan, finish_plan, lr_factor, plan_for
from core.training.trainer import FINISH_FILE, Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def train_losses(run_dir):
    train, _ = read_metrics(run_dir / "metrics.jsonl")
    return train


def curve(run_dir):
    return [(r["step"], r["loss"], r["lr"]) for r in train_losses(run_dir)]


def floor_lr(cfg: TrainConfig) -> float:
    return recipe.adamw_lr(cfg) * cfg.min_lr_ratio


@pytest.mark.parametrize(
    "options",
    [
        dict(arch="gpt2", optimizer="adamw", schedule="cosine"),
        dict(arch="gpt2", optimizer="muon"),
        dict(arch="llama", optimizer="adamw"),
        dict(arch="llama", optimizer="muon", n_heads=4, n_kv_heads=2, qk_norm=True),
        dict(arch="llama", schedule="wsd", decay_shape="sqrt"),
    ],
)
def test_each_choice_builds_and_trains(tmp_path, options):
    cfg = tiny_config(max_steps=30, dropout=0.0, sample_tokens=0, eval_every=30, lr=None, **options)
    Trainer(cfg, tmp_path / "run").run()
    losses = [r["loss"] for r in train_losses(tmp_path / "run")]
    assert sum(losses[-5:]) / 5 < losses[0] - 0.5


def test_llama_arch_is_llamas_shape():
    c = GPTConfig.from_train(validate(TrainConfig(hidden_dim=64, n_heads=4, n_kv_heads=2)))
    assert (c.norm, c.positions, c.mlp, c.n_kv_heads) == ("rmsnorm", "rope", "swiglu", 2)
    model = GPT(c)
    assert not any(name.endswith("bias") for name, _ in model.named_parameters())
    assert model.blocks[0].mlp.fc.out_features == 2 * c.ffn_dim and c.ffn_dim % 32 == 0


def test_rope_qk_norm_and_gqa_agree_between_the_full_and_the_cached_forward():
    torch.manual_seed(0)
    cfg = validate(TrainConfig(hidden_dim=32, n_heads=4, n_kv_heads=2, qk_norm=True, seq_len=24))
    model = GPT(GPTConfig.from_train(cfg, training=False)).eval()
    idx = torch.randint(0, 256, (1, 24))
    full = model.logits(idx)
    assert torch.allclose(cached_forward(model, idx, 7), full, atol=1e-5)


def test_muon_takes_only_the_hidden_matrices():
    cfg = validate(TrainConfig(hidden_dim=32, n_heads=4, optimizer="muon"))
    model = GPT(GPTConfig.from_train(cfg))
    muon, adamw = optim.make(model, cfg).all
    in_muon = {id(p) for g in muon.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        hidden = name.startswith("blocks.") and p.dim() == 2
        assert (id(p) in in_muon) == hidden, name
    assert isinstance(muon, optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    # One step moves a hidden matrix by an orthogonalised update: its singular values close
    # together, though the gradient's spread over a factor of 10. The gradient is built with
    # exactly that spread: a random square matrix has near-zero singular values, which no
    # orthogonalisation lifts, so the check would hang on the draw.
    w = model.blocks[0].attn.proj.weight
    before = w.detach().clone()
    u, _ = torch.linalg.qr(torch.randn(w.shape[0], w.shape[0]))
    v, _ = torch.linalg.qr(torch.randn(w.shape[1], w.shape[1]))
    w.grad = u @ torch.diag(torch.logspace(-1, 0, w.shape[1])) @ v.T
    muon.param_groups[0]["weight_decay"] = 0.0
    muon.step()
    s = torch.linalg.svdvals(w.detach() - before)
    assert s.max() / s.min() < 2.5


def test_muon_and_lora_do_not_mix():
    with pytest.raises(ConfigError, match="optimizer: muon"):
        validate(TrainConfig(optimizer="muon", lora_rank=4))
    assert recipe.optimizer(validate(TrainConfig())) == "muon"


def test_wsd_lr_at_chosen_steps():
    cfg = validate(
        TrainConfig(warmup_steps=10, max_steps=100, decay_fraction=0.2, lr=1.0, schedule="wsd")
    )
    plan = plan_for(cfg, 100)
    assert plan.decay_start == 80
    values = {s: lr_factor(s, cfg, plan) for s in (0, 4, 9, 10, 50, 79, 80, 89, 99)}
    assert values[0] == pytest.approx(0.1) and values[4] == pytest.approx(0.5)
    assert values[9] == values[10] == values[50] == values[79] == 1.0
    assert values[80] == pytest.approx(1 - 0.9 / 20)  # linear, one step in
    assert values[89] == pytest.approx(0.1 + 0.9 * 0.5)  # half way down
    assert values[99] == pytest.approx(0.1)  # the last step trains at the floor
    sqrt = dataclasses.replace(cfg, decay_shape="sqrt")
    assert lr_factor(89, sqrt, plan) == pytest.approx(0.1 + 0.9 * (1 - math.sqrt(0.5)))


def test_cosine_is_unchanged():
    cfg = validate(TrainConfig(schedule="cosine", warmup_steps=10, max_steps=110, lr=1.0))
    plan = plan_for(cfg, 110)
    assert lr_factor(5, cfg, plan) == pytest.approx(0.6)
    assert lr_factor(60, cfg, plan) == pytest.approx(0.1 + 0.45)  # half way: the mean
    assert lr_factor(110, cfg, plan) == pytest.approx(0.1)


def test_finish_cools_down_from_the_current_lr():
    cfg = validate(TrainConfig(warmup_steps=10, max_steps=1000, finish_steps=20, schedule="wsd"))
    plan = finish_plan(cfg, plan_for(cfg, 1000), 300)
    assert (plan.max_steps, plan.decay_start, plan.finishing) == (320, 300, True)
    assert lr_factor(300, cfg, plan) == pytest.approx(1 - 0.9 / 20)
    assert lr_factor(319, cfg, plan) == pytest.approx(cfg.min_lr_ratio)
    assert finish_plan(cfg, plan, 310) is None  # already ends sooner than a new cooldown
    assert Plan.from_dict(plan.to_dict()) == plan


def test_old_configs_keep_their_recipe():
    old = validate(from_dict({"config_version": 2, "hidden_dim": 64}))
    assert (old.arch, old.optimizer, old.schedule, old.lr) == ("gpt2", "adamw", "cosine", 1e-3)


@pytest.mark.parametrize(
    "values, needle",
    [
        ({"max_time": "soon"}, "max_time: expected a duration such as 90s"),
        ({"n_heads": 4, "n_kv_heads": 3}, "n_kv_heads: 3 must divide n_heads (4)"),
        ({"arch": "gpt2", "qk_norm": True}, "qk_norm: needs arch llama"),
        ({"arch": "gpt2", "n_kv_heads": 1}, "n_kv_heads: needs arch llama"),
        ({"schedule": "linear"}, "schedule: expected one of cosine, wsd"),
    ],
)
def test_bad_choices_name_the_field(values, needle):
    with pytest.raises(ConfigError, match="^" + needle.replace("(", r"\(").replace(")", r"\)")):
        validate(TrainConfig(**values))


def test_durations():
    assert parse_duration("1h30m") == 5400 and parse_duration("90s") == 90
    assert parse_duration("45m") == 2700 and parse_duration("2h") == 7200
    assert validate(TrainConfig(max_time="90m")).max_time == "1h30m"


def test_resume_across_the_stable_to_decay_boundary_is_exact(tmp_path):
    cfg = tiny_config(max_steps=24, decay_fraction=0.25, lr=None, schedule="wsd")  # decay: 18..
    assert plan_for(cfg, 24).decay_start == 18
    Trainer(cfg, tmp_path / "straight").run()
    Trainer(cfg, tmp_path / "split").run(None, StopAfter(17))
    latest = tmp_path / "split" / "checkpoints" / "latest.pt"
    Trainer(cfg, tmp_path / "split", resume_from=latest).run()
    assert curve(tmp_path / "split") == curve(tmp_path / "straight")


class FinishAt(TrainControl):
    def __init__(self, step: int):
        super().__init__()
        self.calls, self.at = 0, step

    def take_finish_request(self) -> bool:
        self.calls += 1
        return self.calls == self.at + 1


def test_finish_ends_at_the_floor_resumably_and_a_resume_extends_it(tmp_path):
    cfg = tiny_config(max_steps=1000, finish_steps=6, lr=None, sample_tokens=0, schedule="wsd")
    events = Recorder()
    result = Trainer(cfg, tmp_path / "run").run(events, FinishAt(10))
    assert (result["status"], result["step"]) == ("finished", 16)
    train = train_losses(tmp_path / "run")
    assert train[-1]["lr"] == pytest.approx(floor_lr(cfg), rel=1e-9)
    assert train[-1]["max_steps"] == 16 and train[0]["max_steps"] == 1000
    assert any("finishing: 6 cooldown steps" in a[0] for a in events.named("on_log"))
    state = ckpt.load(tmp_path / "run" / "checkpoints" / "latest.pt")
    assert state["step"] == 16 and state["schedule"]["finishing"]

    longer = tiny_config(max_steps=40, finish_steps=6, lr=None, sample_tokens=0, schedule="wsd")
    latest = tmp_path / "run" / "checkpoints" / "latest.pt"
    result = Trainer(longer, tmp_path / "run", resume_from=latest).run()
    assert result["step"] == 40
    lrs = {r["step"]: r["lr"] for r in train_losses(tmp_path / "run")}
    peak = recipe.adamw_lr(longer)
    assert lrs[17] < lrs[20] == pytest.approx(peak)  # warms up again to a new stable phase
    assert lrs[40] == pytest.approx(peak * longer.min_lr_ratio)  # and decays again


@pytest.mark.parametrize("schedule", ["wsd", "cosine"])
def test_a_time_budget_ends_near_it_with_the_decay_done(tmp_path, schedule, monkeypatch):
    fake = FakeTime(tick=0.0)  # only training steps take time: 20 ms each, on any machine
    monkeypatch.setattr(clock, "time", fake)
    real_step = Trainer._train_step

    def step(self, *args):
        fake.now += 0.02
        return real_step(self, *args)

    monkeypatch.setattr(Trainer, "_train_step", step)
    cfg = tiny_config(
        max_time="6s",
        max_steps=None,
        lr=None,
        eval_every=50,
        ckpt_every=10**6,
        log_every=1,
        schedule=schedule,
    )
    events = Recorder()
    result = Trainer(cfg, tmp_path / "run").run(events)
    assert result["status"] == "finished"
    train = train_losses(tmp_path / "run")
    assert 5.9 < train[-1]["elapsed_s"] < 6.1, train[-1]
    assert 295 <= result["step"] <= 302
    # wsd's last step trains at the floor; cosine's a hair above, as nanoGPT's
    assert train[-1]["lr"] == pytest.approx(floor_lr(cfg), rel=1e-9 if schedule == "wsd" else 1e-3)
    assert train[-1]["step"] == result["step"] == train[-1]["max_steps"]
    logs = [a[0] for a in events.named("on_log")]
    assert any(line.startswith(f"time budget 6s: {result['step']} steps in all") for line in logs)


def _start_cli(tmp_path, *extra):
    env = {**os.environ, "PYTHONPATH": ROOT}
    args = ["--preset", "cpu-tiny", "--hidden-dim", "32", "--max-steps", "100000", "--lr", "3e-3"]
    args += ["--finish-steps", "5", "--sample-tokens", "0", "--out", "run", *extra]
    proc = subprocess.Popen(
        [sys.executable, "-m", "core.train", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and not (metrics.exists() and metrics.stat().st_size > 0):
        time.sleep(0.1)
    return proc


def _check_finished(tmp_path, proc):
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Finished at step" in out
    train = train_losses(tmp_path / "run")
    assert train[-1]["lr"] == pytest.approx(3e-3 * 0.1, rel=1e-9)
    assert ckpt.load(tmp_path / "run" / "checkpoints" / "latest.pt")["step"] == train[-1]["step"]
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "finished" and status["step"] < 100000


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this system")
def test_sigusr1_finishes_the_cli_run(tmp_path):
    proc = _start_cli(tmp_path)
    proc.send_signal(signal.SIGUSR1)
    _check_finished(tmp_path, proc)


def test_finish_flag_finishes_a_running_cli_run(tmp_path):
    proc = _start_cli(tmp_path)
    env = {**os.environ, "PYTHONPATH": ROOT}
    ask = subprocess.run(
        [sys.executable, "-m", "core.train", "--finish", "run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert ask.returncode == 0, ask.stderr
    _check_finished(tmp_path, proc)
    assert not (tmp_path / "run" / FINISH_FILE).exists()
    again = subprocess.run(
        [sys.executable, "-m", "core.train", "--finish", "run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert again.returncode == 2
    assert again.stderr.strip() == "error: --finish: run is not training (its status is finished)"


def test_a_fine_tune_from_before_v3_resumes_though_its_config_says_gpt2():
    old = validate(from_dict({"config_version": 2, "init_from": "base", "tokenizer": "model"}))
    now = dataclasses.replace(old, arch="llama", qk_norm=True, optimizer="adamw")
    assert old.arch == "gpt2" and compare_for_resume(old, now)[0] == []
    new_model = validate(TrainConfig())
    refused, _ = compare_for_resume(new_model, dataclasses.replace(new_model, arch="gpt2"))
    assert refused == ["arch 'llama' -> 'gpt2' (architecture)"]


def test_a_fine_tune_defaults_to_a_small_lr_full_and_a_larger_one_for_lora():
    full = tiny_config(hidden_dim=576, n_heads=4, lr=None)
    full = dataclasses.replace(full, init_from="some/model", tokenizer="model")
    lora = dataclasses.replace(full, lora_rank=16)
    assert recipe.adamw_lr(full) == pytest.approx(1e-4 * 256 / 576)
    assert recipe.adamw_lr(lora) == pytest.approx(5e-4 * 256 / 576)
    big = dataclasses.replace(full, hidden_dim=4096)
    assert recipe.adamw_lr(big) == pytest.approx(1e-5)  # the floor: what peers ship at 8B
    assert recipe.adamw_lr(dataclasses.replace(big, lora_rank=16)) == pytest.approx(1e-4)
    assert recipe.optimizer_line(lora) == f"AdamW lr {5e-4 * 256 / 576:.3g}"


def test_warmup_never_outlasts_the_run_and_a_fine_tune_warms_up_for_a_tenth():
    from core.training.schedule import lr_factor, plan_for, warmup_steps

    new = tiny_config(warmup_steps=50, max_steps=8)
    assert warmup_steps(new, 8) == 8
    factors = [lr_factor(s, new, plan_for(new, 8)) for s in range(8)]
    assert factors[-1] > 0.1 and factors == sorted(factors)  # it never reached the plateau
    tuned = dataclasses.replace(new, init_from="some/model", tokenizer="model")
    assert warmup_steps(tuned, 100) == 10 and warmup_steps(tuned, 7) == 1
    assert warmup_steps(dataclasses.replace(tuned, warmup_steps=4), 100) == 4
    assert lr_factor(10, tuned, plan_for(tuned, 100)) == pytest.approx(1.0, abs=0.01)
