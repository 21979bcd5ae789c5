"""The kernel set a run's device chooses (core.models.kernels): the torch path on the CPU,
untouched; on CUDA Liger's kernels where Liger imports (here fakes that record their calls), the
torch path with one line where it does not; and packed rows by flex_attention equal to the
masked path. The Triton kernels themselves: tests/core/test_kernels_triton.py."""

from __future__ import annotations

import types

import torch

from core.models import kernels, lora
from core.models.model import GPT, GPTConfig, RMSNorm, SelfAttention, packed, rotate

CUDA = torch.device("cuda")  # choose() reads the type only; nothing here runs on a GPU


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    options = dict(
        hidden_dim=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        seq_len=24,
        vocab_size=64,
        bias=False,
        norm="rmsnorm",
        positions="rope",
        mlp="swiglu",
        fused=True,
    )
    return GPT(GPTConfig(**{**options, **kw})).train()


def batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randint(0, 64, (2, 24), generator=g), torch.randint(0, 64, (2, 24), generator=g)
    segments = torch.tensor([[0] * 5 + [1] * 11 + [2] * 8, [0] * 17 + [1] * 7])
    return x, y, segments


def test_the_cpu_keeps_the_torch_path_untouched():
    chosen = kernels.choose(
        torch.device("cpu"), log=lambda m: (_ for _ in ()).throw(AssertionError(m))
    )
    assert type(chosen) is kernels.KernelSet and chosen.fast_lora == kernels.CPU_FAST_LORA
    model = tiny()
    lora.apply_lora(model, 4, 8.0, 0.0, "all")
    x, y, _ = batch()
    before = model(x, y)[1]
    chosen.install(model)
    assert all("forward" not in vars(m) and "_attend" not in vars(m) for m in model.modules())
    assert not hasattr(model.head, "linear_cross_entropy")
    assert torch.equal(model(x, y)[1], before)  # the same kernels: the same bits


def test_cuda_without_liger_runs_the_torch_path_and_says_so_once():
    lines = []

    def missing():
        raise ImportError("No module named 'liger_kernel'")

    chosen = kernels.choose(CUDA, lines.append, importer=missing)
    assert type(chosen) is kernels.KernelSet and chosen.fast_lora
    assert len(lines) == 1 and "pip install liger-kernel" in lines[0]


class Recorder:
    """Fake Liger functions computing what the torch path computes, recording each call."""

    def __init__(self):
        self.calls: list[str] = []
        me = self

        class Norm:
            @staticmethod
            def apply(x, w, eps, offset, casting, in_place):
                me.calls.append(f"rms_norm:{casting}")
                h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
                return (h * (offset + w.float())).to(x.dtype)

        class Rope:
            @staticmethod
            def apply(q, k, cos, sin):
                me.calls.append("rope")
                return rotate(q, cos, sin), rotate(k, cos, sin)

        def lce(hidden, weight, targets, ignore_index=-100, reduction="mean"):
            me.calls.append("lce")
            return torch.nn.functional.cross_entropy(
                hidden @ weight.t(), targets, ignore_index=ignore_index, reduction=reduction
            )

        self.ns = types.SimpleNamespace(rms_norm_fn=Norm, rope_fn=Rope, lce=lce)


def test_cuda_with_liger_puts_its_kernels_on_the_model_and_keeps_its_numbers():
    fake = Recorder()
    chosen = kernels.choose(CUDA, lambda m: None, importer=lambda: fake.ns)
    assert isinstance(chosen, kernels.CudaKernels)
    model = tiny(norm_offset=1.0)  # Gemma's 1 + w: Liger's gemma casting
    lora.apply_lora(model, 4, 8.0, 0.0, "all")
    x, y, segments = batch()
    mask = torch.ones(2, 24)
    mask[:, :6] = 0
    want = model(x, y, loss_mask=mask)[1]
    chosen.install(model, blocks_eager=True)
    got = model(x, y, loss_mask=mask)[1]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    norms = sum(isinstance(m, RMSNorm) for m in model.modules())
    assert fake.calls.count("rms_norm:gemma") == norms and fake.calls.count("rope") == 2
    assert fake.calls.count("lce") == 1
    assert all(m.fast for m in model.modules() if isinstance(m, lora.LoRALinear))
    assert "fused linear cross-entropy (Liger)" in chosen.describe()


def test_compiled_blocks_keep_their_own_ops_and_the_final_norm_and_loss_take_liger():
    fake = Recorder()
    model = tiny()
    chosen = kernels.choose(CUDA, lambda m: None, importer=lambda: fake.ns)
    chosen.install(model, blocks_eager=False)
    x, y, _ = batch()
    model(x, y)
    assert fake.calls == ["rms_norm:llama", "lce"]  # ln_f, then the loss


def test_the_fused_loss_without_a_mask_and_with_no_label_at_all():
    fake = Recorder()
    chosen = kernels.CudaKernels(fake.ns)
    hidden, weight = torch.randn(2, 5, 8), torch.randn(11, 8)
    targets = torch.randint(0, 11, (2, 5))
    want = torch.nn.functional.cross_entropy(
        hidden.reshape(10, 8) @ weight.t(), targets.reshape(-1)
    )
    torch.testing.assert_close(chosen.linear_cross_entropy(hidden, weight, targets, None), want)
    none = chosen.linear_cross_entropy(hidden, weight, targets, torch.zeros(2, 5))
    assert none.item() == 0.0  # no labelled position: 0, as the torch path's, not nan


def packed_logits(model, x, segments):
    with torch.no_grad():  # flex_attention has no backward on the CPU (torch 2.13): GPU-checked
        return model(x, segments=segments)[0]


def test_packed_rows_by_flex_attention_equal_the_masked_path(monkeypatch):
    flexed = []
    real = kernels.packed_attention
    monkeypatch.setattr(kernels, "packed_attention", lambda *a: flexed.append(1) or real(*a))
    x, _, segments = batch()
    for kw in ({}, {"sliding_window": 6, "layer_types": ["sliding_attention", "full_attention"]}):
        model = tiny(**kw).eval()
        want = packed_logits(model, x, segments)
        for m in model.modules():
            if isinstance(m, SelfAttention):
                m._attend = types.MethodType(kernels.flex_attend(m._attend), m)
        torch.testing.assert_close(packed_logits(model, x, segments), want, rtol=1e-5, atol=1e-5)
    assert len(flexed) == 4  # both layers of both models went through flex_attention


def test_the_block_mask_lets_a_query_see_its_own_examples_earlier_keys_only():
    ids = torch.tensor([[0] * 130 + [1] * 126])  # two examples across 128-token blocks
    _, segments = packed(ids)
    block_mask = kernels.segment_block_mask(segments, 256, None, ids.device)
    dense = block_mask.to_dense()[0, 0]  # which (query block, key block) pairs are visited
    assert dense.tolist() == [[1, 0], [1, 1]]  # block 1's queries: example 0's tail, and 1's
    q = torch.arange(256)
    same = (ids[0, q, None] == ids[0, None, q]) & (q[:, None] >= q[None, :])
    got = block_mask.mask_mod(0, 0, q[:, None], q[None, :])
    assert torch.equal(got, same)
