"""GGUF quantization without llama.cpp: K-quant encoders checked by the gguf package's own
dequantizer, byte sizes, and llama-quantize's per-tensor type choice."""

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402

from core.use.gguf_quants import QUANTS, expected_bytes, quantize, tensor_type  # noqa: E402

# Relative RMS error measured on `data` below (numpy seed 0): Q4_K 0.0739, Q5_K 0.0376,
# Q6_K 0.0191. (On 120 other blocks, a scalar port of llama.cpp's reference quantizers gave
# 0.0708 / 0.0358 / 0.0180 and this code the same to 4 digits.) Bounds with some margin.
BOUNDS = {T.Q4_K: 0.085, T.Q5_K: 0.045, T.Q6_K: 0.025}
# the same data through the gguf package's own legacy quantizers: Q4_0 0.095, Q5_0 0.049
LEGACY = {T.Q4_K: T.Q4_0, T.Q5_K: T.Q5_0}


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((66, 512)).astype(np.float32)
    x[64, 7], x[64, 300] = 40.0, -25.0  # a row with outliers
    x[65] = 0.0  # an all-zero row
    return x


def rel_rms(x, qtype):
    q = quantize(x, qtype)
    y = gguf.quants.dequantize(np.frombuffer(q.tobytes(), np.uint8).reshape(len(x), -1), qtype)
    assert y.shape == x.shape and np.isfinite(y).all()
    return float(np.sqrt(np.mean((y - x) ** 2) / np.mean(x**2))), y


@pytest.mark.parametrize("qtype", list(BOUNDS))
def test_k_quants_come_back_through_ggufs_dequantizer(data, qtype):
    err, y = rel_rms(data, qtype)
    assert err < BOUNDS[qtype]
    if qtype in LEGACY:  # 4/5 bits with a min and 6-bit sub-scales beat one scale per 32
        assert err < rel_rms(data, LEGACY[qtype])[0]
    assert (y[65] == 0).all()  # the zero row: zeros, no NaN from a zero scale
    assert abs(y[64, 7] - 40.0) < 0.5 and abs(y[64, 300] + 25.0) < 0.5


def test_more_bits_less_error(data):
    q4, q5, q6 = (rel_rms(data, t)[0] for t in (T.Q4_K, T.Q5_K, T.Q6_K))
    assert q6 < q5 / 1.5 and q5 < q4 / 1.5


def test_all_zero_and_constant_blocks():
    x = np.zeros((2, 512), np.float32)
    x[1, :256] = -3.0  # a negative constant block goes into the min (Q4_K/Q5_K) or the scale
    for qtype in BOUNDS:
        y = gguf.quants.dequantize(quantize(x, qtype), qtype)
        assert np.allclose(y, x, atol=0.02), qtype.name
    assert not quantize(np.zeros((1, 256), np.float32), T.Q6_K).any()  # ggml: all zero bytes


@pytest.mark.parametrize("quant", QUANTS)
def test_byte_sizes(data, quant):
    qtype = tensor_type("blk.3.attn_q.weight", data.shape, quant, 32)[0]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    out = quantize(data, qtype)
    assert out.shape[0] == data.shape[0]
    assert out.nbytes == data.shape[0] * data.shape[1] // block * size
    assert out.nbytes == expected_bytes(data.shape, qtype)


def test_bad_shapes_and_values():
    with pytest.raises(ValueError, match="96 columns"):
        quantize(np.ones((2, 96), np.float32), T.Q4_K)
    with pytest.raises(ValueError, match="96 columns"):
        expected_bytes((2, 96), T.Q6_K)
    with pytest.raises(ValueError, match="NaN"):
        quantize(np.full((1, 256), np.nan, np.float32), T.Q4_K)


