"""Qwen3.5's hybrid layers beyond the family tests (test_pretrained, test_families,
test_moe_families, test_grpo_families): the Gated DeltaNet against transformers' own delta
rule, logits past a chunk, generation from the recurrent and conv state with rows padded on
either side, flash-linear-attention's dispatch (a stand-in on the CPU), the counts and the
one line for a layer type TrainDeck does not build."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch

pytest.importorskip("transformers")

from hf_models import TEXT, make_model  # noqa: E402

from core.errors import UserError  # noqa: E402
from core.models import deltanet  # noqa: E402
from core.models.params import shape_params  # noqa: E402
from core.use.common import ExportError  # noqa: E402
from core.use.export import export  # noqa: E402
from core.use.generate import generate_ids  # noqa: E402
from core.weights import families  # noqa: E402
from core.weights.loader import info_line, load, open_pretrained  # noqa: E402


def test_the_delta_rule_equals_transformers_in_chunks_and_a_token_at_a_time():
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    gen = torch.Generator().manual_seed(0)
    b, t, hk, hv, dk, dv = 2, 150, 2, 4, 16, 8  # past two chunks, v heads grouped on k heads

    def r(*shape):
        return torch.randn(*shape, generator=gen)

    q, k, v = r(b, t, hk, dk), r(b, t, hk, dk), r(b, t, hv, dv)
    g, beta = -torch.rand(b, t, hv, generator=gen), torch.rand(b, t, hv, generator=gen)
    state = r(b, hv, dk, dv)
    want, want_state = torch_chunk_gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    layer = types.SimpleNamespace(n_v=hv, n_k=hk, dk=dk)
    got, got_state = deltanet.GatedDeltaNet.rule(layer, q, k, v, g, beta, state)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_state, want_state, atol=1e-5, rtol=1e-5)
    s = state
    steps = []
    for i in range(t):  # generation: one token at a time from the state
        y, s = deltanet.GatedDeltaNet.rule(
            layer,
            q[:, i : i + 1],
            k[:, i : i + 1],
            v[:, i : i + 1],
            g[:, i : i + 1],
            beta[:, i : i + 1],
            s,
        )
        steps.append(y)
    torch.testing.assert_close(torch.cat(steps, 1), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s, want_state, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3_5")
    hf_model, tok = make_model(folder, "qwen3_5")
    return folder, hf_model, tok


def test_logits_past_a_chunk_and_generation_from_the_state_with_padding(qwen35):
    folder, hf_model, tok = qwen35
    model = load(folder).model
    ids = tok(TEXT)["input_ids"]
    rows = torch.tensor([ids[:80], ids[7:87]])  # 80 tokens: past a chunk of 64
    with torch.no_grad():
        want = hf_model(rows).logits
    got = model.logits(rows)
    assert (got - want).abs().max().item() < 1e-5
    # A left-padded and a right-padded row of 70 and 60 tokens, then 10 tokens one at a
    # time from the cache: each row's logits as its own full forward gives them.
    lengths, width = (70, 60), 72
    batch = torch.zeros((2, width), dtype=torch.long)
    valid = torch.zeros((2, width), dtype=torch.bool)
    batch[0, width - 70 :], valid[0, width - 70 :] = rows[0, :70], True
    batch[1, :60], valid[1, :60] = rows[1, :60], True
    logits, cache = model.forward_cached(batch, None, valid)
    assert (logits[0, width - 1] - want[0, 69]).abs().max() < 1e-5
    assert (logits[1, 59] - want[1, 59]).abs().max() < 1e-5
    for step in range(10):
        nxt = torch.stack([rows[r, n + step] for r, n in enumerate(lengths)])[:, None]
        logits, cache = model.forward_cached(nxt, cache)
        for r, n in enumerate(lengths):
            assert (logits[r, 0] - want[r, n + step]).abs().max() < 1e-5, (r, step)
    assert cache.layers[0][1].shape == (2, 4, 8, 8)  # a DeltaNet layer's recurrent state


def test_flash_linear_attention_runs_the_rule_where_it_imports(qwen35, monkeypatch):
    """fla's chunk and recurrent kernels take the rule where they import (CUDA; here a
    stand-in on the CPU that runs transformers' torch rule): same arguments, same logits."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    folder, _, tok = qwen35
    model = load(folder).model
    x = torch.tensor([tok(TEXT)["input_ids"][:20]])
    want = model.logits(x)
    calls = []

    def chunk(q, k, v, g, beta, scale, initial_state, output_final_state, **kw):
        calls.append(("chunk", q.shape, scale, kw))
        return hf.torch_chunk_gated_delta_rule(q, k, v, g, beta, 64, initial_state, True, **kw)

    def recurrent(q, k, v, g, beta, scale, initial_state, output_final_state, **kw):
        calls.append(("recurrent", q.shape, scale, kw))
        return hf.torch_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state, True, **kw)

    ops = types.ModuleType("fla.ops.gated_delta_rule")
    ops.chunk_gated_delta_rule, ops.fused_recurrent_gated_delta_rule = chunk, recurrent
    for name in ("fla", "fla.ops"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", ops)
    cuda = torch.device("cuda")
    assert deltanet.kernel_line(model.config, cuda) is None  # fla there: no line
    monkeypatch.setattr(deltanet, "KERNEL_DEVICES", ("cpu", "cuda"))
    got = model.logits(x)
    assert (got - want).abs().max() < 1e-5
    assert calls[0] == ("chunk", (1, 20, 4, 8), 8**-0.5, {"use_qk_l2norm_in_kernel": True})
    assert len(calls) == 3  # each DeltaNet layer once
    _, cache = model.forward_cached(x)
    model.forward_cached(x[:, -1:], cache)
    assert calls[-1][0] == "recurrent"


def test_without_fla_on_cuda_one_line_names_the_extra(qwen35, monkeypatch):
    model = load(qwen35[0]).model
    monkeypatch.setitem(sys.modules, "fla", None)  # not importable
    line = deltanet.kernel_line(model.config, torch.device("cuda"))
    assert "traindeck[fla]" in line and "faster" in line and "\n" not in line
    assert deltanet.kernel_line(model.config, torch.device("cpu")) is None


def test_the_counts_and_the_info_line(qwen35):
    folder, hf_model, _ = qwen35
    c = load(folder).model.config
    assert shape_params(c) == hf_model.num_parameters()  # the DeltaNet's weights counted
    line = info_line(open_pretrained(str(folder)).info())
    assert line.startswith("Qwen3.5 (hybrid: 3 linear-attention + 1 attention layers), ")


def test_a_layer_type_it_cannot_build_is_one_line(qwen35):
    hf = json.loads((qwen35[0] / "config.json").read_text())
    bad = {**hf, "layer_types": ["linear_attention", "mamba", "linear_attention", "full_attention"]}
    with pytest.raises(UserError, match=r"layer_types\[1\]: 'mamba' is not built; allowed: full"):
        families.model_config(bad, "config.json")


def log_likelihoods(logits, ids: list[int]):
    logp = torch.as_tensor(logits, dtype=torch.float64).log_softmax(-1)
    return logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]


