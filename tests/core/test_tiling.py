"""Long sequences in pieces (core.models.tiling): the MLP over tiles of tokens and attention over
chunks of queries give the whole computation's outputs and gradients within fp32 rounding, and
the pieces really keep the (tokens x ffn) intermediate and the T x T scores from existing whole."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from core.models import model as model_module
from core.models.lora import apply_lora
from core.models.model import GPT, MLP, GPTConfig

TOL = {"rtol": 1e-5, "atol": 1e-6}


def config(**kw) -> GPTConfig:
    base = dict(hidden_dim=32, n_layers=2, n_heads=4, n_kv_heads=2, seq_len=64, vocab_size=50)
    return GPTConfig(**(base | kw))


def grads(model, idx, targets, segments=None):
    model.zero_grad(set_to_none=True)
    _, loss = model(idx, targets, segments=segments)
    loss.backward()
    trained = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), trained


def assert_same(a, b):
    torch.testing.assert_close(a[0], b[0], **TOL)
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], **TOL, msg=name)


def set_tiles(model, tile: int):
    for m in model.modules():
        if isinstance(m, MLP):
            m.tile = tile


class Largest(TorchDispatchMode):
    """The most elements any single op's output had, forward and backward."""

    def __init__(self):
        super().__init__()
        self.most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.most = max(self.most, t.numel())
        return out


@pytest.mark.parametrize("mlp", ["gelu", "gelu_tanh", "swiglu", "geglu"])
@pytest.mark.parametrize("fused", [False, True])
def test_a_tiled_mlp_equals_the_whole_one(mlp, fused):
    torch.manual_seed(0)
    m = MLP(config(mlp=mlp, ffn_dim=48, fused=fused))
    x = torch.randn(2, 23, 32, requires_grad=True)

    def run(tile):
        m.tile = tile
        m.zero_grad(set_to_none=True)
        x.grad = None
        y = m(x)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        return y.detach(), x.grad.clone(), m.fc.weight.grad.clone(), m.proj.weight.grad.clone()

    whole, tiled = run(0), run(5)  # 46 tokens: 9 full tiles and one of 1
    for a, b in zip(tiled, whole, strict=True):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_lora_fine_tune_with_tiles_gives_the_whole_gradients(checkpointing):
    """The fused SwiGLU, the Remake hooks of a fine-tune and LoRA's adapters inside tiles."""
    torch.manual_seed(0)
    c = config(
        mlp="swiglu", norm="rmsnorm", positions="rope", fused=True, grad_checkpointing=checkpointing
    )
    model = GPT(c)
    apply_lora(model, 4, 8.0, 0.0, "all")
    for n, p in model.named_parameters():  # B starts at 0: give the adapters something to do
        if n.endswith("lora_B"):
            torch.nn.init.normal_(p, std=0.02)
    model.train()
    idx = torch.randint(0, 50, (2, 40))
    set_tiles(model, 0)
    whole = grads(model, idx, idx)
    set_tiles(model, 16)
    assert_same(grads(model, idx, idx), whole)


def test_tiles_keep_the_mlp_intermediate_from_existing_whole():
    torch.manual_seed(0)
    m = MLP(config(mlp="swiglu", ffn_dim=64))
    x = torch.randn(1, 256, 32, requires_grad=True)
    for tile, most in ((0, 256 * 128), (32, 256 * 32)):  # fc's output (gate and up); x's
        m.tile = tile
        with Largest() as seen:
            m(x).sum().backward()
        assert seen.most == most  # tiled: a tile's gate and up (32 x 128) are less than x


@pytest.mark.parametrize(
    "kind",
    [
        "softcap",
        "softcap-window",
        "sdpa-packed",
        "sdpa-window-packed",
        "softcap-packed",
        "sinks-window",
    ],
)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_chunked_attention_equals_the_whole(kind, checkpointing, monkeypatch):
    torch.manual_seed(0)
    options = dict(positions="rope", norm="rmsnorm", mlp="geglu", grad_checkpointing=checkpointing)
    if "softcap" in kind:
        options |= dict(attn_softcap=20.0, attn_scale=0.3)
    if "sinks" in kind:  # gpt-oss: a learned sink logit per head in each row's softmax
        options |= dict(attn_sinks=True)
    if "window" in kind:
        options |= dict(sliding_window=7, layer_types=["sliding_attention", "full_attention"])
    model = GPT(config(**options))
    model.train()
    for name, p in model.named_parameters():
        if name.endswith("sinks"):  # away from their zero start, so they weigh in
            p.data.normal_()
    idx = torch.randint(0, 50, (2, 41))
    segments = None
    if "packed" in kind:
        segments = torch.tensor([[0] * 13 + [1] * 20 + [2] * 8, [0] * 30 + [1] * 11])
    monkeypatch.setattr(model_module, "ATTN_CHUNK_QUERIES", 10_000)
    whole = grads(model, idx, idx, segments)
    monkeypatch.setattr(model_module, "ATTN_CHUNK_QUERIES", 6)  # 7 chunks, the last of 5
    assert_same(grads(model, idx, idx, segments), whole)


@pytest.mark.parametrize("kind", ["softcap", "sdpa-packed"])
def test_chunked_attention_holds_no_t_by_t_scores_or_mask(kind, monkeypatch):
    torch.manual_seed(0)
    options = dict(positions="rope", n_layers=1, n_kv_heads=4, seq_len=128, ffn_dim=32)
    if kind == "softcap":
        options |= dict(attn_softcap=20.0)
    model = GPT(config(**options))
    model.train()
    idx = torch.randint(0, 50, (1, 128))
    segments = torch.tensor([[0] * 50 + [1] * 78]) if kind == "sdpa-packed" else None
    monkeypatch.setattr(model_module, "ATTN_CHUNK_QUERIES", 16)
    with Largest() as seen:
        model(idx, idx, segments=segments)[1].backward()
    # a chunk's scores (4 heads x 16 x 128), its rows of the packed examples' mask, qkv's
    # output (128 x 96): nothing T x T
    assert seen.most < 128 * 128
    monkeypatch.setattr(model_module, "ATTN_CHUNK_QUERIES", 10_000)
    with Largest() as seen:
        model(idx, idx, segments=segments)[1].backward()
    # the whole: the scores (4 x 128 x 128), or SDPA's 128 x 128 mask; what the chunks avoid
    assert seen.most >= (4 if kind == "softcap" else 1) * 128 * 128


def test_causal_sdpa_without_a_mask_is_left_whole():
    """On the CPU and CUDA the flash kernel keeps O(T): chunking would only cost time."""
    attn = GPT(config(positions="rope")).blocks[0].attn
    cpu = torch.device("cpu")
    assert not attn._holds_scores(None, None, 0.0, cpu)
    assert attn._holds_scores(torch.ones(1, 1, 4, 4, dtype=torch.bool), None, 0.0, cpu)
    assert attn._holds_scores(None, 7, 0.0, cpu)
    assert attn._holds_scores(None, None, 0.1, cpu)
