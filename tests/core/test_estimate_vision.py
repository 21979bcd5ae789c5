"""The estimate of a run that trains a vision tower (--train-vision) on images: its weights,
what trains of it and its activations per image are rows of the estimate (--estimate names
them), and the CPU estimate is within the project's 15% of the measured peak of real
training steps on a tiny Gemma 3 composite whose tower holds most of the step's memory.
Measured as tests/core/test_estimate_long_context.py measures (VmHWM over the resident
memory before the run, in a subprocess, after a warm-up run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from vision_models import make_gemma3_vision, save_image

from core.config.spec import TrainConfig, validate
from core.training.estimate import MB, estimate

ROOT = Path(__file__).resolve().parents[2]
IMAGES = 4  # images in each example; a row holds one example
TOWER = dict(hidden_size=64, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4)

PEAK = r"""
import contextlib, ctypes, gc, io, json, sys, tempfile
import psutil, torch
from core.config.spec import TrainConfig, validate
from core.training.estimate import estimate
from core.training.trainer import Trainer

torch.set_num_threads(1)
libc = ctypes.CDLL("libc.so.6")
values, images = json.loads(sys.argv[1]), int(sys.argv[2])
out = []
for warm in (True, False):  # the first run loads torch's code: its memory is the baseline
    cfg = validate(TrainConfig(**values))
    gc.collect()
    libc.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:  # VmHWM restarts from here
        f.write("5")
    before = psutil.Process().memory_info().rss
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        Trainer(cfg, tmp + "/run").run()
    peak = int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) * 1024
    est = estimate(cfg, on_gpu=False, images_per_row=images)
    out.append({"est": est.device_total - est.runtime, "measured": peak - before})
