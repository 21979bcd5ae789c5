"""Quantized GGUF tensors without llama.cpp: the per-tensor type choice and the block encoders.

`tensor_type` picks each tensor's ggml type the way llama.cpp's llama-quantize does for the file
types in QUANTS (src/llama-quant.cpp: llama_tensor_get_type, tensor_type_fallback). `quantize`
turns a float32 matrix into ggml's bytes: F32/F16 as floats; BF16, Q8_0, Q4_0, Q5_0 and Q5_1 by
the gguf package; Q4_K, Q5_K and Q6_K (which the gguf package only dequantizes) here, in numpy,
after the ideas of ggml's reference quantizers (ggml/src/ggml-quants.c: quantize_row_q4_K_ref,
_q5_K_ref, _q6_K_ref with make_qkx2_quants / make_qx_quants), vectorized over blocks.

K-quant super-blocks hold QK_K = 256 values:
- Q4_K (144 bytes): fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32,
  128 bytes of 4-bit levels; a value is d * scale_j * q - dmin * min_j.
- Q5_K (176 bytes): as Q4_K with 32 bytes of fifth bits between the scales and the levels.
- Q6_K (210 bytes): 128 bytes of low 4 bits, 64 bytes of high 2 bits, 16 int8 scales for
  sub-blocks of 16, fp16 d; a value is d * scale_j * (q - 32).
"""

from __future__ import annotations

import re

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

T = GGMLQuantizationType
QK_K = 256
QUANTS = ("f32", "f16", "bf16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0", "mxfp4")
DEFAULT_TYPE = {
    "f32": T.F32,
    "f16": T.F16,
    "bf16": T.BF16,
    "q8_0": T.Q8_0,
    "q6_k": T.Q6_K,
    "q5_k_m": T.Q5_K,
    "q4_k_m": T.Q4_K,
    "q4_0": T.Q4_0,
    "mxfp4": T.Q8_0,  # llama.cpp's MXFP4_MOE: the experts in MXFP4, other matrices Q8_0
}
EXPERT_TYPE = {"mxfp4": T.MXFP4}  # a mix's type for stacked experts, where it has its own
# llama.cpp's tensor_type_fallback for a row length the type's blocks do not divide. It has none
# for Q4_0 / Q5_0 / Q5_1 / Q8_0 (llama-quantize stops there); we store those tensors as F16.
FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}
_CHUNK = 1024  # super-blocks per numpy pass: 256K values, temporaries stay in cache


def expected_bytes(shape: tuple[int, ...], qtype: GGMLQuantizationType) -> int:
    """Bytes of a tensor of this shape (rows last) stored as qtype."""
    block, size = GGML_QUANT_SIZES[qtype]
    if shape[-1] % block:
        raise ValueError(f"{shape[-1]} columns do not fit {qtype.name} blocks of {block}")
    return int(np.prod(shape, dtype=np.int64)) // block * size


