"""LoRA's own autograd (core.models.lora_autograd) against the plain LoRA path: forward and every
gradient equal within fp32 rounding, for one layer and for a whole fine-tune's model (the CPU's
Remake hooks on), and the plain path wherever the function does not serve."""

from __future__ import annotations

import torch
import torch.nn as nn

from core.models import lora
from core.models.kernels import set_fast_lora
from core.models.model import GPT, GPTConfig

TOL = dict(rtol=1e-5, atol=1e-6)


def adapted(bias: bool, rank: int = 4, dropout: float = 0.0) -> lora.LoRALinear:
    torch.manual_seed(0)
    layer = lora.LoRALinear(nn.Linear(24, 40, bias=bias), rank, 8.0, dropout)
    with torch.no_grad():
        layer.lora_B.normal_()  # B starts at zero: the adapter's share would be nothing
    return layer


def run(layer, x):
    x = x.clone().requires_grad_(True)
    y = layer(x)
    (y * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
    grads = [x.grad] + [p.grad.clone() for p in (layer.lora_A, layer.lora_B)]
    layer.zero_grad()
    return y.detach(), grads


def test_one_layer_equals_the_plain_path_forward_and_backward():
    x = torch.randn(3, 7, 24)
    for bias in (False, True):
        layer = adapted(bias)
        plain = run(layer, x)
        layer.fast = True
        fast = run(layer, x)
        torch.testing.assert_close(fast[0], plain[0], **TOL)
        for g_fast, g_plain in zip(fast[1], plain[1], strict=True):
            torch.testing.assert_close(g_fast, g_plain, **TOL)


def test_a_trained_base_weight_and_bias_get_their_plain_gradients():
    layer = adapted(True)
    layer.weight.requires_grad_(True)
    layer.bias.requires_grad_(True)
    x = torch.randn(5, 24)
    layer(x).square().sum().backward()
    plain = (layer.weight.grad.clone(), layer.bias.grad.clone())
    layer.zero_grad()
    layer.fast = True
    layer(x).square().sum().backward()
    torch.testing.assert_close(layer.weight.grad, plain[0], **TOL)
    torch.testing.assert_close(layer.bias.grad, plain[1], **TOL)


def test_adapters_off_and_dropout_keep_the_plain_path():
    layer = adapted(False, dropout=0.5)
    layer.fast = True
    assert not lora.serves(layer)  # dropout: the adapter's input differs from the base's
    layer.lora_dropout.p = 0.0
    assert lora.serves(layer)
    x = torch.randn(4, 24)
    with lora.adapters_disabled(layer):
        torch.testing.assert_close(layer(x), nn.functional.linear(x, layer.weight))


def tiny(fused: bool) -> GPT:
    torch.manual_seed(1)
    c = GPTConfig(
        hidden_dim=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        seq_len=16,
        vocab_size=64,
        bias=False,
        norm="rmsnorm",
        positions="rope",
        mlp="swiglu",
        fused=fused,
    )
    model = GPT(c)
    lora.apply_lora(model, 4, 8.0, 0.0, "all")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("lora_B"):
                p.normal_(std=0.1)
    return model.train()


def loss_and_grads(model, x, y, mask):
    _, loss = model(x, y, loss_mask=mask)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    return loss.detach(), grads


def test_a_fine_tunes_loss_and_adapter_gradients_equal_the_plain_path():
    g = torch.Generator().manual_seed(2)
    x, y = torch.randint(0, 64, (2, 16), generator=g), torch.randint(0, 64, (2, 16), generator=g)
    mask = (torch.rand(2, 16, generator=g) > 0.3).float()
    for fused in (True, False):  # fused: the Remake hooks remake the saved norm outputs
        model = tiny(fused)
        plain = loss_and_grads(model, x, y, mask)
        set_fast_lora(model, True)
        fast = loss_and_grads(model, x, y, mask)
        torch.testing.assert_close(fast[0], plain[0], **TOL)
        assert (
            fast[1].keys() == plain[1].keys() and len(plain[1]) == 2 * 4 * 2
        )  # layers x adapted x (A, B)
        for name in plain[1]:
            torch.testing.assert_close(fast[1][name], plain[1][name], rtol=1e-4, atol=1e-6)
