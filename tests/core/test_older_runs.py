"""Runs, presets and saved window settings written before core/ was split into subpackages
(tests/fixtures/before_move, made by the code at commit 62cd1df) still load and resume."""

from __future__ import annotations

import dataclasses
import json
import math
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


OWNERS = Path(__file__).resolve().parents[1] / "fixtures" / "before_owners"


def train_records(path: Path) -> list[dict]:
    return read_metrics(path)[0]


@pytest.mark.parametrize("method", ["dpo", "grpo"])
def test_a_preference_or_reward_run_stopped_before_the_owners_move_resumes_as_the_old_code_did(
    tmp_path, monkeypatch, method
):
    """tests/fixtures/before_owners (made by make_fixture.py at commit a1d61d3, before each
    method and chat format got its own modules): a DPO and a GRPO run on a LoRA adapter,
    stopped at step 3 of 6, and what the old code wrote when it resumed them itself."""
    shutil.copytree(OWNERS, tmp_path / "fx")
    monkeypatch.chdir(tmp_path / "fx")  # the runs name their model and data relatively
    # The data manifest names the files where the fixture was made: the same bytes here.
    assert train_main(["--resume", method, "--data-cache", "cache", "--allow-data-change"]) == 0
    resumed = train_records(Path(method) / "metrics.jsonl")
    old = train_records(Path(f"{method}.resumed-by-old-code.jsonl"))
    assert [r["step"] for r in resumed] == [r["step"] for r in old] == [1, 2, 3, 4, 5, 6]
    assert resumed[:3] == old[:3]  # the old lines are kept as they were
    keys = ("loss", "reward", "reward_std", "rewards/margins", "rewards/accuracies")
    keys = [k for k in keys if k in old[0]]
    # Where today's straight run samples the old run's first three steps (its rewards and
    # losses equal to float32 rounding), the resumed steps are the old code's to rounding too:
    # each record is a float32 mean or std over O(1) terms, after at most three updates from
    # the same weights (rel 1e-5, about 80 float32 steps); GRPO's loss is rounding residue
    # around 0 (its advantages sum to zero), so abs 1e-6. Where this machine's kernels draw
    # other completions, the resumed steps only have to be finite.
    straight = ["--out", "straight", "--data-cache", "cache", "--preset", f"{method}/config.yaml"]
    assert train_main(straight) == 0

    def values(records) -> list[float]:
        return [r[k] for r in records for k in keys]

    def close(got, want) -> bool:
        return got == pytest.approx(want, rel=1e-5, abs=1e-6)

    fresh = train_records(Path("straight/metrics.jsonl"))
    if close(values(fresh[:3]), values(old[:3])):
        assert close(values(resumed), values(old))
    else:
        assert all(math.isfinite(r["loss"]) for r in resumed)
