"""gpt-oss's attention: a learned sink logit per head in each softmax, alternating sliding and
full layers, YaRN positions and attention biases, against transformers' own GptOss model
(eager attention) in fp32, in the training forward and the cached one."""

import dataclasses

import pytest
import torch
from helpers import cached_forward

from core.models.model import (
    GPT,
    GPTConfig,
    explicit_attention,
    rope_attention_factor,
    rope_frequencies,
)

transformers = pytest.importorskip("transformers")

WINDOW = 4
YARN = {  # gpt-oss-20b's rope_parameters
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
    "rope_theta": 150000.0,
}


def hf_model():
    """A tiny GptOssForCausalLM whose experts give zero: what is left is its attention."""
    config = transformers.GptOssConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=2,
        num_experts_per_tok=1,
        sliding_window=WINDOW,
        max_position_embeddings=64,
        rope_parameters=dict(YARN),
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)  # large enough to matter
            for p in layer.mlp.experts.parameters():
                p.zero_()
    return model


def ours_of(hf) -> GPT:
    h = hf.config
    c = GPTConfig(
        hidden_dim=h.hidden_size,
        n_layers=h.num_hidden_layers,
        n_heads=h.num_attention_heads,
        n_kv_heads=h.num_key_value_heads,
        head_dim=h.head_dim,
        ffn_dim=h.intermediate_size,
        seq_len=h.max_position_embeddings,
        vocab_size=h.vocab_size,
        bias=False,
        qkv_bias=True,
        out_bias=True,
        norm="rmsnorm",
        norm_eps=h.rms_norm_eps,
        positions="rope",
        rope_theta=YARN["rope_theta"],
        rope_scaling={k: v for k, v in YARN.items() if k != "rope_theta"},
        mlp="swiglu",
        tie_embeddings=False,
        sliding_window=h.sliding_window,
        layer_types=list(h.layer_types),
        attn_sinks=True,
    )
    model = GPT(c).eval()
    s = hf.state_dict()
    state = {
        "tok_emb.weight": s["model.embed_tokens.weight"],
        "ln_f.weight": s["model.norm.weight"],
        "head.weight": s["lm_head.weight"],
    }
    for i in range(c.n_layers):
        a, b = f"model.layers.{i}.self_attn.", f"blocks.{i}."
        state[b + "ln1.weight"] = s[f"model.layers.{i}.input_layernorm.weight"]
        state[b + "ln2.weight"] = s[f"model.layers.{i}.post_attention_layernorm.weight"]
        for kind in ("weight", "bias"):
            qkv = [s[a + f"{x}_proj.{kind}"] for x in "qkv"]
            state[b + f"attn.qkv.{kind}"] = torch.cat(qkv)
            state[b + f"attn.proj.{kind}"] = s[a + f"o_proj.{kind}"]
        state[b + "attn.sinks"] = s[a + "sinks"]
        state[b + "mlp.fc.weight"] = torch.zeros_like(model.blocks[i].mlp.fc.weight)
        state[b + "mlp.proj.weight"] = torch.zeros_like(model.blocks[i].mlp.proj.weight)
    model.load_state_dict(state)
    return model


@pytest.fixture(scope="module")
def pair():
    hf = hf_model()
    return hf, ours_of(hf)


def test_yarn_matches_gpt_oss_rope_parameters(pair):
    hf, ours = pair
    rotary = hf.model.rotary_emb
    assert torch.allclose(rope_frequencies(ours.config), rotary.inv_freq, rtol=1e-6, atol=0)
    assert rope_attention_factor(ours.config) == pytest.approx(rotary.attention_scaling)


def test_logits_equal_transformers_past_the_window(pair):
    hf, ours = pair
    idx = torch.randint(0, 64, (2, 3 * WINDOW + 1), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(idx).logits
        got = ours.logits(idx)
    assert torch.allclose(got, want, atol=1e-5, rtol=0)
    fused = GPT(dataclasses.replace(ours.config, fused=True))  # a fine-tune's forward
    fused.load_state_dict(ours.state_dict())
    _, loss = fused(idx, idx)
    loss.backward()
    assert all(block.attn.sinks.grad.abs().sum() > 0 for block in fused.blocks)
    with torch.no_grad():
        assert torch.allclose(fused.eval().logits(idx), want, atol=1e-5, rtol=0)
    # the sinks matter here: without them the model says something else
    plain = dataclasses.replace(ours.config, attn_sinks=False)
    without = GPT(plain).eval()
    without.load_state_dict(ours.state_dict(), strict=False)
    with torch.no_grad():
        assert not torch.allclose(without.logits(idx), want, atol=1e-3)


def test_cached_forward_equals_transformers_with_padding(pair):
    hf, ours = pair
    idx = torch.randint(0, 64, (1, 2 * WINDOW + 3), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = hf(idx).logits
    assert torch.allclose(cached_forward(ours, idx, 3), want, atol=1e-5, rtol=0)
    # the same row left-padded beside a longer one: its own positions, its own keys
    longer = torch.randint(0, 64, (1, idx.shape[1] + 2), generator=torch.Generator().manual_seed(3))
    batch = torch.cat((torch.cat((torch.zeros(1, 2, dtype=torch.long), idx), 1), longer))
    valid = torch.ones_like(batch, dtype=torch.bool)
    valid[0, :2] = False
    logits, _ = ours.forward_cached(batch, None, valid)
    assert torch.allclose(logits[0, 2:], want[0], atol=1e-5, rtol=0)


def test_sinks_only_add_to_the_softmax_sum():
    """A sink of -inf is plain attention; a sink s scales each row's weights by
    sum(exp(scores)) / (sum(exp(scores)) + exp(s))."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    off = explicit_attention(q, k, v, True, None, None, None, torch.full((2,), -torch.inf), 0.0)
    assert torch.allclose(off, plain, atol=1e-6)
    ones = torch.ones(1, 2, 5, 1)
    sinks = torch.tensor([0.5, -1.0])
    kept = explicit_attention(q, k, ones.expand(1, 2, 5, 4), True, None, None, None, sinks, 0.0)
    scores = (q @ k.transpose(-2, -1)) / 2
    scores = scores.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), -torch.inf)
    total = scores.exp().sum(-1, keepdim=True)
    share = total / (total + sinks.exp().view(1, 2, 1, 1))
    assert torch.allclose(kept, share.expand(1, 2, 5, 4), atol=1e-6)
    assert explicit_attention(q, k, v, True, None, None, None, sinks, 0.0).isfinite().all()
