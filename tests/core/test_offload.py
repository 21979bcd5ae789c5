"""Offloaded checkpoints (core.models.offload), on the CPU with a stand-in for the CUDA side
stream that records each copy and wait: the last block's input stays, the others go out during
forward, and each comes back one block ahead of the backward that waits for it. Gradients equal
plain checkpointing's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from core.models import offload
from core.models.model import GPT, GPTConfig


class FakeStreams:
    """CudaStreams' calls, recorded; copies are clones."""

    def __init__(self):
        self.calls = []

    def to_host(self, x):
        self.calls.append(("out", x.sum().item()))
        return x.clone()

    def to_device(self, host, device):
        self.calls.append(("in", host.sum().item()))
        return host.clone(), ("done", host.sum().item())

    def wait(self, done, x):
        self.calls.append(("wait", done[1]))


def test_inputs_go_out_in_forward_and_come_back_a_block_ahead(monkeypatch):
    blocks = [lambda x, k=k: x * 2 + k for k in range(4)]  # input i sums to a known value
    fake = FakeStreams()
    x = torch.ones(3, requires_grad=True)
    order = []
    real_take = offload.Offload.take

    def take(self, i):
        order.append(("backward", i))
        return real_take(self, i)

    monkeypatch.setattr(offload.Offload, "take", take)
    y = offload.run_blocks(blocks, x, [()] * len(blocks), fake)
    sums = [3.0, 6.0, 15.0, 36.0]  # the inputs of blocks 0..3
    assert fake.calls == [("out", s) for s in sums[:3]]  # the last block's input stays
    fake.calls.clear()
    y.sum().backward()
    assert order == [("backward", i) for i in (3, 2, 1, 0)]
    # block 3 (kept) starts block 2's fetch; each later backward waits for its own, then
    # starts the next one down
    assert fake.calls == [
        ("in", 15.0),
        ("wait", 15.0),
        ("in", 6.0),
        ("wait", 6.0),
        ("in", 3.0),
        ("wait", 3.0),
    ]
    assert torch.equal(x.grad, torch.full((3,), 16.0))


def test_gradients_equal_plain_checkpointing_and_the_cpu_does_not_offload(monkeypatch):
    torch.manual_seed(0)
    c = GPTConfig(
        hidden_dim=32,
        n_layers=3,
        n_heads=2,
        seq_len=16,
        vocab_size=64,
        dropout=0.1,
        grad_checkpointing=True,
        norm="rmsnorm",
        positions="rope",
        mlp="swiglu",
    )
    plain = GPT(c)
    off = GPT(dataclasses.replace(c, offload_checkpoints=True))
    off.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 64, (2, 16))
    grads = []
    for model in (plain, off):
        torch.manual_seed(1)  # the same dropout masks
        _, loss = model(idx, idx)
        loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert offload.streams_for(idx.device) is None  # on the CPU: plain checkpointing
    fake = FakeStreams()
    monkeypatch.setattr("core.models.model.streams_for", lambda device: fake)
    off.zero_grad()
    torch.manual_seed(1)
    _, loss = off(idx, idx)
    loss.backward()
    assert [k for k, _ in fake.calls].count("out") == c.n_layers - 1
    for name, p in off.named_parameters():
        assert torch.allclose(p.grad, grads[0][name], atol=1e-6), name
        assert torch.equal(grads[1][name], grads[0][name]), name