def test_the_f32_gguf_runs_in_llama_cpp_within_2e_3_of_transformers(qwen35, tmp_path):
    """llama.cpp's qwen35 (its own delta rule, v heads tiled, A as -exp(A_log), 1 + w
    norms, interleaved M-RoPE sections) scores 80 tokens as transformers does."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from helpers import llama_greedy

    folder, hf_model, tok = qwen35
    export(folder, "gguf", tmp_path / "gguf", quant="f32")
    ids = tok(TEXT)["input_ids"][:80]
    llm = llama_cpp.Llama(
        str(tmp_path / "gguf" / "model.gguf"),
        n_ctx=128,
        logits_all=True,
        n_threads=1,
        verbose=False,
    )
    assert llm.metadata["general.architecture"] == "qwen35"
    llm.eval(ids)
    with torch.no_grad():
        want = log_likelihoods(hf_model(torch.tensor([ids])).logits[0], ids)
    got = log_likelihoods(llm.scores[: len(ids)], ids)
    assert (got - want).abs().max() < 2e-3
    model = load(folder).model
    assert llama_greedy(llm, ids[:30], 8) == list(generate_ids(model, ids[:30], 8, 0))


def test_gguf_refuses_what_llama_cpp_would_build_otherwise(tmp_path):
    kinds = ["linear_attention", "full_attention", "linear_attention", "linear_attention"]
    make_model(tmp_path / "m", "qwen3_5", layer_types=kinds)  # no one interval
    with pytest.raises(ExportError, match="gguf: llama.cpp's qwen35 takes every n-th layer"):
        export(tmp_path / "m", "gguf", tmp_path / "gguf", quant="f32")
    assert not (tmp_path / "gguf").exists()


def test_the_estimate_counts_the_deltanet_weights_and_a_state_that_does_not_grow(qwen35):
    from helpers import tiny_config

    from core.models.model import cache_bytes
    from core.training.estimate import estimate

    folder, hf_model, _ = qwen35
    cfg = tiny_config(init_from=str(folder), tokenizer="model", lora_rank=4, seq_len=64)
    assert estimate(cfg, on_gpu=False).n_params == hf_model.num_parameters()
    c = load(folder).model.config
    per_token = 2 * c.n_kv_heads * c.head_dim * 2  # one attention layer's keys and values
    assert cache_bytes(c, 1, 2000, 2) - cache_bytes(c, 1, 1000, 2) == 1000 * per_token
    assert cache_bytes(c, 1, 1000, 2) > 1000 * per_token  # and the 3 DeltaNet states
