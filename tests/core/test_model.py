import math

import torch

from core.models.model import GPT, VOCAB_SIZE, GPTConfig
from core.models.params import param_count
from core.models.per_layer import PerLayer


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


GEMMA4_SHAPE = {"layer_types": ["sliding_attention", "full_attention"] * 2, "sliding_window": 4}
# Gemma 4's options as runs saved them before they became GPTConfig.per_layer
FLAT = {
    "per_layer_dim": 8,
    "per_layer_vocab": None,
    "full_head_dim": 16,
    "full_kv_heads": None,
    "k_eq_v": False,
    "v_norm": True,
    "kv_shared_layers": 2,
    "wide_shared_mlp": True,
    "layer_scalar": True,
}


def test_a_gemma4_shape_saved_with_flat_fields_loads_into_its_per_layer_block(tmp_path):
    new = GPTConfig(
        hidden_dim=32,
        n_layers=4,
        n_heads=4,
        seq_len=16,
        **GEMMA4_SHAPE,
        per_layer=PerLayer(
            input_dim=8,
            full_head_dim=16,
            v_norm=True,
            kv_shared_layers=2,
            wide_shared_mlp=True,
            layer_scalar=True,
        ),
    )
    saved = {k: v for k, v in new.to_dict().items() if k != "per_layer"} | FLAT
    assert GPTConfig.from_dict(saved) == new
    # a checkpoint holds the block as a plain dict (torch.load with weights_only)
    torch.save({"model_config": new.to_dict()}, tmp_path / "c.pt")
    again = torch.load(tmp_path / "c.pt", weights_only=True)["model_config"]
    assert GPTConfig.from_dict(again) == new
    old = {name: t.shape for name, t in GPT(GPTConfig.from_dict(saved)).state_dict().items()}
    assert {name: t.shape for name, t in GPT(new).state_dict().items()} == old
    assert "per_layer_inputs.table.weight" in old and "blocks.3.scalar" in old


def test_a_shape_saved_with_gemma4s_flat_fields_off_has_no_per_layer_block():
    off = {"per_layer_dim": None, "per_layer_vocab": None, "full_head_dim": None}
    off |= {"full_kv_heads": None, "k_eq_v": False, "v_norm": False, "kv_shared_layers": 0}
    off |= {"wide_shared_mlp": False, "layer_scalar": False}
    assert off.keys() == FLAT.keys()
    plain = GPTConfig(hidden_dim=32, n_layers=2, n_heads=4, seq_len=16)
    saved = {k: v for k, v in plain.to_dict().items() if k != "per_layer"} | off
    c = GPTConfig.from_dict(saved)
    assert c.per_layer is None and c == plain
