"""What a GRPO run reports about itself: tokens/s counts the prompt and completion tokens it
trained on (not G x seq_len padded rows), the start's log line counts prompts, and best.pt
records the held-out reward as a reward, which the resume dialog shows as one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from helpers import tiny_config  # noqa: E402
from hf_models import make_model  # noqa: E402

from core.runs.folder import checkpoint_summary  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402

ARITHMETIC = Path(__file__).parent.parent / "fixtures" / "arithmetic.jsonl"


def grpo_config(model_dir, **kw):
    values = dict(
        init_from=str(model_dir),
        tokenizer="model",
        data=str(ARITHMETIC),
        method="grpo",
        reward=["regex"],
        reward_regex=r"^\s*\d",
        num_generations=4,
        max_completion_tokens=6,
        seq_len=64,
        lr=1e-2,
        dropout=0.0,
        max_steps=2,
        batch_size=2,
        eval_every=2,
        ckpt_every=100,
        eval_batches=1,
        sample_tokens=0,
        log_every=1,
        warmup_steps=0,
    )
    values.update(kw)
    return tiny_config(**values)


def test_a_step_counts_the_prompt_and_completion_tokens_it_trains_on(tmp_path):
    make_model(tmp_path / "model", "qwen2")
    t = Trainer(grpo_config(tmp_path / "model"), tmp_path / "run")
    t._setup()
    run, cfg, objective = t.run_state, t.cfg, t.objective
    starts = t.data.sample_starts(cfg.batch_size)
    chunks = objective.micro_batches(run, cfg, starts, 0)
    prompts = sum(len(t.data.ids[int(i)]) for i in starts) * cfg.num_generations
    completions = sum(int(c.completion_mask.sum()) for c in chunks)
    counted = objective.step_tokens(objective.step_signals(torch.zeros(6)), cfg)
    assert counted == prompts + completions
    assert counted < cfg.tokens_per_step  # the padded rows' count it replaces
    t._end("stopped")


def test_best_checkpoint_records_the_reward_and_the_dialog_shows_it(tmp_path):
    pytest.importorskip("PySide6")
    from gui.resume_dialog import summary_html

    make_model(tmp_path / "model", "qwen2")
    always = grpo_config(tmp_path / "model", reward_regex=r"^")  # every completion scores 1
    result = Trainer(always, tmp_path / "run").run()
    assert result["status"] == "finished"
    lines = (tmp_path / "run" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    evals = [r for r in map(json.loads, lines) if "eval_reward" in r]
    assert [e["eval_reward"] for e in evals] == [1.0, 1.0]  # the base model's, step 2's
    log = (tmp_path / "run" / "train.log").read_text(encoding="utf-8")
    assert "train prompts (" in log and "train tokens" not in log
    best = checkpoint_summary(tmp_path / "run" / "checkpoints" / "best.pt")
    assert best["eval_reward"] == 1.0  # not minus it
    assert best["val_loss"] is None  # minus the reward is no loss
    html = summary_html(tmp_path / "best.pt", tmp_path / "run", best, "finished")
    assert "Best eval reward</b>&nbsp;&nbsp;</td><td>1.0000<" in html
    assert "Best val loss" not in html
