"""Runs, presets and saved window settings written before core/ was split into subpackages
(tests/fixtures/before_move, made by the code at commit 62cd1df) still load and resume."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import yaml
from helpers import StopAfter, tiny_config

from core.cli.train import main as train_main
from core.config.presets import load_preset, to_config
from core.config.spec import from_dict, validate
from core.runs.folder import read_metrics
from core.training.trainer import Trainer

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "before_move"


def curves(run: Path) -> tuple[dict[int, float], dict[int, float]]:
    train, evals = read_metrics(run / "metrics.jsonl")
    return {r["step"]: r["loss"] for r in train}, {r["step"]: r["val_loss"] for r in evals}


def test_a_run_stopped_by_the_old_code_resumes_exactly(tmp_path):
    run = tmp_path / "old-run"
    shutil.copytree(FIXTURE / "run", run)
    cache = str(tmp_path / "cache")
    assert train_main(["--resume", str(run), "--data-cache", cache]) == 0
    assert "resumed from" in (run / "train.log").read_text()
    # The same 12 steps trained in one go by today's code give the same curve. Steps 1-9 and
    # the checkpoint were computed on the machine that wrote the fixture, whose CPU kernels may
    # round the last bit otherwise (seen: AVX-512 machines): within float32 rounding there.
    straight = tmp_path / "straight"
    args = ["--out", str(straight), "--data-cache", cache, "--preset", str(run / "config.yaml")]
    assert train_main(args) == 0
    (resumed, resumed_val), (whole, whole_val) = curves(run), curves(straight)
    assert max(resumed) == max(whole) == 12 and resumed.keys() == whole.keys()
    for got, want in ((resumed, whole), (resumed_val, whole_val)):
        assert got == pytest.approx(want, rel=1e-6, abs=0)
    # Bit for bit on any machine: the old checkpoint resumed in two goes is the one-go resume.
    again = tmp_path / "again"
    shutil.copytree(FIXTURE / "run", again)
    cfg = validate(from_dict(yaml.safe_load((again / "config.yaml").read_text())))
    latest = again / "checkpoints" / "latest.pt"
    Trainer(cfg, again, resume_from=latest, data_cache=cache).run(None, StopAfter(1))
    Trainer(cfg, again, resume_from=latest, data_cache=cache).run()
    assert curves(again) == curves(run)


def test_a_user_preset_saved_by_the_old_code_loads():
    cfg = to_config(load_preset(str(FIXTURE / "user_preset.yaml")))
    # A preset leaves the device to the machine it runs on, and names itself.
    saved = dataclasses.replace(tiny_config(hidden_dim=48, max_steps=30), device="auto")
    assert (cfg.preset, dataclasses.replace(cfg, preset=None)) == ("user_preset", saved)


def test_window_settings_saved_by_the_old_code_load():
    saved = json.loads((FIXTURE / "saved_settings_config.json").read_text())
    assert validate(from_dict(saved, source="saved settings")) == tiny_config(n_layers=3)
