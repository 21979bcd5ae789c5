"""The CPU estimate against the measured peak of real training steps at long context (2k to
16k tokens), and the longest context it answers.

What is compared: a tiny Llama-shaped model (width 64, 2 layers, bytes tokenizer, batch 1,
fp32, one thread) trains one step at each context in one subprocess, in ascending order. Before
each, the token cache is prepared, freed memory goes back to the system (malloc_trim) and
Linux's peak (VmHWM) restarts from the resident memory; the measured peak is VmHWM less that
resident memory. Warm-up steps come first (256 tokens, then 2,560 tiled and chunked, with and
without checkpointing: their first use loads code, 16 MiB in CI's fresh venv), so what torch
loads on its first steps is in the baseline: the estimate's `runtime` row is that part, and it
is left out of the comparison (device_total - runtime: weights, optimizer, activations, logits,
the heap's slack).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.config.spec import TrainConfig, validate
from core.training.estimate import GB, MB, estimate
from core.training.planner import longest_context

ROOT = Path(__file__).resolve().parents[2]

PEAKS = r"""
import contextlib, ctypes, gc, io, json, sys, tempfile
import psutil, torch
from core.cli.train import prepare_only
from core.config.spec import TrainConfig, validate
from core.training.estimate import estimate
from core.training.trainer import Trainer

torch.set_num_threads(1)
libc = ctypes.CDLL("libc.so.6")
base, points = json.loads(sys.argv[1]), json.loads(sys.argv[2])
# tiled, chunked and checkpointed once before measuring: their first use loads code
WARM_UP = [(256, {}), (2560, {}), (2560, {"grad_checkpointing": True})]
out = []
for seq, shape in [*WARM_UP, *points]:
    cfg = validate(TrainConfig(seq_len=seq, **{**base, **shape}))
    with contextlib.redirect_stdout(io.StringIO()):
        prepare_only(cfg, None)
    gc.collect()
    libc.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:  # VmHWM restarts from here
        f.write("5")
    before = psutil.Process().memory_info().rss
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        Trainer(cfg, tmp + "/run").run()
    status = open("/proc/self/status").read()
    peak = int(status.split("VmHWM:")[1].split()[0]) * 1024
    est = estimate(cfg, on_gpu=False)
    out.append({"seq": seq, "est": est.device_total - est.runtime, "measured": peak - before})
print(json.dumps(out[len(WARM_UP):]))
"""

SHAPE = dict(
    hidden_dim=64,
    n_layers=2,
    n_heads=2,
    arch="llama",
    batch_size=1,
    grad_accum=1,
    precision="fp32",
    device="cpu",
    dropout=0.0,
    tokenizer="bytes",
    max_steps=1,
    log_every=1,
    eval_every=10**9,
    eval_batches=1,  # the run still evaluates at its first and last step: one window each
    ckpt_every=10**9,
    keep_checkpoints=0,
    sample_tokens=0,
    corpus_max_bytes=400_000,  # a tenth held out: 40k tokens, past the longest context
)


def measured_peaks(points: list[tuple[int, dict]], base: dict = SHAPE) -> list[dict]:
    """The estimate and the measured peak at each (context, base's changes), in this order."""
    # the lean heap the estimate describes, which a run takes where memory is tight
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRAINDECK_HEAP": "lean"}
    done = subprocess.run(
        [sys.executable, "-c", PEAKS, json.dumps(base), json.dumps(points)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


CKPT = {"n_layers": 4, "grad_checkpointing": True}


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux's VmHWM reset")
@pytest.mark.parametrize(
    "points",
    [
        [(2048, {}), (16384, {}), (4096, CKPT)],
        pytest.param([(4096, {}), (8192, {}), (8192, CKPT)], marks=pytest.mark.slow),
    ],
)
def test_the_cpu_estimate_is_within_15_percent_of_the_measured_peak(points):
    peaks = measured_peaks(points)
    assert [p["seq"] for p in peaks] == [seq for seq, _ in points]
    for p in peaks:
        error = p["est"] / p["measured"] - 1
        assert abs(error) <= 0.15, (p["seq"], p["est"] / MB, p["measured"] / MB, error)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux's VmHWM reset")
def test_a_gemma4_fine_tunes_estimate_counts_what_its_model_keeps(tmp_path):
    """Gemma 4 (per-layer inputs, the last layers reusing keys and values) with LoRA and
    checkpointing, offloading asked: its model keeps every block's input (core.models.offload:
    nothing of Gemma 4's is offloaded, and the CPU offloads nothing) beside the per-layer
    inputs and the shared keys and values; the estimate counts them, within 15% of the peak."""
    pytest.importorskip("transformers")
    from hf_models import make_model

    make_model(tmp_path / "gemma4", "gemma4", max_position_embeddings=16384)
    shape = ("hidden_dim", "n_layers", "n_heads", "arch", "tokenizer")  # the model's own
    base = {k: v for k, v in SHAPE.items() if k not in shape}
    base |= dict(init_from=str(tmp_path / "gemma4"), tokenizer="model", lora_rank=4)
    asked = {"grad_checkpointing": True, "offload_checkpoints": True}
    (p,) = measured_peaks([(8192, asked)], base)
    error = p["est"] / p["measured"] - 1
    assert abs(error) <= 0.15, (p["est"] / MB, p["measured"] / MB, error)


def test_the_longest_context_is_where_the_estimate_meets_the_budget():
    cfg = validate(TrainConfig(seq_len=2048, **SHAPE))
    need = {t: estimate(validate(TrainConfig(seq_len=t, **SHAPE)), on_gpu=False) for t in (4096,)}
    budget = need[4096].device_total
    assert longest_context(cfg, budget, on_gpu=False) == 4096  # exactly at the budget: fits
    assert longest_context(cfg, budget - 1, on_gpu=False) == 4096 - 256  # whole steps of 256
    assert longest_context(cfg, 10 * GB, on_gpu=False) == 65536  # the field's own limit
    assert longest_context(cfg, 1, on_gpu=False) == 0  # not even 8 tokens
    # checkpointing and a smaller batch buy context; a larger batch costs it
    ckpt = validate(TrainConfig(seq_len=2048, **{**SHAPE, "n_layers": 8}))
    on = validate(TrainConfig(seq_len=2048, **{**SHAPE, "n_layers": 8, "grad_checkpointing": True}))
    assert longest_context(on, GB, on_gpu=False) > longest_context(ckpt, GB, on_gpu=False)
    four = validate(TrainConfig(seq_len=2048, **{**SHAPE, "batch_size": 4}))
    assert longest_context(four, GB, on_gpu=False) < longest_context(cfg, GB, on_gpu=False)
