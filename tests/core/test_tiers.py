"""The VRAM tier presets: reproducible from their derivation, each within 80% of its tier by
the estimate (bf16 on a GPU), and the recommendation is the largest tier the free VRAM reaches."""

from __future__ import annotations

import dataclasses

import pytest

from core.config import presets
from core.training import tiers
from core.training.estimate import GB, estimate, fits
from core.training.planner import recommend_preset, recommendation_line

TIER_PRESETS = [tiers.preset_name(t.gb) for t in tiers.TIERS]


@pytest.mark.parametrize("name", TIER_PRESETS)
def test_each_tier_preset_stays_within_80_percent_of_its_tier(name):
    preset = presets.load_preset(name)
    cfg = presets.to_config(preset)
    assert preset.tier_gb == preset.min_vram_gb == int(name[4:-2])
    total = estimate(cfg, "bf16").device_total
    assert total <= 0.8 * preset.tier_gb * GB, f"{name}: {total / GB:.1f} GiB"
    # ... and uses two thirds of it or more: on an H100 the old powers of two left 42-56% of
    # the 12 and 48 GB tiers unused (docs/gpu.md)
    assert total >= 2 / 3 * preset.tier_gb * GB, f"{name}: {total / GB:.1f} GiB"
    assert cfg.precision == "auto" and cfg.seq_len == 1024


@pytest.mark.parametrize("name", TIER_PRESETS)
def test_tier_shapes_suit_tensor_cores(name):
    from core.models.model import GPT
    from core.training.estimate import model_shape

    cfg = presets.to_config(presets.load_preset(name))
    shape = model_shape(cfg)
    assert shape.hidden_dim % 128 == 0 and shape.ffn_dim % 128 == 0
    assert shape.ffn_dim == tiers.ffn_width(cfg.hidden_dim) >= 8 * cfg.hidden_dim / 3
    assert shape.hidden_dim // shape.n_heads == 64
    if name == "gpu-8gb":  # the model built from the preset has the preset's MLP
        mlp = GPT(dataclasses.replace(shape, n_layers=1)).blocks[0].mlp
        assert max(p.shape[0] for p in mlp.parameters()) in (shape.ffn_dim, 2 * shape.ffn_dim)


def test_without_ffn_dim_a_new_model_keeps_the_rule_of_32():
    from core.config.spec import TrainConfig
    from core.training.estimate import model_shape

    assert model_shape(TrainConfig(hidden_dim=512, n_heads=8)).ffn_dim == 1376
    assert model_shape(TrainConfig(hidden_dim=512, n_heads=8, ffn_dim=1408)).ffn_dim == 1408
    gpt2 = TrainConfig(arch="gpt2", hidden_dim=64, n_heads=2)
    assert model_shape(gpt2).ffn_dim == 256


def test_gpu_80gb_fits_an_80_gb_card():
    cfg = presets.to_config(presets.load_preset("gpu-80gb"))
    assert estimate(cfg, "bf16").device_total < 64 * GB
    assert fits(cfg, int(79.6 * GB))  # an H100 80GB HBM3: 81,559 MiB


def test_the_yaml_files_are_what_the_derivation_gives():
    derived = [tiers.derive(t) for t in tiers.TIERS]
    for d in derived:
        name = tiers.preset_name(d["tier"].gb)
        on_disk = presets.load_preset(name)
        values = tiers.preset_values(d)
        assert on_disk.description == values.pop("description")
        assert on_disk.hardware == values.pop("hardware")
        assert on_disk.min_vram_gb == values.pop("min_vram_gb")
        assert on_disk.tier_gb == values.pop("tier_gb")
        assert on_disk.values == values, "rerun python -m benchmarks.tier_presets --write"
    # Compute-optimal: near 20 tokens a parameter; more compute, a larger model.
    for d in derived:
        assert 14 <= d["tokens"] / d["params"] <= 29
    params = [d["params"] for d in derived]
    assert params == sorted(params) and params[-1] > 5 * params[0]


def test_batch_rule_and_micro_batch_cap():
    # DeepSeek LLM's rule at an H100's 30 minutes: 0.292 * C^0.3271 = 184k tokens -> 128 x 1024
    assert tiers.batch_tokens(5.34e17) == 128
    cfg = presets.to_config(presets.load_preset("gpu-8gb"))
    micro = tiers.micro_batch(cfg, 1024, 8)
    cap = 0.8 * 8 * GB
    assert micro % tiers.MICRO_STEP == 0
    assert estimate(dataclasses.replace(cfg, batch_size=micro), "bf16").device_total <= cap
    bigger = dataclasses.replace(cfg, batch_size=micro + tiers.MICRO_STEP)
    assert estimate(bigger, "bf16").device_total > cap
    # the step stays near the rule's batch: 44 sequences fit a 12 GB tier, 64 wanted -> 44 x 1
    assert tiers.accum_for(64, 44) == 1 and tiers.accum_for(64, 36) == 2
    assert tiers.accum_for(8, 12) == 1  # never under one micro-batch


@pytest.mark.parametrize(
    "free_gib, expected",
    [
        (4.0, "gpu-small"),  # under the smallest tier: the seed table's preset
        (7.1, "gpu-small"),  # 8 GB needs 7.2 GiB free
        (7.5, "gpu-8gb"),
        (11.2, "gpu-12gb"),
        (15.0, "gpu-16gb"),
        (20.0, "gpu-16gb"),  # a 24 GB card with 4 GiB taken: the tier below
        (22.5, "gpu-24gb"),
        (46.0, "gpu-48gb"),
        (79.0, "gpu-80gb"),
        (139.0, "gpu-80gb"),  # an H200: the largest tier
    ],
)
def test_recommended_is_the_largest_tier_at_or_below_free_vram(free_gib, expected):
    total = max(free_gib + 0.5, 8) * GB
    got = recommend_preset(int(total), int(free_gib * GB))
    assert got.name == expected
    line = recommendation_line(got, int(free_gib * GB))
    assert got.name in line and f"{free_gib:.1f} GiB free" in line
