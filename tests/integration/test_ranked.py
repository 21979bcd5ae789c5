"""core.training.ranked: a sharded run a front end starts through torchrun (two processes on
the CPU, gloo). Its events reach the parent; bad input comes back as the one-line failure;
a parent that goes away leaves a stopped run with its checkpoint, not ranks training blind.
The window's own run: tests/gui/test_shard_gui.py."""

from __future__ import annotations

import json

import pytest
from helpers import tiny_config

from core.runs import checkpoint as ckpt
from core.runs.events import TrainControl
from core.training.child_process import FAILED
from core.training.ranked import RankedRun, last_error_line

pytestmark = pytest.mark.slow  # torchrun's processes start in seconds each


def sharded(**values):
    values = dict(shard=True, log_every=1, eval_every=10**6, sample_tokens=0) | values
    return tiny_config(**values)


def test_bad_input_comes_back_as_its_one_line(tmp_path):
    run = RankedRun(sharded(data=str(tmp_path / "missing.txt")), tmp_path / "run", None,
                    TrainControl(), 2)  # fmt: skip
    run.start()
    got = list(run.events())
    failed = [args for name, args in got if name == FAILED]
    assert failed and failed[0][0] == "input" and "missing.txt" in failed[0][1]
    assert "\n" not in failed[0][1]
    assert run.process.returncode != 0


def test_the_parent_going_away_stops_the_run_with_a_checkpoint(tmp_path):
    run = RankedRun(sharded(max_steps=10**5), tmp_path / "run", None, TrainControl(), 2)
    run.start()
    for name, args in run.events():
        if name == "on_train_batch_end" and args[0]["step"] >= 3:
            run._conn.close()  # as a window that crashed or was closed
            break
    run.process.wait(timeout=120)
    status = json.loads((tmp_path / "run" / "status.json").read_text(encoding="utf-8"))
    assert status["state"] == "stopped"
    assert ckpt.load(tmp_path / "run" / "checkpoints" / "latest.pt")["step"] >= 3


def test_the_last_error_line_is_the_ranks_own():
    text = "W1128 noise\nerror: rank 1: data: x.txt not found\nTraceback (most recent call last):"
    assert last_error_line(text) == "rank 1: data: x.txt not found"
    assert last_error_line("nothing of ours") == ""


def test_a_stop_before_rank_0_connects_ends_the_run_cleanly(tmp_path):
    control = TrainControl()
    run = RankedRun(sharded(max_steps=10**5), tmp_path / "run", None, control, 2)
    control.request_stop()  # pressed while torchrun still starts
    run.start()
    got = dict(run.events())
    assert got["result"][0]["status"] in ("cancelled", "stopped")
    assert run.process.returncode == 0
