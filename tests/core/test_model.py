import math

import pytest
import torch

from core.models.model import GPT, VOCAB_SIZE, GPTConfig
from core.models.params import param_count


def make(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(**{"hidden_dim": 32, "n_layers": 2, "n_heads": 4, "seq_len": 16, **kw}))


def test_shapes_and_initial_loss_near_uniform_guess():
    model = make()
    idx = torch.randint(0, VOCAB_SIZE, (3, 16))
    targets = torch.randint(0, VOCAB_SIZE, (3, 16))
    logits = model.logits(idx)
    assert logits.shape == (3, 16, VOCAB_SIZE)
    _, loss = model(idx, targets)
    assert abs(loss.item() - math.log(VOCAB_SIZE)) < 0.3


@pytest.mark.numerics
def test_attention_is_causal():
    model = make().eval()
    idx = torch.randint(0, VOCAB_SIZE, (1, 16))
    changed = idx.clone()
    changed[0, 10] = (changed[0, 10] + 1) % VOCAB_SIZE
    a = model.logits(idx)
    b = model.logits(changed)
    assert torch.equal(a[0, :10], b[0, :10])
    assert not torch.equal(a[0, 10:], b[0, 10:])


def test_output_head_is_tied_to_the_embedding():
    model = make()
    assert model.head.weight is model.tok_emb.weight
    assert model.num_params() == param_count(32, 2, 16)


def test_param_count_formula_is_exact_for_several_sizes():
    for hidden, layers, heads, seq in [(8, 1, 1, 8), (64, 3, 4, 32), (96, 2, 6, 100)]:
        model = GPT(GPTConfig(hidden_dim=hidden, n_layers=layers, n_heads=heads, seq_len=seq))
        assert model.num_params() == param_count(hidden, layers, seq)
        c = GPTConfig(hidden_dim=hidden, n_layers=layers, n_heads=heads, seq_len=seq, bias=False)
        assert GPT(c).num_params() == param_count(hidden, layers, seq, bias=False)
        assert not any(name.endswith("bias") for name, _ in GPT(c).named_parameters())


def test_gradient_checkpointing_gives_the_same_loss_and_gradients():
    idx = torch.randint(0, VOCAB_SIZE, (2, 16))
    plain, ckpt = make(), make(grad_checkpointing=True)
    ckpt.load_state_dict(plain.state_dict())
    for m in (plain, ckpt):
        m.train()
        m(idx, idx)[1].backward()
    assert torch.allclose(plain(idx, idx)[1], ckpt(idx, idx)[1])
    for p, q in zip(plain.parameters(), ckpt.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-6)


def test_longer_input_than_context_is_refused():
    model = make()
    try:
        model(torch.zeros(1, 17, dtype=torch.long))
    except ValueError as e:
        assert "seq_len" in str(e)
    else:
        raise AssertionError("a 17-token input to a 16-token model must fail")


def test_overfits_one_batch():
    model = make()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    idx = torch.randint(0, VOCAB_SIZE, (2, 16))
    first = None
    for _ in range(60):
        _, loss = model(idx[:, :-1], idx[:, 1:])
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first / 3


def test_generate_uses_its_own_generator():
    model = make().eval()
    before = torch.get_rng_state()
    g = torch.Generator().manual_seed(1)
    out = model.generate(torch.zeros(1, 4, dtype=torch.long), 20, g)
    assert out.shape == (1, 24)
    assert torch.equal(before, torch.get_rng_state())
    g = torch.Generator().manual_seed(1)
    again = model.generate(torch.zeros(1, 4, dtype=torch.long), 20, g)
    assert torch.equal(out, again)
