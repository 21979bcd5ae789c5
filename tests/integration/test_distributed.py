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
    out = run(
        *torchrun,
        "--nproc_per_node",
        "2",
        "-m",
        "core.train",
        *ARGS,
        "--batch-size",
        "4",
        "--out",
        "ddp",
        cwd=tmp_path,
    )
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


@pytest.mark.slow  # over ~10 s on 2 cores
def test_grpo_in_two_processes_samples_and_weighs_as_one_process(tmp_path):
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "tests"))
    from hf_models import make_model

    make_model(tmp_path / "model", "qwen2")
    data = ROOT / "tests" / "fixtures" / "arithmetic.jsonl"
    args = [
        "--init-from",
        str(tmp_path / "model"),
        "--tokenizer",
        "model",
        "--data",
        str(data),
        "--method",
        "grpo",
        "--reward",
        "regex",
        "--reward-regex",
        r"^\s*\d",
        "--num-generations",
        "4",
        "--max-completion-tokens",
        "6",
        "--seq-len",
        "64",
        "--lr",
        "1e-2",
        "--dropout",
        "0",
        "--max-steps",
        "4",
        "--log-every",
        "1",
        "--eval-every",
        "4",
        "--eval-batches",
        "1",
        "--sample-tokens",
        "0",
        "--warmup-steps",
        "0",
        "--scale-rewards",
        "batch",
        "--device",
        "cpu",
    ]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    run(
        *torchrun,
        "--nproc_per_node",
        "2",
        "-m",
        "core.train",
        *args,
        "--batch-size",
        "2",
        "--out",
        "ddp",
        cwd=tmp_path,
    )
    run(
        sys.executable, "-m", "core.train", *args, "--batch-size", "4", "--out", "one", cwd=tmp_path
    )

    ddp_train, ddp_eval = read_metrics(tmp_path / "ddp" / "metrics.jsonl")
    one_train, one_eval = read_metrics(tmp_path / "one" / "metrics.jsonl")
    assert [r["step"] for r in ddp_train] == [1, 2, 3, 4]
    # Step 1 samples from the same weights with the same draws: the same completions, weighed
    # over the whole batch (scale_rewards batch needs every process's rewards), the same loss.
    # Its gradient sums 2x2 rows in two processes and 4 in one, in another order, so the
    # weights after it agree to rounding only and a later step may sample one token otherwise
    # (one did at step 4 on an AMD EPYC): there, two completions' worth of tolerance, and the
    # loss compared while the samples are still the same.
    keys = ("reward", "reward_std", "frac_reward_zero_std", "completions/mean_length")
    assert [ddp_train[0][k] for k in keys] == [one_train[0][k] for k in keys]
    n = 4 * 4  # completions a step: 4 prompts, 4 each
    for a, b in zip(ddp_train, one_train, strict=True):
        assert a["reward"] == pytest.approx(b["reward"], abs=2 / n)
        assert a["completions/mean_length"] == pytest.approx(
            b["completions/mean_length"], abs=2 * 6 / n
        )
        if [a[k] for k in keys] == [b[k] for k in keys]:
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
            assert a["entropy"] == pytest.approx(b["entropy"], rel=1e-4)
    assert [e["step"] for e in ddp_eval] == [e["step"] for e in one_eval]
    for a, b in zip(ddp_eval, one_eval, strict=True):  # one held-out prompt's worth
        assert a["eval_reward"] == pytest.approx(b["eval_reward"], abs=0.5)
    table = (tmp_path / "ddp" / "completions.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(table) == 4  # one line a step, written by rank 0 alone