# ---------------------------------------------------------------- per-tensor type choice


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's pick of about half the layers (first and last eighth, every third between)."""
    return (
        i_layer < n_layers // 8
        or i_layer >= 7 * n_layers // 8
        or (i_layer - n_layers // 8) % 3 == 2
    )


def _category(name: str) -> str:
    """llama.cpp's tensor_get_category: exact names first, then substrings, in its order."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for part, cat in (
        ("attn_qkv.weight", "attn_v"),  # llama.cpp treats qkv and kv_b as attn_v-like
        ("attn_kv_b.weight", "attn_v"),
        ("attn_v.weight", "attn_v"),
        ("attn_k.weight", "attn_k"),
        ("attn_q.weight", "attn_q"),
        ("attn_output.weight", "attn_output"),
        ("ffn_up", "ffn_up"),
        ("ffn_gate", "ffn_gate"),
        ("ffn_down", "ffn_down"),
    ):
        if part in name:
            return cat
    return "other"


def _quantizable(name: str) -> bool:
    """llama.cpp's tensor_allows_quantization, for the tensors a TrainDeck export can have."""
    return (
        name.endswith("weight")
        and "_norm.weight" not in name
        and "ffn_gate_inp.weight" not in name
        and name not in ("position_embd.weight", "token_types.weight")
    )


def tensor_type(
    name: str,
    shape: tuple[int, ...],
    quant: str,
    n_layers: int,
    counters: dict | None = None,
    *,
    tied: bool = False,
    n_experts: int = 0,
) -> tuple[GGMLQuantizationType, str | None]:
    """The ggml type of one tensor in a `quant` export, and a note when its shape forced a fallback.

    shape is numpy's (rows, cols): cols (shape[-1]) must fit the type's blocks. tied: the model
    has no output.weight (token_embd.weight is the output), which gets the output's type.
    n_experts: an MoE model's expert count (llama.cpp gives 8-expert models more bits in
    attention). counters (optional dict) collects {type name: tensors, "fallback": tensors}
    for a summary line; it also numbers attn_v / ffn_down tensors whose name has no "blk.N."
    (llama.cpp's counters).
    """
    if quant not in DEFAULT_TYPE:
        raise ValueError(f"unknown quant {quant!r}; one of {', '.join(QUANTS)}")
    qtype, note = _choose(name, tuple(shape), quant, n_layers, counters, tied)
    if n_experts == 8 and qtype not in (T.F32, T.F16, T.BF16):
        qtype, note = _eight_experts(name, shape, quant, qtype, note)
    if counters is not None:
        counters[qtype.name] = counters.get(qtype.name, 0) + 1
        if note:
            counters["fallback"] = counters.get("fallback", 0) + 1
    return qtype, note


def _choose(name, shape, quant, n_layers, counters, tied):
    # 1-D tensors (norms, biases; ggml counts a single row as one) and the MoE router stay
    # F32, as convert_hf_to_gguf.py writes them and llama-quantize keeps them
    if len(shape) < 2 or quant == "f32" or all(d == 1 for d in shape[:-1]):
        return T.F32, None
    if "ffn_gate_inp" in name or not name.endswith("weight"):  # biases too, as convert's
        return T.F32, None
    new = DEFAULT_TYPE[quant]
    if new in (T.F16, T.BF16):
        return new, None
    if not _quantizable(name):
        # llama-quantize copies these from its (usually F16) input unchanged
        return T.F16, None
    if quant in EXPERT_TYPE:
        return _fit(name, EXPERT_TYPE[quant] if len(shape) == 3 else new, shape[-1])
    cols = shape[-1]
    cat = _category(name)
    if cat == "output" or (tied and cat == "token_embd"):
        # llama.cpp: Q6_K unless the mix is Q8_0; a width Q6_K does not fit gets Q8_0 (below)
        if new != T.Q8_0:
            new = T.Q6_K
    elif cat in ("attn_v", "ffn_down") and quant in ("q4_k_m", "q5_k_m"):
        match = re.match(r"blk\.(\d+)\.", name)
        if match:
            i_layer = int(match.group(1))
        else:
            i_layer = counters.get("i_" + cat, 0) if counters is not None else 0
            if counters is not None:
                counters["i_" + cat] = i_layer + 1
        if _use_more_bits(i_layer, n_layers):
            new = T.Q6_K
    return _fit(name, new, cols)


def _fit(name, new, cols):
    """new, or llama.cpp's fallback where its blocks do not divide the rows."""
    block = GGML_QUANT_SIZES[new][0]
    if cols % block == 0:
        return new, None
    back = FALLBACK.get(new, T.F16)
    if cols % GGML_QUANT_SIZES[back][0]:
        back = T.F16
    return back, f"{name}: {cols} columns do not fit {new.name} blocks of {block}; {back.name}"


def _eight_experts(name, shape, quant, qtype, note):
    """llama.cpp's rule for 8-expert models (Mixtral 8x7B): attention's k and v in Q8_0 and,
    in the 4-bit K mix, its output in Q5_K; they cost little beside the experts."""
    cat, new = _category(name), None
    if cat in ("attn_k", "attn_v"):
        new = T.Q8_0
    elif cat == "attn_output" and quant == "q4_k_m":
        new = T.Q5_K
    if new is None or shape[-1] % GGML_QUANT_SIZES[new][0]:
        return qtype, note
    return new, None


# ---------------------------------------------------------------- quantization


def quantize(data: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """data (..., cols) float -> ggml's layout: (..., bytes per row) uint8, or F32/F16 floats."""
    data = np.ascontiguousarray(data, dtype=np.float32)
    if qtype == T.F32:
        return data
    if qtype == T.F16:
        return data.astype(np.float16)
    block, size = GGML_QUANT_SIZES[qtype]
    cols = data.shape[-1]
    if cols % block:
        raise ValueError(f"{cols} columns do not fit {qtype.name} blocks of {block}")
    if block > 1 and not np.isfinite(data).all():
        raise ValueError("cannot quantize NaN or infinite values")
    encode = _K_QUANTS.get(qtype)
    if encode is None:
        return gguf_quants.quantize(data, qtype)
    blocks = data.reshape(-1, QK_K)
    out = np.empty((blocks.shape[0], size), np.uint8)
    for start in range(0, blocks.shape[0], _CHUNK):
        out[start : start + _CHUNK] = encode(blocks[start : start + _CHUNK])
    return out.reshape(*data.shape[:-1], cols // block * size)


def _f16_bytes(a: np.ndarray) -> np.ndarray:
    return a.astype("<f2").view(np.uint8).reshape(-1, 2)


def _scale_min_search(x, w, nmax, rmin, rdelta, nstep):
    """make_qkx2_quants for rows of x: scale s and offset m >= 0 with x ~ s * L - m, L in
    0..nmax, minimizing sum(w * err^2). Starts from (max - min) / nmax and tries nstep + 1
    other scales; each round's levels give a weighted least-squares (scale, min), kept when
    better. The weighted error is expanded into sums so that no round needs a second pass."""
    mn0 = np.minimum(x.min(axis=1), 0.0)
    mx = x.max(axis=1)
    flat = mx <= mn0  # all values equal (and <= 0): scale 0, everything in the min
    sw = w.sum(axis=1, dtype=np.float64)
    wx = w * x
    sx = wx.sum(axis=1, dtype=np.float64)
    sxx = np.einsum("ij,ij->i", wx, x).astype(np.float64)
    buf = np.empty_like(x)
    wl = np.empty_like(x)

    def fit(iscale, mn):
        np.multiply(x, iscale[:, None], out=buf)
        np.subtract(buf, (mn * iscale)[:, None].astype(np.float32), out=buf)
        np.rint(buf, out=buf)
        np.clip(buf, 0, nmax, out=buf)
        np.multiply(w, buf, out=wl)
        sl = wl.sum(axis=1, dtype=np.float64)
        sl2 = np.einsum("ij,ij->i", wl, buf).astype(np.float64)
        sxl = np.einsum("ij,ij->i", wl, x).astype(np.float64)
        return sl, sl2, sxl

    def error(s, m, sl, sl2, sxl):
        return s * s * sl2 + m * m * sw + sxx + 2 * s * m * sl - 2 * s * sxl - 2 * m * sx

    mn = mn0.astype(np.float64)
    span = np.where(flat, 1.0, mx - mn)
    iscale = (nmax / span).astype(np.float32)
    scale = span / nmax
    best = error(scale, mn, *fit(iscale, mn))
    with np.errstate(divide="ignore", invalid="ignore"):
        for step in range(nstep + 1):
            iscale = ((rmin + rdelta * step + nmax) / span).astype(np.float32)
            sl, sl2, sxl = fit(iscale, mn)
            det = sw * sl2 - sl * sl
            s = (sw * sxl - sx * sl) / det
            m = (sl2 * sx - sl * sxl) / det
            pos = m > 0
            s = np.where(pos, sxl / sl2, s)
            m = np.where(pos, 0.0, m)
            err = error(s, m, sl, sl2, sxl)
            better = (det > 0) & (err < best)
            best = np.where(better, err, best)
            scale = np.where(better, s, scale)
            mn = np.where(better, m, mn)
            span = mx - mn
            span = np.where(flat | ~(span > 0), 1.0, span)
    scale = np.where(flat, 0.0, scale)
    mn = np.where(flat, mn0, mn)
    return scale, -mn


def _encode_q4_q5_k(x: np.ndarray, bits: int) -> np.ndarray:
    nb = x.shape[0]
    nmax = (1 << bits) - 1
    sub = x.reshape(nb * 8, 32)
    weights = np.sqrt(np.mean(sub * sub, axis=1))[:, None] + np.abs(sub)
    rmin, nstep = (-1.0, 20) if bits == 4 else (-0.5, 15)
    scales, mins = _scale_min_search(sub, weights, nmax, rmin, 0.1, nstep)
    scales, mins = scales.reshape(nb, 8), mins.reshape(nb, 8)
    max_scale = np.maximum(scales.max(axis=1), 0.0)
    max_min = np.maximum(mins.max(axis=1), 0.0)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, 63.0 / max_scale, 0.0)
        inv_min = np.where(max_min > 0, 63.0 / max_min, 0.0)
    ls = np.clip(np.rint(inv_scale[:, None] * scales), 0, 63).astype(np.uint8)
    lm = np.clip(np.rint(inv_min[:, None] * mins), 0, 63).astype(np.uint8)
    d = (max_scale / 63).astype(np.float16)
    dmin = (max_min / 63).astype(np.float16)
    # the levels again, against the scales as stored (6-bit, times fp16 d / dmin)
    dj = (d.astype(np.float32)[:, None] * ls)[..., None]
    mj = (dmin.astype(np.float32)[:, None] * lm)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint((x.reshape(nb, 8, 32) + mj) / dj)
    q = np.where(dj > 0, np.clip(q, 0, nmax), 0).astype(np.uint8)

    packed = np.empty((nb, 12), np.uint8)
    packed[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    packed[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    pairs = (q & 0xF).reshape(nb, 4, 2, 32)  # sub-blocks 2k and 2k+1 share 32 bytes
    qs = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(nb, 128)
    parts = [_f16_bytes(d), _f16_bytes(dmin), packed]
    if bits == 5:  # bit k of byte i: the fifth bit of value i of sub-block k
        high = (q >> 4).astype(np.uint8) << np.arange(8, dtype=np.uint8)[None, :, None]
        parts.append(np.bitwise_or.reduce(high, axis=1))
    parts.append(qs)
    return np.concatenate(parts, axis=1)


def _encode_q4_k(x: np.ndarray) -> np.ndarray:
    return _encode_q4_q5_k(x, 4)


def _encode_q5_k(x: np.ndarray) -> np.ndarray:
    return _encode_q4_q5_k(x, 5)


def _symmetric_scale_search(x, nmax):
    """make_qx_quants (rmse_type 1) for rows of x: scale s with x ~ s * l, l in -nmax..nmax-1,
    weights x^2. Tries 19 scales around nmax / max and keeps the best least-squares fit; the
    scale carries the sign of the largest magnitude, so that value gets level -nmax."""
    rows = np.arange(x.shape[0])
    vmax = x[rows, np.abs(x).argmax(axis=1)]
    zero = np.abs(vmax) < 1e-15
    vmax = np.where(zero, 1.0, vmax).astype(np.float32)
    w = x * x
    wx = w * x
    buf = np.empty_like(x)
    wl = np.empty_like(x)

    def fit(k):
        np.multiply(x, (-(nmax + 0.1 * k) / vmax)[:, None].astype(np.float32), out=buf)
        np.rint(buf, out=buf)
        np.clip(buf, -nmax, nmax - 1, out=buf)
        np.multiply(w, buf, out=wl)
        slx = np.einsum("ij,ij->i", wx, buf).astype(np.float64)
        sl2 = np.einsum("ij,ij->i", wl, buf).astype(np.float64)
        return slx, sl2

    with np.errstate(divide="ignore", invalid="ignore"):
        slx, sl2 = fit(0)
        scale = np.where(sl2 > 0, slx / sl2, 0.0)
        best = scale * slx
        for k in (*range(-9, 0), *range(1, 10)):
            slx, sl2 = fit(k)
            better = (sl2 > 0) & (slx * slx > best * sl2)
            scale = np.where(better, slx / sl2, scale)
            best = np.where(better, scale * slx, best)
    return np.where(zero, 0.0, scale)


def _encode_q6_k(x: np.ndarray) -> np.ndarray:
    nb = x.shape[0]
    scales = _symmetric_scale_search(x.reshape(nb * 16, 16), 32).reshape(nb, 16)
    max_scale = scales[np.arange(nb), np.abs(scales).argmax(axis=1)]
    zero = np.abs(max_scale) < 1e-15
    iscale = np.where(zero, 0.0, -128.0 / np.where(zero, 1.0, max_scale))
    d = np.where(zero, 0.0, 1.0 / np.where(zero, 1.0, iscale)).astype(np.float16)
    sc = np.minimum(127, np.rint(iscale[:, None] * scales)).astype(np.int8)
    dj = (d.astype(np.float32)[:, None] * sc)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint(x.reshape(nb, 16, 16) / dj)
    q = (np.where(dj != 0, np.clip(q, -32, 31), 0) + 32).astype(np.uint8)
    q[zero] = 0  # an all-zero block is all zero bytes, as in ggml
    # per half of 128 values: four quarters of 32; ql pairs quarters 0|2 and 1|3 as nibbles,
    # qh packs the quarters' top two bits at shifts 0, 2, 4, 6
    quarters = q.reshape(nb, 2, 4, 32)
    low = quarters & 0xF
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], 2)
    high = (quarters >> 4) << np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]
    qh = np.bitwise_or.reduce(high, axis=2)
    return np.concatenate(
        [ql.reshape(nb, 128), qh.reshape(nb, 64), sc.view(np.uint8), _f16_bytes(d)], axis=1
    )


_K_QUANTS = {T.Q4_K: _encode_q4_k, T.Q5_K: _encode_q5_k, T.Q6_K: _encode_q6_k}
