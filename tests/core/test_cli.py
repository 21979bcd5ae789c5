import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from core.runs.folder import read_metrics
from core.train import main

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--preset", "cpu-tiny", "--seq-len", "32", "--hidden-dim", "32"]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    handler = signal.getsignal(signal.SIGINT)
    yield tmp_path
    signal.signal(signal.SIGINT, handler)


def cli(*args, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "core.train", *args], capture_output=True, text=True, env=env, **kw
    )


def one_line_error(capsys, *needles):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: ")
    for needle in needles:
        assert needle in err, err


def test_bad_input_is_one_line_without_traceback_and_exit_2():
    proc = cli("--preset", "nope")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: preset: unknown preset 'nope'; available: cpu-tiny, cpu, gpu-8gb, gpu-12gb, "
        "gpu-16gb, gpu-24gb, gpu-48gb, gpu-80gb, gpu-large, gpu-small, gpu"
    ]


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--batch-size", "0"], ["batch_size", "from 1 to 65536"]),
        (["--hidden-dim", "abc"], ["--hidden-dim", "invalid int value"]),
        (["--precision", "fp8"], ["precision", "auto, bf16, fp16, fp32"]),
        (["--n-heads", "3"], ["hidden_dim: 32 must be divisible by n_heads (3)"]),
        (["--data", "missing.txt"], ["data:", "missing.txt"]),
        (["--device", "cuda"], ["device: cuda requested but CUDA is not available"]),
        (["--resume", "nowhere"], ["resume: nowhere is not a run folder"]),
        (["--resume", "latest"], ["no run with a checkpoint found"]),
        (["--frobnicate"], ["unrecognized arguments: --frobnicate"]),
        (["--tokenizer", "bpe", "--vocab-size", "100"], ["vocab_size", "from 512 to 65536"]),
        (["--tokenizer", "words"], ["tokenizer", "bytes, bpe"]),
    ],
)
def test_bad_flags_name_the_field(capsys, args, needles):
    if args[:2] == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main([*TINY, *args]) == 2
    one_line_error(capsys, *needles)


def test_bad_preset_file_is_named(capsys, tmp_path):
    (tmp_path / "mine.yaml").write_text("hidden_dim: [\n")
    assert main(["--preset", str(tmp_path / "mine.yaml")]) == 2
    one_line_error(capsys, "mine.yaml: not valid YAML at line")


def test_train_then_refuse_overwrite_then_resume_with_changes(capsys, tmp_path):
    assert main([*TINY, "--max-steps", "6", "--out", "runs/first"]) == 0
    out = capsys.readouterr().out
    assert "Run folder: runs/first" in out and "Finished at step 6" in out
    before = (tmp_path / "runs/first/metrics.jsonl").read_bytes()

    assert main([*TINY, "--max-steps", "6", "--out", "runs/first"]) == 2
    one_line_error(capsys, "runs/first already holds a run", "--resume runs/first")
    assert (tmp_path / "runs/first/metrics.jsonl").read_bytes() == before

    assert main(["--resume", "runs/first", "--hidden-dim", "64"]) == 2
    one_line_error(capsys, "hidden_dim 32 -> 64 (architecture)")

    assert main(["--resume", "latest", "--max-steps", "9"]) == 0
    train, _ = read_metrics(tmp_path / "runs/first/metrics.jsonl")
    assert [r["step"] for r in train] == list(range(1, 10))


