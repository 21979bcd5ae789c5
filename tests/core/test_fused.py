"""The hand-written backward passes (core.models.fused, the loss's LinearCrossEntropy) give the
plain computation's outputs and gradients within fp32 rounding."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from core.models import fused, loss
from core.models.model import rotate


def grads_of(fn, *inputs):
    """fn's output and the gradients of a fixed random projection of it."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * probe).sum().backward()
    return [out.detach(), *(t.grad for t in leaves)]


def assert_equal(got, want):
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def plain_rms_norm(x, weight, eps):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


@pytest.mark.parametrize("shape", [(3, 7, 16), (2, 4, 5, 8)])  # a block's, a per-head q/k norm's
def test_rms_norm_equals_the_plain_one(shape):
    torch.manual_seed(0)
    x, w = torch.randn(shape) * 3, torch.rand(shape[-1]) + 0.5
    got = grads_of(lambda a, b: fused.rms_norm(a, b, 1e-6), x, w)
    want = grads_of(lambda a, b: plain_rms_norm(a, b, 1e-6), x, w)
    assert torch.equal(got[0], want[0])  # the forward is the same operations
    assert_equal(got, want)


def test_rms_norm_of_a_transposed_view_as_q_k_norm_gets():
    torch.manual_seed(0)
    x, w = torch.randn(2, 6, 3, 8).transpose(1, 2), torch.rand(8)
    assert_equal(
        grads_of(lambda a, b: fused.rms_norm(a.transpose(1, 2), b, 1e-5), x, w),
        grads_of(lambda a, b: plain_rms_norm(a.transpose(1, 2), b, 1e-5), x, w),
    )


def test_swiglu_equals_the_plain_one():
    torch.manual_seed(0)
    h = torch.randn(2, 5, 24) * 2

    def plain(t):
        gate, up = t.chunk(2, dim=-1)
        return F.silu(gate) * up

    got, want = grads_of(fused.swiglu, h), grads_of(plain, h)
    assert torch.equal(got[0], want[0])
    assert_equal(got, want)


@pytest.mark.parametrize("packed", [False, True])  # one table for all rows, or one per row
def test_rope_equals_rotate_half(packed):
    torch.manual_seed(0)
    b, heads, t, d = 2, 3, 5, 8
    x = torch.randn(b, t, heads, d).transpose(1, 2)  # laid out as attention gets q and k
    angles = torch.rand(b, 1, t, d // 2) * 6 if packed else torch.rand(t, d // 2) * 6
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos(), angles.sin()
    got = grads_of(lambda a: fused.rope(a, cos, fused.signed_sin(sin)), x)
    want = grads_of(lambda a: rotate(a, cos, sin), x)
    assert torch.equal(got[0], want[0])
    assert_equal(got, want)


@pytest.mark.parametrize("frozen", [False, True])  # full fine-tuning, LoRA (a frozen head)
def test_linear_cross_entropy_equals_the_plain_loss(frozen):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    head.weight.requires_grad_(not frozen)
    hidden = torch.randn(40, 16, requires_grad=True)
    targets = torch.randint(0, 50, (40,))
    w = torch.rand(40)
    w = w / w.sum()
    got = loss.LinearCrossEntropy.apply(hidden, head.weight, targets, w, 7)
    (2 * got).backward()  # an upstream gradient other than 1
    got_grads = hidden.grad.clone(), None if frozen else head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None
    want = (F.cross_entropy(head(hidden), targets, reduction="none") * w).sum()
    (2 * want).backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_grads[0], hidden.grad, rtol=1e-5, atol=1e-6)
    if not frozen:
        torch.testing.assert_close(got_grads[1], head.weight.grad, rtol=1e-5, atol=1e-6)


def test_the_fused_loss_serves_fp32_heads_only():
    head = torch.nn.Linear(8, 20, bias=False)
    assert loss.fusable(head, torch.randn(3, 8))
    assert not loss.fusable(head.to(torch.bfloat16), torch.randn(3, 8, dtype=torch.bfloat16))
    assert not loss.fusable(torch.nn.Linear(8, 20), torch.randn(3, 8))  # a bias
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not loss.fusable(torch.nn.Linear(8, 20, bias=False), torch.randn(3, 8))


@pytest.mark.parametrize("masked", [False, True])
def test_the_loss_of_a_fine_tune_equals_the_plain_one(masked):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden, targets = torch.randn(3, 20, 16), torch.randint(0, 50, (3, 20))
    mask = (torch.rand(3, 20) < 0.5).to(torch.uint8) if masked else None
    got = grads_of(lambda h, w: loss_with(h, w, targets, mask, fused=True), hidden, head.weight)
    want = grads_of(lambda h, w: loss_with(h, w, targets, mask, fused=False), hidden, head.weight)
    assert_equal(got, want)


def loss_with(hidden, weight, targets, mask, fused):
    head = torch.nn.Linear(16, 50, bias=False)
    del head.weight
    head.weight = weight  # a parameter-free head around the leaf, for grads_of
    return loss.lm_loss(head, hidden, targets, mask, chunk=7, fused=fused)


