"""--shard (FSDP2) in two torchrun processes on the CPU (gloo): the same losses as one process
at the same global batch, a 2-rank checkpoint resumed on 1 process and on 2, a 1-process
checkpoint resumed on 2 (full training and QLoRA), a LoRA fine-tune
of a pretrained-shaped mixture of experts, and a killed or silent rank ending the run with one
line. One process under torchrun: tests/core/test_sharding.py."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.runs import checkpoint as ckpt
from core.runs.folder import read_metrics

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
TINY = ["--preset", "cpu-tiny", "--max-steps", "8", "--log-every", "1", "--eval-every", "4"]
TINY += ["--ckpt-every", "4", "--sample-tokens", "8"]


def env(**extra):
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra}


def run(*args, cwd):
    proc = subprocess.run(args, cwd=cwd, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def train(cwd, *args, processes: int = 0):
    """python -m core.train, or under torchrun with that many processes."""
    launcher = [*TORCHRUN, str(processes)] if processes else [sys.executable]
    return run(*launcher, "-m", "core.train", *args, cwd=cwd)


def losses(run_dir):
    train_rows, evals = read_metrics(run_dir / "metrics.jsonl")
    return [r["loss"] for r in train_rows], [r["val_loss"] for r in evals]


def assert_close(a, b, rel=1e-5):
    (la, va), (lb, vb) = a, b
    assert len(la) == len(lb) and len(va) == len(vb)
    assert la == pytest.approx(lb, rel=rel) and va == pytest.approx(vb, rel=rel)


@pytest.mark.slow  # over ~10 s on 2 cores
def test_two_sharded_ranks_train_as_one_process_and_resume_on_one_or_two(tmp_path):
    out = train(tmp_path, *TINY, "--batch-size", "4", "--shard", "--out", "sh", processes=2)
    assert out.stdout.count("Finished at step 8") == 1  # only rank 0 reports
    train(tmp_path, *TINY, "--batch-size", "8", "--out", "one")
    sh = tmp_path / "sh"
    # Two ranks at 4 sequences each, one process at 8: the same steps, to fp32 rounding.
    assert_close(losses(sh), losses(tmp_path / "one"))
    assert ckpt.load(sh / "checkpoints" / "latest.pt")["shards"] == "shards/step-000008"
    assert len(list((sh / "checkpoints" / "shards" / "step-000008").glob("*.distcp"))) == 2
    assert (sh / "samples.txt").read_text(encoding="utf-8").count("--- step") == 2

    # The step-4 checkpoint of the two ranks, resumed on two ranks (the same split: exact)
    # and in one process (the batch kept: 4 x 2 accumulated; to rounding).
    for name in ("on2", "on1"):
        shutil.copytree(sh, tmp_path / name)
    step4 = "checkpoints/step-000004.pt"
    train(tmp_path, "--resume", f"on2/{step4}", processes=2)
    assert losses(tmp_path / "on2") == losses(sh)
    one = train(tmp_path, "--resume", f"on1/{step4}")
    assert "processes 2 -> 1 (same effective batch)" in one.stdout + one.stderr
    assert_close(losses(tmp_path / "on1"), losses(sh))

    # The one-process run's step 4 (a whole file), resumed sharded over two ranks.
    shutil.copytree(tmp_path / "one", tmp_path / "grown")
    two = train(tmp_path, "--resume", f"grown/{step4}", "--shard", processes=2)
    assert "processes 1 -> 2 (same effective batch)" in two.stdout + two.stderr
    assert_close(losses(tmp_path / "grown"), losses(tmp_path / "one"))

    # An export reads the sharded checkpoint as one model: the single-file run's weights.
    from core.weights.loader import load

    a = load(sh, "latest").model.state_dict()
    b = load(tmp_path / "on1", "latest").model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] - b[k]).abs().max() < 1e-5, k


@pytest.mark.slow  # over ~10 s on 2 cores
def test_lora_on_a_sharded_mixture_of_experts_trains_as_one_process(tmp_path):
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "tests"))
    from hf_models import TEXT, make_model

    make_model(tmp_path / "model", "qwen3_moe")
    (tmp_path / "text.txt").write_text(TEXT * 5, encoding="utf-8")
    args = ["--init-from", "model", "--tokenizer", "model", "--data", "text.txt"]
    args += ["--lora-rank", "4", "--grad-checkpointing", "--seq-len", "32", "--lr", "1e-2"]
    args += ["--max-steps", "4", "--log-every", "1", "--eval-every", "2", "--eval-batches", "1"]
    args += ["--sample-tokens", "0", "--warmup-steps", "0", "--dropout", "0", "--device", "cpu"]
    train(tmp_path, *args, "--batch-size", "2", "--shard", "--out", "sh", processes=2)
    train(tmp_path, *args, "--batch-size", "4", "--out", "one")
    assert_close(losses(tmp_path / "sh"), losses(tmp_path / "one"))
    state = ckpt.load(tmp_path / "sh" / "checkpoints" / "latest.pt")
    assert state["adapters_only"] and "model" not in state
    saved = ckpt.read_shards(tmp_path / "sh" / "checkpoints" / state["shards"])
    assert saved and all(".lora_" in k for k in saved)  # the base is on disk already


@pytest.mark.slow  # over ~10 s on 2 cores
def test_qlora_sharded_over_two_ranks_trains_as_one_process_resumes_and_exports(
    tmp_path, monkeypatch
):
    pytest.importorskip("bitsandbytes")
    sys.path.insert(0, str(ROOT / "tests"))
    from hf_models import TEXT, make_model

    make_model(tmp_path / "model", "llama")
    (tmp_path / "text.txt").write_text(TEXT * 5, encoding="utf-8")
    args = ["--init-from", "model", "--tokenizer", "model", "--data", "text.txt"]
    args += ["--lora-rank", "4", "--base-bits", "4", "--seq-len", "32", "--lr", "1e-2"]
    args += ["--max-steps", "4", "--log-every", "1", "--eval-every", "2", "--eval-batches", "1"]
    args += ["--ckpt-every", "2", "--sample-tokens", "0", "--warmup-steps", "0"]
    args += ["--dropout", "0", "--device", "cpu"]
    train(tmp_path, *args, "--batch-size", "2", "--shard", "--out", "sh", processes=2)
    train(tmp_path, *args, "--batch-size", "4", "--out", "one")
    sh = tmp_path / "sh"
    # The same NF4 base on both sides: two ranks equal one process to fp32 rounding.
    assert_close(losses(sh), losses(tmp_path / "one"))
    # Each rank holds about half the parameters: the packed 4-bit base is split too.
    held = [ln for ln in (sh / "train.log").read_text(encoding="utf-8").splitlines()]
    held = [ln for ln in held if "sharded over 2 processes" in ln][0]
    mine, whole = (float(x.replace(",", "")) for x in re.findall(r"([\d,]+) KiB", held))
    assert 0.45 < mine / whole < 0.55, held

    # The step-2 checkpoint resumed on two ranks: the uninterrupted run's losses exactly.
    shutil.copytree(sh, tmp_path / "again")
    train(tmp_path, "--resume", "again/checkpoints/step-000002.pt", processes=2)
    assert losses(tmp_path / "again") == losses(sh)
    # The one-process run's step 2, resumed sharded: the adapters and their AdamW state split.
    shutil.copytree(tmp_path / "one", tmp_path / "grown")
    train(tmp_path, "--resume", "grown/checkpoints/step-000002.pt", "--shard", processes=2)
    assert_close(losses(tmp_path / "grown"), losses(tmp_path / "one"))

    # The exports' loader reads the sharded adapters: the one-process run's model, to rounding.
    from core.weights.loader import load

    monkeypatch.chdir(tmp_path)  # the runs name their base as given: "model"
    a, b = load(sh, "latest").model.state_dict(), load(tmp_path / "one", "latest").model
    b = b.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k].float() - b[k].float()).abs().max() < 1e-4, k


def start_killable(tmp_path, name):
    """A long sharded run in two ranks; returns (torchrun, rank 1's process) once it trains."""
    import psutil

    args = [*TORCHRUN, "2", "-m", "core.train", "--preset", "cpu-tiny", "--shard"]
    args += ["--max-steps", "100000", "--log-every", "1", "--out", name]
    proc = subprocess.Popen(
        args,
        cwd=tmp_path,
        env=env(TRAINDECK_DIST_TIMEOUT="5"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = tmp_path / name / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and metrics.stat().st_size):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-2000:]
        time.sleep(0.2)
    ranks = psutil.Process(proc.pid).children(recursive=True)
    return proc, next(p for p in ranks if p.environ().get("RANK") == "1")


def our_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.slow  # over ~10 s on 2 cores
def test_a_killed_rank_ends_the_run_in_seconds_with_one_line_naming_it(tmp_path):
    proc, rank1 = start_killable(tmp_path, "run")
    pid, start = rank1.pid, time.monotonic()
    rank1.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and time.monotonic() - start < 15
    assert our_lines(err) == [
        f"error: rank 1 (pid {pid}) stopped (killed or crashed), so rank 0 stops too; "
        "no checkpoint was saved yet"
    ]


@pytest.mark.slow  # over ~10 s on 2 cores
def test_a_silent_rank_times_out_with_one_line(tmp_path):
    proc, rank1 = start_killable(tmp_path, "run")
    rank1.send_signal(signal.SIGSTOP)  # alive, answering nothing: a hung collective
    status = tmp_path / "run" / "status.json"
    start = time.monotonic()
    try:
        while '"failed"' not in status.read_text(encoding="utf-8"):
            assert time.monotonic() - start < 60, "rank 0 still waits"
            time.sleep(0.2)
    finally:
        rank1.kill()  # torchrun would wait 30 s for a stopped process to take SIGTERM
    _, err = proc.communicate(timeout=120)
    assert our_lines(err) == [
        "error: rank 0 waited 5 s for the other processes in a collective and gave up: one of "
        "them hangs (TRAINDECK_DIST_TIMEOUT sets the wait); no checkpoint was saved yet"
    ]