print(json.dumps(out[-1]))
"""


@pytest.fixture(scope="module")
def composite(tmp_path_factory):
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("g3mem")
    make_gemma3_vision(root / "base", layers=2, image_size=224, tower=TOWER)
    lines = []
    for i in range(4):
        parts = [{"type": "image", "image": f"{(i + k) % 4}.png"} for k in range(IMAGES)]
        save_image(root / f"{i}.png", "png", (60, 40), i)
        user = {"role": "user", "content": [*parts, {"type": "text", "text": "Which?"}]}
        answer = {"role": "assistant", "content": "red" if i % 2 else "blue"}
        lines.append(json.dumps({"messages": [user, answer]}))
    (root / "chat.jsonl").write_text("\n".join(lines), encoding="utf-8")
    return root


def measured_peak(values: dict, images: int) -> dict:
    """PEAK's estimate and measured peak of a run of these settings, in its own process
    (images: a row's count for the estimate, 0 for the data's own)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRAINDECK_HEAP": "lean"}
    done = subprocess.run(
        [sys.executable, "-c", PEAK, json.dumps(values), str(images)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def settings(root, **kw) -> dict:
    values = dict(
        init_from=str(root / "base"),
        tokenizer="model",
        data=str(root / "chat.jsonl"),
        train_vision=True,
        seq_len=64,
        batch_size=1,
        grad_accum=1,
        precision="fp32",
        device="cpu",
        dropout=0.0,
        max_steps=1,
        eval_every=10**9,
        ckpt_every=10**9,
        keep_checkpoints=0,
        sample_tokens=0,
        log_every=1,
    )
    return {**values, **kw}


def test_the_estimate_names_the_tower_and_counts_each_image(composite):
    cfg = validate(TrainConfig(**settings(composite)))
    one, four = (estimate(cfg, on_gpu=False, images_per_row=k) for k in (1, 4))
    assert one.tower.trained == four.tower.trained > 0  # full fine-tuning: all of it trains
    assert four.tower.activations == 4 * one.tower.activations  # per image
    assert "vision tower activations" in four.report() and "4 images" in four.report()
    lora = validate(TrainConfig(**settings(composite, lora_rank=4)))
    adapters = estimate(lora, on_gpu=False, images_per_row=1).tower
    assert 0 < adapters.trained < one.tower.trained
    frozen = estimate(
        validate(TrainConfig(**settings(composite, train_vision=False))), on_gpu=False
    )
    assert frozen.tower.trained == 0 and frozen.tower.weights == one.tower.weights
    per_image = frozen.tower.activations / frozen.tower.images
    assert per_image < one.tower.activations / 4  # its images' pixels alone
    (composite / "text.txt").write_text("words " * 400, encoding="utf-8")
    text = settings(composite, train_vision=False, data=str(composite / "text.txt"))
    assert estimate(validate(TrainConfig(**text))).tower is None  # no tower in the step
    # without the data's count: the most a row holds (seq_len over an image's tokens)
    assert estimate(cfg, on_gpu=False).tower.images == 64 // (4 + 2)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux's VmHWM reset")
@pytest.mark.parametrize("lora_rank", [0, pytest.param(4, marks=pytest.mark.slow)])
def test_the_cpu_estimate_is_within_15_percent_of_the_measured_peak(composite, lora_rank):
    values = settings(composite, lora_rank=lora_rank)
    p = measured_peak(values, IMAGES)
    cfg = validate(TrainConfig(**values))
    tower = estimate(cfg, on_gpu=False, images_per_row=IMAGES).tower
    assert tower.activations > 0.4 * p["est"]  # the tower is most of what is compared
    error = p["est"] / p["measured"] - 1
    print(
        f"lora_rank {lora_rank}: estimate {p['est'] / MB:.1f} MiB, measured "
        f"{p['measured'] / MB:.1f} MiB ({error:+.1%}), tower {tower.activations / MB:.1f} MiB"
    )
    assert abs(error) <= 0.15, (p["est"] / MB, p["measured"] / MB, error)


# -- a dynamic-resolution tower: Qwen3-VL's patches follow each image ---------------------------

QWEN_TOWER = dict(depth=4, hidden_size=64, intermediate_size=256, num_heads=4)
QWEN_SIZES = [(96, 96), (64, 96), (80, 48), (96, 64)]  # (width, height) of each example's images


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    pytest.importorskip("transformers")
    from vision_models import make_qwen_vision

    root = tmp_path_factory.mktemp("qwenmem")
    make_qwen_vision(root / "base", tower=QWEN_TOWER, max_pixels=96 * 96)
    lines = []
    for i, size in enumerate(QWEN_SIZES):
        save_image(root / f"{i}.png", "png", size, i)
        parts = [{"type": "image", "image": f"{(i + k) % 4}.png"} for k in range(i % 2 + 3)]
        user = {"role": "user", "content": [*parts, {"type": "text", "text": "Which?"}]}
        answer = {"role": "assistant", "content": "red" if i % 2 else "blue"}
        lines.append(json.dumps({"messages": [user, answer]}))
    (root / "chat.jsonl").write_text("\n".join(lines), encoding="utf-8")
    return root


def qwen_settings(root, **kw) -> dict:
    # two steps: the second holds AdamW's state beside its activations, as every later one
    return settings(root, seq_len=192, max_steps=2, **kw)


def test_a_dynamic_tower_counts_the_patches_of_the_longest_example(qwen):
    from core.data.images import smart_resize
    from core.training.estimate import _dynamic_spec, tower_dims

    cfg = validate(TrainConfig(**qwen_settings(qwen)))
    spec = _dynamic_spec(cfg, tower_dims(cfg))

    def patches(i):  # image i, resized as the processor resizes it
        h, w = smart_resize(QWEN_SIZES[i][1], QWEN_SIZES[i][0], spec)
        return (h // 8) * (w // 8)

    examples = [[(i + k) % 4 for k in range(i % 2 + 3)] for i in range(4)]
    longest = max(examples, key=lambda ex: sum(map(patches, ex)))
    est = estimate(cfg, on_gpu=False)
    assert est.tower.images == len(longest) and est.tower.known
    assert est.tower.patches == sum(map(patches, longest))
    assert f"{est.tower.patches:,} patches; the data's longest example" in est.report()
    lora = estimate(validate(TrainConfig(**qwen_settings(qwen, lora_rank=4))), on_gpu=False)
    assert 0 < lora.tower.trained < est.tower.trained  # adapters on the mergers too
    frozen = estimate(
        validate(TrainConfig(**qwen_settings(qwen, train_vision=False))), on_gpu=False
    )
    assert (
        frozen.tower.trained == 0 and frozen.tower.activations < est.tower.activations / 3
    )  # none kept
    # images that cannot be read: a row of seq_len tokens all images at the most pixels
    (qwen / "lost.jsonl").write_text(
        (qwen / "chat.jsonl").read_text().replace(".png", ".missing.png"), encoding="utf-8"
    )
    most = estimate(
        validate(TrainConfig(**qwen_settings(qwen, data=str(qwen / "lost.jsonl")))),
        on_gpu=False,
    )
    assert not most.tower.known and most.tower.patches == 192 * 4  # merged 2 x 2
    assert "the most a row holds: an overestimate" in most.report()
    assert most.tower.activations > est.tower.activations


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux's VmHWM reset")
@pytest.mark.parametrize(
    "lora_rank,train_vision",
    [(4, True), pytest.param(0, True, marks=pytest.mark.slow), (0, False)],
)
def test_a_dynamic_towers_estimate_is_within_15_percent_of_the_measured_peak(
    qwen, lora_rank, train_vision
):
    values = qwen_settings(qwen, lora_rank=lora_rank, train_vision=train_vision)
    p = measured_peak(values, 0)
    tower = estimate(validate(TrainConfig(**values)), on_gpu=False).tower
    error = p["est"] / p["measured"] - 1
    print(
        f"qwen3-vl lora_rank {lora_rank} train_vision {train_vision}: estimate "
        f"{p['est'] / MB:.1f} MiB, measured {p['measured'] / MB:.1f} MiB ({error:+.1%}), "
        f"tower {tower.activations / MB:.1f} MiB"
    )
    if train_vision:
        assert tower.activations > 0.4 * p["est"]  # the tower is most of what is compared
    assert abs(error) <= 0.15, (p["est"] / MB, p["measured"] / MB, error)


# -- Gemma 4's tower: each image its token budget's patches, padded ---------------------------

GEMMA4_TOWER = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, head_dim=16
)


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory):
    pytest.importorskip("transformers")
    from vision_models import make_gemma4_vision

    root = tmp_path_factory.mktemp("g4mem")
    make_gemma4_vision(root / "base", tower=GEMMA4_TOWER)
    lines = []
    for i in range(4):
        save_image(root / f"{i}.png", "png", (60 + 8 * i, 40), i)
        parts = [{"type": "image", "image": f"{(i + k) % 4}.png"} for k in range(i % 2 + 1)]
        user = {"role": "user", "content": [*parts, {"type": "text", "text": "Which?"}]}
        answer = {"role": "assistant", "content": "red" if i % 2 else "blue"}
        lines.append(json.dumps({"messages": [user, answer]}))
    (root / "chat.jsonl").write_text("\n".join(lines), encoding="utf-8")
    return root


def gemma4_settings(root, **kw) -> dict:
    return settings(root, seq_len=192, max_steps=2, **kw)


def test_gemma4s_tower_counts_each_images_budget_of_patches(gemma4):
    from vision_models import GEMMA4_TOKENS

    cfg = validate(TrainConfig(**gemma4_settings(gemma4)))
    est = estimate(cfg, on_gpu=False)
    assert est.tower.images == 2 and est.tower.known  # the longest example's
    assert est.tower.patches == 2 * GEMMA4_TOKENS * 9  # padded to the budget, pooled 3 x 3
    lora = estimate(validate(TrainConfig(**gemma4_settings(gemma4, lora_rank=4))), on_gpu=False)
    assert 0 < lora.tower.trained < est.tower.trained
    (gemma4 / "lost.jsonl").write_text(
        (gemma4 / "chat.jsonl").read_text().replace(".png", ".missing.png"), encoding="utf-8"
    )
    most = estimate(
        validate(TrainConfig(**gemma4_settings(gemma4, data=str(gemma4 / "lost.jsonl")))),
        on_gpu=False,
    )
    assert not most.tower.known and most.tower.images == 192 // (GEMMA4_TOKENS + 2)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux's VmHWM reset")
@pytest.mark.parametrize(
    "lora_rank,train_vision",
    [(4, True), pytest.param(0, True, marks=pytest.mark.slow), (0, False)],
)
def test_gemma4s_estimate_is_within_15_percent_of_the_measured_peak(
    gemma4, lora_rank, train_vision
):
    values = gemma4_settings(gemma4, lora_rank=lora_rank, train_vision=train_vision)
    p = measured_peak(values, 0)
    tower = estimate(validate(TrainConfig(**values)), on_gpu=False).tower
    error = p["est"] / p["measured"] - 1
    print(
        f"gemma4 lora_rank {lora_rank} train_vision {train_vision}: estimate "
        f"{p['est'] / MB:.1f} MiB, measured {p['measured'] / MB:.1f} MiB ({error:+.1%}), "
        f"tower {tower.activations / MB:.1f} MiB"
    )
    if train_vision:
        assert tower.activations > 0.4 * p["est"]  # the tower is most of what is compared
    assert abs(error) <= 0.15, (p["est"] / MB, p["measured"] / MB, error)
