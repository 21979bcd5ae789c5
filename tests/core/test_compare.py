"""Reading a run's metrics.jsonl back (plots refilled on resume, the Compare tab): every
objective's evaluations count, and a damaged line is skipped, never a crash."""

from __future__ import annotations

import json

from core.runs.compare import run_curves, run_summary
from core.runs.folder import drop_records_past, read_metrics


def write_metrics(folder, records: list, extra_lines: tuple = ()) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) for r in records] + list(extra_lines)
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


GRPO = [
    {"step": 0, "eval_reward": 0.1, "eval_rewards/answer/mean": 0.1, "train_s": 0.0},
    {"step": 1, "loss": 0.0, "reward": 0.2, "reward_std": 0.1, "elapsed_s": 1.0},
    {"step": 2, "loss": 0.01, "reward": 0.5, "reward_std": 0.2, "elapsed_s": 2.0},
    {"step": 2, "eval_reward": 0.6, "eval_rewards/answer/mean": 0.6, "train_s": 2.0},
    {"step": 3, "loss": -0.02, "reward": 0.4, "reward_std": 0.2, "elapsed_s": 3.0},
    {"step": 4, "eval_reward": 0.5, "train_s": 4.0},
]


def test_grpo_evaluations_are_read_as_evaluations(tmp_path):
    write_metrics(tmp_path, GRPO)
    train, evals = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in train] == [1, 2, 3]
    assert [r["eval_reward"] for r in evals] == [0.1, 0.6, 0.5]


def test_damaged_and_non_record_lines_are_skipped(tmp_path):
    sft = [{"step": 1, "loss": 3.0}, {"step": 1, "val_loss": 3.1, "val_bpb": 1.2}]
    write_metrics(tmp_path, sft, extra_lines=("{not json", "[1, 2]", "7", "null", '"text"'))
    train, evals = read_metrics(tmp_path / "metrics.jsonl")
    assert train == [sft[0]] and evals == [sft[1]]


def test_a_grpo_run_compares_by_its_reward(tmp_path):
    write_metrics(tmp_path / "g", GRPO)
    curves = run_curves(tmp_path / "g", "reward")
    assert curves["train"] == [(1, 1.0, 0.2), (2, 2.0, 0.5), (3, 3.0, 0.4)]
    assert curves["val"] == [(0, 0.0, 0.1), (2, 2.0, 0.6), (4, 4.0, 0.5)]
    assert run_curves(tmp_path / "g", "loss")["val"] == []  # no validation loss to draw
    summary = run_summary(tmp_path / "g")
    assert summary == {"eval_reward": 0.5, "best eval_reward": 0.6}  # higher is better


def test_an_sft_run_keeps_its_loss_summary(tmp_path):
    records = [
        {"step": 2, "loss": 2.0},
        {"step": 2, "val_loss": 2.5},
        {"step": 4, "val_loss": 2.2},
        {"step": 6, "val_loss": 2.3},
    ]
    write_metrics(tmp_path / "s", records)
    assert run_summary(tmp_path / "s") == {"val_loss": 2.3, "best val_loss": 2.2}
    curves = run_curves(tmp_path / "s", "reward")  # no reward: nothing drawn for it
    assert curves["train"] == [] and curves["val"] == []


def test_resume_keeps_records_up_to_its_step_and_drops_cut_or_foreign_lines(tmp_path):
    records = [{"step": 1, "loss": 3.0}, {"step": 2, "val_loss": 2.9}, {"step": 3, "loss": 2.8}]
    write_metrics(tmp_path, records, extra_lines=("[1, 2]", '{"step": 4, "lo'))
    assert drop_records_past(tmp_path / "metrics.jsonl", 2) == 3
    train, evals = read_metrics(tmp_path / "metrics.jsonl")
    assert train == records[:1] and evals == records[1:2]
