"""Checkpointing only as much as memory needs: the first k of L blocks are checkpointed, the
estimate counts k, and Fit to my GPU picks the fewest that fit the card at its batch."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from core.config.spec import TrainConfig, validate
from core.models.model import GPT, LLAMA_OPTIONS, GPTConfig
from core.training.estimate import GB, estimate, fits
from core.training.planner import checkpoint_line, fewest_checkpointed, fit_pretrained


def grads(checkpointing: bool, blocks: int | None):
    torch.manual_seed(0)
    c = GPTConfig(hidden_dim=32, n_layers=3, n_heads=2, seq_len=16, vocab_size=64)
    c = dataclasses.replace(
        c, **LLAMA_OPTIONS, grad_checkpointing=checkpointing, checkpoint_blocks=blocks
    )
    model = GPT(c)
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, 64, (2, 16), generator=g) for _ in range(2))
    _, loss = model(x, y)
    loss.backward()
    return [loss.detach()] + [p.grad for p in model.parameters()]


def test_partial_checkpointing_gives_the_gradients_of_none_and_of_all():
    none = grads(False, None)
    for blocks in (None, 0, 1, 2, 3):  # None: every block
        got = grads(True, blocks)
        # the same kernels in the same process, recomputed: equal bit for bit
        assert all(torch.equal(a, b) for a, b in zip(got, none, strict=True)), blocks


def wide(**kw) -> TrainConfig:
    values = dict(hidden_dim=512, n_layers=12, n_heads=8, seq_len=2048, batch_size=8)
    return validate(TrainConfig(**{**values, **kw}))


def test_the_estimate_counts_the_checkpointed_blocks():
    plain = estimate(wide()).device_total
    needs = [
        estimate(wide(grad_checkpointing=True, checkpoint_blocks=k)).device_total for k in range(13)
    ]
    assert estimate(wide(grad_checkpointing=True)).device_total == needs[12]  # unset: all
    # each block checkpointed keeps its input alone; the last one's activations are used
    # first in backward, so checkpointing it too saves nothing (the recomputed block then
    # comes on top of the others' inputs)
    assert needs[:12] == sorted(needs[:12], reverse=True) and needs[0] > needs[6] > needs[11]
    assert needs[11] <= needs[12]
    assert needs[0] == plain  # none checkpointed: as without checkpointing
    assert checkpoint_line(wide(grad_checkpointing=True, checkpoint_blocks=5)) == (
        "5 of 12 blocks checkpointed"
    )
    assert checkpoint_line(wide()) == ""


@pytest.mark.parametrize("k", [3, 8])
def test_fit_picks_the_fewest_checkpointed_blocks_that_fit(k):
    cfg = wide(grad_checkpointing=True)
    # free memory between what k and k - 1 checkpointed blocks need (the 10% margin kept)
    need = [
        estimate(dataclasses.replace(cfg, checkpoint_blocks=i)).device_total for i in (k, k - 1)
    ]
    free = int((need[0] + need[1]) / 2 / 0.9)
    fitted = fewest_checkpointed(cfg, free)
    assert fitted.checkpoint_blocks == k and fits(fitted, free)
    assert fewest_checkpointed(cfg, 10_000 * GB).checkpoint_blocks == 1  # one is the fewest
    assert fewest_checkpointed(cfg, 1).checkpoint_blocks is None  # all: nothing to leave out


def test_the_fit_ladder_says_how_many_blocks_it_checkpoints(monkeypatch):
    from core.training import planner

    monkeypatch.setattr(planner, "longest_context", lambda cfg, budget, **_: 0)  # not asked here
    cfg = wide(lora_rank=16, batch_size=4)
    plain = estimate(dataclasses.replace(cfg, batch_size=1)).device_total
    fitted, why = fit_pretrained(cfg, int(plain * 0.9))  # plain LoRA misses at batch 1
    assert fitted.grad_checkpointing and 0 < fitted.checkpoint_blocks < 12
    assert f"{fitted.checkpoint_blocks} of 12 blocks checkpointed" in why