def test_a_fine_tune_uses_the_fused_ops_and_a_new_model_the_plain_ones():
    from helpers import tiny_config

    from core.models.model import GPT, GPTConfig, RMSNorm

    cfg = tiny_config()
    new = GPTConfig.from_train(cfg)
    tuned = GPTConfig.from_train(
        cfg, base=GPTConfig(hidden_dim=32, n_layers=1, n_heads=2, seq_len=16, norm="rmsnorm")
    )
    assert (new.fused, tuned.fused) == (False, True)
    norms = [m for m in GPT(tuned).modules() if isinstance(m, RMSNorm)]
    assert norms and all(m.fused for m in norms)


def test_a_lora_fine_tune_remakes_the_adapters_inputs_with_equal_gradients(monkeypatch):
    """The norms' and SwiGLU's outputs that the adapters would keep are remade in backward:
    the same gradients, bit for bit, and three fewer activations a layer kept."""
    from core.models import lora
    from core.models.model import GPT, GPTConfig

    def gradients():
        torch.manual_seed(0)
        c = GPTConfig(
            hidden_dim=32,
            n_layers=2,
            n_heads=4,
            n_kv_heads=2,
            seq_len=16,
            norm="rmsnorm",
            mlp="swiglu",
            positions="rope",
            vocab_size=40,
            fused=True,
        )
        model = GPT(c)
        lora.apply_lora(model, rank=4, alpha=8.0, dropout=0.0, targets="all")
        for m in model.modules():
            if isinstance(m, lora.LoRALinear):
                torch.nn.init.normal_(m.lora_B)  # non-zero B: every path carries gradient
        idx = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(1))
        _, value = model(idx, idx.roll(1, dims=1))
        value.backward()
        return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}

    remade = []
    unpack = fused.Remake.unpack
    monkeypatch.setattr(
        fused.Remake,
        "unpack",
        staticmethod(lambda s: unpack(s) if torch.is_tensor(s) else remade.append(s) or unpack(s)),
    )
    kept_fewer = gradients()
    assert len(remade) == 3 * 2  # both norms' outputs and SwiGLU's, in each of 2 layers
    monkeypatch.setattr(fused.Remake, "register", lambda self, t, make: t)
    kept_all = gradients()
    assert kept_fewer.keys() == kept_all.keys()
    for name, grad in kept_fewer.items():
        assert torch.equal(grad, kept_all[name]), name


def test_attention_keeps_no_view_of_the_whole_qkv_output():
    """SDPA keeps q, k and v for its backward; v as a view of the q/k/v product would keep
    that whole product alive after RoPE has copied q and k out of it."""
    from core.models.model import GPTConfig, SelfAttention

    c = GPTConfig(
        hidden_dim=32,
        n_layers=1,
        n_heads=4,
        n_kv_heads=2,
        seq_len=8,
        norm="rmsnorm",
        positions="rope",
        fused=True,
    )
    attn = SelfAttention(c)
    products = []
    attn.qkv.register_forward_hook(lambda m, i, out: products.append(out))
    kept = []

    def pack(t):
        kept.append(t.untyped_storage().data_ptr())
        return t

    cos, sin = torch.ones(8, 8), torch.zeros(8, 8)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        attn(torch.randn(2, 8, 32, requires_grad=True), (cos, sin))
    assert products and products[0].untyped_storage().data_ptr() not in kept


@pytest.mark.skipif(
    shutil.which("g++") is None, reason="torch.compile on the CPU needs a C++ compiler"
)
def test_a_compiled_lora_fine_tune_gives_the_eager_gradients():
    """--compile: the compiler chooses what to keep itself (no Remake hooks inside it)."""
    from core.models import lora
    from core.models.model import GPT, GPTConfig

    c = GPTConfig(
        hidden_dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        seq_len=32,
        norm="rmsnorm",
        mlp="swiglu",
        positions="rope",
        vocab_size=100,
        fused=True,
    )
    idx = torch.randint(0, 100, (2, 32), generator=torch.Generator().manual_seed(1))

    from core.platform.compiling import CompiledOrEager, compile_or_eager, compile_problem

    lines = []

    def gradients(compiled: bool):
        torch.manual_seed(0)
        model = GPT(c)
        lora.apply_lora(model, rank=4, alpha=8.0, dropout=0.0, targets="all")
        for m in model.modules():
            if isinstance(m, lora.LoRALinear):
                torch.nn.init.normal_(m.lora_B)
        # As a run compiles: in a folder with spaces too (the link step), else the fallback.
        run = compile_or_eager(model, torch.device("cpu"), lines.append) if compiled else model
        _, value = run(idx, idx.roll(1, dims=1))
        value.backward()
        ran_compiled = isinstance(run, CompiledOrEager) and run.is_compiled
        return value.detach(), [p.grad for p in model.parameters() if p.requires_grad], ran_compiled

    eager, compiled = gradients(False), gradients(True)
    if compile_problem(torch.device("cpu")) is None:  # a C++ compiler is here: it must compile
        assert compiled[2], lines
    else:
        assert not compiled[2] and lines and lines[0].startswith("torch.compile is off")
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-5, atol=1e-6)
    assert_equal(compiled[1], eager[1])