def test_a_hybrid_models_deltanet_layers_get_their_own_mask_when_offloaded(monkeypatch):
    """Qwen3.5's DeltaNet layers take the examples' starts where attention takes its mask:
    offloaded, packed rows give plain checkpointing's gradients."""
    import pytest

    pytest.importorskip("transformers")
    from hf_models import make_config

    from core.weights import families

    _, c = families.model_config(make_config("qwen3_5", 64).to_dict())
    c = dataclasses.replace(c, grad_checkpointing=True)
    plain, off = GPT(c), GPT(dataclasses.replace(c, offload_checkpoints=True))
    off.load_state_dict(plain.state_dict())
    monkeypatch.setattr("core.models.model.streams_for", lambda device: FakeStreams())
    idx = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(0))
    segments = torch.tensor([[0] * 10 + [1] * 14, [0] * 24])
    for model in (plain, off):
        _, loss = model(idx, idx, segments=segments)
        loss.backward()
    for (name, p), q in zip(plain.named_parameters(), off.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name


# Families whose model keeps plain checkpointing though offloading is asked for: a mixture of
# experts (its router loss reads the forward's routes), Gemma 4 (per-layer inputs and shared
# keys and values reach the blocks beside the stream)
KEEPS = {"qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "gpt_oss", "qwen3_5_moe", "gemma4"}
KEEPS |= {"gemma4_moe"}


def _family_names() -> list[str]:
    from core.weights import families

    return [*families.FAMILIES, "gemma4_moe"]  # Gemma 4's MoE form: a config of gemma4's


@pytest.mark.parametrize("family", _family_names())
def test_the_model_the_estimate_and_the_fit_ladder_agree_on_offloading(
    family, tmp_path, monkeypatch
):
    """One answer (offload.offloads) for every family: whether the model's training forward
    sends its block inputs to RAM, whether the GPU estimate counts them gone, and whether the
    fit ladder offers "offloaded to RAM"."""
    pytest.importorskip("transformers")
    from hf_models import make_config

    from core.config.spec import TrainConfig, validate
    from core.models import model as model_module
    from core.training import estimate as memory
    from core.training import memory_profile as mp
    from core.training.planner import ladder
    from core.weights.loader import apply_pretrained, config_only, pretrained_shape

    folder = tmp_path / family
    folder.mkdir()
    (folder / "config.json").write_text(make_config(family, 64).to_json_string())
    run = dict(seq_len=16, batch_size=1, grad_accum=1, device="cpu", precision="fp32")
    run |= dict(lora_rank=4, grad_checkpointing=True, offload_checkpoints=True, dropout=0.0)
    cfg = validate(TrainConfig(init_from=str(folder), tokenizer="model", **run))
    cfg = validate(apply_pretrained(cfg, config_only(folder)))
    shape = GPTConfig.from_train(cfg, base=pretrained_shape(folder))  # as build_model makes it
    answer = offload.offloads(shape)
    assert answer == (family not in KEEPS)

    offloaded = []  # the model: its forward runs the offloaded blocks or plain checkpointing
    real = model_module.run_blocks
    monkeypatch.setattr(model_module, "streams_for", lambda device: FakeStreams())
    monkeypatch.setattr(model_module, "run_blocks", lambda *a: offloaded.append(1) or real(*a))
    model = GPT(shape).train()
    idx = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(0))
    model(idx, idx)
    assert bool(offloaded) == answer

    # the estimate: the block inputs kept on the card (OFFLOAD_KEPT of them where offloaded;
    # 1 here, as the tiny models have 2 to 6 layers)
    monkeypatch.setattr(memory, "OFFLOAD_KEPT", 1)

    def saved(c):
        return memory.estimate(c, on_gpu=True).step_parts[mp.SAVED]

    kept = dataclasses.replace(cfg, offload_checkpoints=False)
    assert (saved(cfg) < saved(kept)) == answer
    assert any(rung.offload_checkpoints for _, rung in ladder(cfg)) == answer

    # the first block alone checkpointed, offloading asked: a model that offloads takes every
    # block, the others checkpoint the first only; the estimate counts as the model does
    first = dataclasses.replace(cfg, checkpoint_blocks=1)
    calls, offloaded[:] = [], []
    real_checkpoint = model_module.checkpoint
    monkeypatch.setattr(
        model_module, "checkpoint", lambda *a, **k: calls.append(1) or real_checkpoint(*a, **k)
    )
    GPT(GPTConfig.from_train(first, base=pretrained_shape(folder))).train()(idx, idx)
    blocks = shape.n_layers if offloaded else len(calls)
    assert blocks == (shape.n_layers if answer else 1)
    assert memory.checkpointed(first, shape, on_gpu=True) == blocks
