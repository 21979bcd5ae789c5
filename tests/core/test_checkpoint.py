import os
import random
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from core.errors import CheckpointError
from core.runs import checkpoint as ckpt


def state(value: float) -> dict:
    return {"format_version": 1, "step": int(value), "w": torch.full((1000,), value)}


def test_failed_write_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    path = tmp_path / "latest.pt"
    ckpt.save(state(1.0), path)
    real_save = torch.save

    def dies_half_way(obj, f):
        real_save(obj, f)
        f.truncate(f.tell() // 2)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", dies_half_way)
    with pytest.raises(OSError):
        ckpt.save(state(2.0), path)
    monkeypatch.undo()
    loaded = ckpt.load(path)
    assert loaded["step"] == 1 and torch.equal(loaded["w"], torch.full((1000,), 1.0))
    assert [p.name for p in tmp_path.iterdir()] == ["latest.pt"]  # no temp file left


WRITER = """
import sys, torch
from core.runs import checkpoint as ckpt
path = sys.argv[1]
big = torch.randn(8_000_000)
i = 0
while True:
    i += 1
    ckpt.save({"format_version": 1, "step": i, "w": big + i}, path)
    print(i, flush=True)
"""


def test_a_process_killed_mid_write_leaves_a_loadable_checkpoint(tmp_path):
    path = tmp_path / "latest.pt"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "1"  # one whole checkpoint exists
        time.sleep(0.15)  # now it is somewhere inside a later write
    finally:
        proc.kill()
        proc.wait()
    loaded = ckpt.load(path)  # the last whole write, never a torn one
    assert loaded["step"] >= 1
    assert loaded["w"].shape == (8_000_000,)
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == ["latest.pt"]


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_that_needs_code_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"format_version": 1, "payload": Evil(marker)}, path)
    with pytest.raises(CheckpointError, match="need code to load; refused"):
        ckpt.load(path)
    assert not marker.exists()


def test_damaged_and_foreign_files_are_clear_errors(tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="junk.pt is damaged or not a checkpoint"):
        ckpt.load(junk)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(2)}, foreign)
    with pytest.raises(CheckpointError, match="not a TrainDeck checkpoint"):
        ckpt.load(foreign)
    with pytest.raises(CheckpointError, match="not found"):
        ckpt.load(tmp_path / "missing.pt")


def test_rng_states_survive_a_save_and_load(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    saved = ckpt.rng_state()
    ckpt.save({"format_version": 1, "rng": saved}, tmp_path / "r.pt")
    expected = (random.random(), np.random.rand(), torch.rand(1))
    ckpt.set_rng_state(ckpt.load(tmp_path / "r.pt")["rng"])
    assert (random.random(), np.random.rand()) == expected[:2]
    assert torch.equal(torch.rand(1), expected[2])