def llama_names(n_layers=32, dim=512, ffn=1024, vocab=1000):
    yield "token_embd.weight", (vocab, dim)
    for i in range(n_layers):
        yield f"blk.{i}.attn_norm.weight", (dim,)
        yield f"blk.{i}.attn_q.weight", (dim, dim)
        yield f"blk.{i}.attn_k.weight", (dim // 4, dim)
        yield f"blk.{i}.attn_v.weight", (dim // 4, dim)
        yield f"blk.{i}.attn_output.weight", (dim, dim)
        yield f"blk.{i}.ffn_norm.weight", (dim,)
        yield f"blk.{i}.ffn_gate.weight", (ffn, dim)
        yield f"blk.{i}.ffn_up.weight", (ffn, dim)
        yield f"blk.{i}.ffn_down.weight", (dim, ffn)
    yield "output_norm.weight", (dim,)
    yield "output.weight", (vocab, dim)


# use_more_bits(i, 32): i < 32/8, i >= 7*32/8, or (i - 32/8) % 3 == 2
MORE_BITS = [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


@pytest.mark.parametrize("quant, base", [("q4_k_m", T.Q4_K), ("q5_k_m", T.Q5_K)])
def test_k_m_mix_is_llama_quantizes(quant, base):
    counters = {}
    got = {name: tensor_type(name, shape, quant, 32, counters) for name, shape in llama_names()}
    assert all(note is None for _, note in got.values())
    six = {n for n, (t, _) in got.items() if t == T.Q6_K}
    expected = {f"blk.{i}.{k}.weight" for i in MORE_BITS for k in ("attn_v", "ffn_down")}
    assert six == expected | {"output.weight"}
    for name, (qtype, _) in got.items():
        if name.endswith("norm.weight"):
            assert qtype == T.F32
        elif name not in six:
            assert qtype == base, name  # token_embd included (the model has an output)
    assert counters == {"F32": 65, "Q6_K": 33, base.name: 1 + 32 * 7 - 32}


def test_tied_embeddings_get_the_outputs_type():
    assert tensor_type("token_embd.weight", (1000, 512), "q4_k_m", 32, tied=True)[0] == T.Q6_K
    assert tensor_type("token_embd.weight", (1000, 512), "q4_0", 32, tied=True)[0] == T.Q6_K
    assert tensor_type("token_embd.weight", (1000, 512), "q4_0", 32)[0] == T.Q4_0
    assert tensor_type("output.weight", (1000, 512), "q4_0", 32)[0] == T.Q6_K
    assert tensor_type("output.weight", (1000, 512), "q8_0", 32)[0] == T.Q8_0


def test_gpt2_qkv_is_attn_v_like():
    pick = [
        tensor_type(f"blk.{i}.attn_qkv.weight", (1536, 512), "q4_k_m", 12)[0] for i in range(12)
    ]
    # 12 layers: i < 1, i >= 10, or (i - 1) % 3 == 2
    assert [i for i, t in enumerate(pick) if t == T.Q6_K] == [0, 3, 6, 9, 10, 11]
    assert tensor_type("position_embd.weight", (1024, 512), "q4_k_m", 12)[0] == T.F16


def test_odd_widths_fall_back_with_a_note():
    qtype, note = tensor_type("blk.0.attn_q.weight", (96, 96), "q4_k_m", 32)
    assert qtype == T.Q5_0
    assert note == "blk.0.attn_q.weight: 96 columns do not fit Q4_K blocks of 256; Q5_0"
    assert tensor_type("blk.0.attn_v.weight", (32, 96), "q4_k_m", 32)[0] == T.Q8_0  # Q6_K's
    assert tensor_type("blk.5.attn_q.weight", (96, 96), "q5_k_m", 32)[0] == T.Q5_1
    qtype, note = tensor_type("output.weight", (1000, 96), "q4_k_m", 32)
    assert qtype == T.Q8_0 and note.endswith("96 columns do not fit Q6_K blocks of 256; Q8_0")
    qtype, note = tensor_type("blk.0.ffn_up.weight", (40, 40), "q4_k_m", 32)
    assert qtype == T.F16 and "40 columns" in note
    assert tensor_type("blk.0.ffn_up.weight", (40, 40), "q8_0", 32)[0] == T.F16
    assert tensor_type("blk.0.ffn_up.weight", (96, 96), "q8_0", 32) == (T.Q8_0, None)


@pytest.mark.parametrize(
    "quant, qtype",
    [("q8_0", T.Q8_0), ("q6_k", T.Q6_K), ("f16", T.F16), ("bf16", T.BF16), ("f32", T.F32)],
)
def test_single_type_mixes(quant, qtype):
    for name, shape in llama_names():
        got, note = tensor_type(name, shape, quant, 32)
        assert note is None
        assert got == (T.F32 if len(shape) == 1 else qtype), name


def test_moe_tensors_get_llama_quantizes_types():
    """Stacked experts ([E, rows, cols]) as llama-quantize types them (test_llamacpp checks
    against it): ffn_down_exps takes the _m mix's Q6_K on the more-bits layers, the router,
    single-row tensors and expert biases stay F32, an 8-expert model's attention gets more
    bits, and mxfp4 puts only the experts in MXFP4."""
    exps = (8, 512, 1024)

    def pick(name, shape, quant, n_experts=8):
        return tensor_type(name, shape, quant, 32, n_experts=n_experts)[0]

    downs = [pick(f"blk.{i}.ffn_down_exps.weight", exps, "q4_k_m") for i in (0, 4, 6)]
    assert downs == [T.Q6_K, T.Q4_K, T.Q6_K]  # MORE_BITS has 0 and 6, not 4
    assert pick("blk.4.ffn_gate_exps.weight", exps, "q4_k_m") == T.Q4_K
    for quant in ("f16", "q4_k_m"):
        assert pick("blk.4.ffn_gate_inp.weight", (8, 512), quant) == T.F32
    assert pick("blk.4.ffn_gate_inp_shexp.weight", (1, 512), "q8_0") == T.F32
    assert pick("blk.4.ffn_down_exps.bias", (8, 512), "q4_k_m") == T.F32
    assert pick("blk.4.attn_k.weight", (128, 512), "q4_k_m") == T.Q8_0
    assert pick("blk.4.attn_k.weight", (128, 512), "q4_k_m", n_experts=4) == T.Q4_K
    assert pick("blk.4.attn_output.weight", (512, 512), "q4_k_m") == T.Q5_K
    assert pick("blk.4.attn_output.weight", (512, 512), "q5_k_m") == T.Q5_K
    assert pick("blk.4.ffn_up_exps.weight", exps, "mxfp4") == T.MXFP4
    assert pick("blk.4.attn_q.weight", (512, 512), "mxfp4") == T.Q8_0
    assert pick("output.weight", (1000, 512), "mxfp4") == T.Q8_0
