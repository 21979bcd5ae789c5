"""torchrun/DDP on the CPU (gloo): two processes at micro-batch 4 train like one at 8."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.runs.folder import read_metrics

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--preset", "cpu-tiny", "--max-steps", "8", "--log-every", "1", "--eval-every", "4"]


def run(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


@pytest.mark.slow  # over ~10 s on 2 cores
def test_two_processes_match_one_process_with_the_whole_batch(tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    out = run(*torchrun, "--nproc_per_node", "2", "-m", "core.train", *ARGS,
              "--batch-size", "4", "--out", "ddp", cwd=tmp_path)  # fmt: skip
    assert out.stdout.count("Finished at step 8") == 1  # only rank 0 reports
    run(
        sys.executable, "-m", "core.train", *ARGS, "--batch-size", "8", "--out", "one", cwd=tmp_path
    )

    ddp_train, ddp_eval = read_metrics(tmp_path / "ddp" / "metrics.jsonl")
    one_train, one_eval = read_metrics(tmp_path / "one" / "metrics.jsonl")
    assert [r["step"] for r in ddp_train] == list(range(1, 9))
    for a, b in zip(ddp_train, one_train, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    for a, b in zip(ddp_eval, one_eval, strict=True):
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)
    assert (tmp_path / "ddp" / "checkpoints" / "latest.pt").is_file()
    assert not list((tmp_path / "ddp").glob("rank*"))  # one run folder, written by rank 0