def test_the_progress_bar_draws_its_final_line_once(tmp_path):
    # stderr is a pipe here: every redraw of the bar is kept, split by carriage returns
    proc = cli(*TINY, "--max-steps", "20", "--eval-every", "10", "--out", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    finals = [line for line in re.split(r"[\r\n]", proc.stderr) if "| 20/20 [" in line]
    assert len(finals) == 1, finals
    assert finals[0].startswith("100%|") and "loss=" in finals[0]
    assert proc.stderr.endswith(finals[0] + "\n")  # the final line ends the bar's output
    assert "finished at step 20" in proc.stdout  # messages after the last step still print


def test_a_malicious_checkpoint_is_refused(capsys, tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    (tmp_path / "bad.pt").write_bytes(b"")
    torch.save({"format_version": 1, "x": Evil()}, tmp_path / "bad.pt")
    assert main(["--resume", str(tmp_path / "bad.pt")]) == 2
    one_line_error(capsys, "need code to load; refused")
    assert not (tmp_path / "pwned").exists()


def test_info_commands_exit_0(capsys):
    assert main(["--list-presets"]) == 0
    assert "gpu-80gb" in capsys.readouterr().out
    assert main(["--test-gpu"]) == 0
    report = capsys.readouterr().out
    assert "torch" in report and ("GPU 0" in report or "no CUDA GPU found" in report)
    assert main(["--preset", "gpu", "--estimate", "--device", "cuda"]) == 0
    est = capsys.readouterr().out
    for needle in ("activations", "parameters", "tokens per optimizer step", "FLOPs per token"):
        assert needle in est
    assert not Path("runs").exists()  # --estimate trains nothing


def test_estimate_names_the_longest_context_that_fits_free_ram(capsys, monkeypatch):
    from core.config import presets
    from core.platform import hardware
    from core.training.estimate import GB, usable_bytes
    from core.training.planner import longest_context

    monkeypatch.setattr(hardware, "gpus", lambda: [])
    monkeypatch.setattr(hardware, "cpu_info", lambda: {"ram_free_bytes": 2 * GB})
    cfg = presets.to_config(presets.load_preset("cpu"))
    longest = longest_context(cfg, usable_bytes(2 * GB), on_gpu=False)
    assert main(["--preset", "cpu", "--estimate"]) == 0
    out = capsys.readouterr().out
    assert f"Longest context: fits up to {longest:,} tokens in 2 GiB of free RAM" in out
    assert main(["--preset", "cpu", "--estimate", "--seq-len", str(longest + 256)]) == 0
    assert f"Longest context: {longest + 256:,} will NOT fit" in capsys.readouterr().out


def test_a_cpu_estimate_says_which_heap_it_is_for_and_what_the_default_holds(capsys, monkeypatch):
    from core.config import presets
    from core.platform import hardware, heap
    from core.training.estimate import GB, estimate

    monkeypatch.setattr(hardware, "gpus", lambda: [])
    monkeypatch.delenv("TRAINDECK_HEAP", raising=False)
    peak = estimate(presets.to_config(presets.load_preset("cpu")), on_gpu=False).device_total
    monkeypatch.setattr(heap, "room", lambda: heap.Room(64 * GB, "free"))
    assert main(["--preset", "cpu", "--estimate"]) == 0
    out = capsys.readouterr().out
    assert "The CPU estimate is for the lean C heap. A run here takes the fast heap" in out
    held = f"may hold up to {heap.FAST_HOLDS:g}x the estimate: about "
    assert held + f"{heap.FAST_HOLDS * peak / GB:.2f} GiB" in out
    monkeypatch.setattr(heap, "room", lambda: heap.Room(peak, "free"))  # under twice the peak
    assert main(["--preset", "cpu", "--estimate"]) == 0
    out = capsys.readouterr().out
    assert "A run here takes the lean heap (memory is tight: " in out
    assert f"about {peak / GB:.2f} GiB at its peak" in out


def test_ctrl_c_saves_and_exits_130_then_resume_finishes(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [*TINY, "--max-steps", "100000", "--out", "run"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "core.train", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and not (metrics.exists() and metrics.stat().st_size > 0):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Resume with: python -m core.train --resume run" in out
    stopped_at = torch.load(tmp_path / "run/checkpoints/latest.pt", weights_only=True)["step"]
    assert stopped_at > 0

    done = cli("--resume", "run", "--max-steps", str(stopped_at + 5), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    train, _ = read_metrics(metrics)
    assert [r["step"] for r in train] == list(range(1, stopped_at + 6))


def test_tensorboard_logging_writes_event_files(tmp_path):
    pytest.importorskip("tensorboard", reason="installed by the test extras")
    assert main([*TINY, "--max-steps", "4", "--out", "tb", "--tensorboard"]) == 0
    files = list((tmp_path / "tb" / "tensorboard").glob("events.out.tfevents.*"))
    assert files and files[0].stat().st_size > 100


def test_tensorboard_missing_is_a_clear_error(capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kw):
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    assert main([*TINY, "--max-steps", "2", "--out", "tb", "--tensorboard"]) == 2
    one_line_error(capsys, "tensorboard package is not installed", "pip install -e .[tensorboard]")


def test_a_refused_start_leaves_no_half_made_run_behind(capsys, tmp_path):
    assert main([*TINY, "--data", "missing.txt", "--out", "runs/x"]) == 2
    capsys.readouterr()
    assert not (tmp_path / "runs" / "x").exists()
    assert main([*TINY, "--max-steps", "2", "--out", "runs/x"]) == 0


def test_data_folder_with_chosen_extensions(capsys, tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "deep").mkdir(parents=True)
    (corpus / "deep" / "a.py").write_text("def f(x):\n    return x * 2\n" * 400)
    (corpus / "notes.txt").write_text("only text here\n" * 400)
    args = [*TINY, "--max-steps", "2", "--data", str(corpus)]
    assert main([*args, "--data-extensions", "py", "--out", "py-only"]) == 0
    log = (tmp_path / "py-only" / "train.log").read_text()
    assert "(1 files)" in log
    capsys.readouterr()
    assert main([*args, "--data-extensions", ".rst", "--out", "none"]) == 2
    one_line_error(capsys, "holds no files ending in .rst")


def test_prepare_only_prints_the_figures_then_reuses_the_cache(capsys, tmp_path):
    text = tmp_path / "book.txt"
    text.write_text("Call me Ishmael. Some years ago, never mind how long precisely.\n" * 3000)
    args = ["--prepare-only", "--data", str(text), "--tokenizer", "bpe", "--vocab-size", "512"]
    args += ["--data-cache", str(tmp_path / "cache")]
    assert main(args) == 0
    out = capsys.readouterr().out
    size = text.stat().st_size
    assert f"Bytes: {size:,} of {size:,}" in out
    assert "bpe tokenizer" in out and "Bytes per token:" in out
    cache_line = [line for line in out.splitlines() if line.startswith("Cache: ")][0]
    assert Path(cache_line[7:]).parent == tmp_path / "cache"
    assert not (tmp_path / "runs").exists()  # preparing is not training
    assert main(args) == 0
    assert "reused from the cache" in capsys.readouterr().out


def test_optimizer_betas_and_bias_free_layers_are_flags(capsys, tmp_path):
    from core.cli.train import build_config, build_parser

    args = build_parser().parse_args([*TINY, "--beta2", "0.99", "--no-bias"])
    cfg, _, _ = build_config(args)
    assert (cfg.beta1, cfg.beta2, cfg.bias) == (0.9, 0.99, False)
    assert main([*TINY, "--beta2", "1.5"]) == 2
    one_line_error(capsys, "beta2", "0.0 to 0.99999")
