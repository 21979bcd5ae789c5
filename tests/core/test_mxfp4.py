"""MXFP4 dequantization at load (gpt-oss's experts), bit for bit against transformers'
convert_moe_packed_tensors, on tensors packed here by hand (transformers' own quantizer needs
its kernels hub); damaged block and scale tensors refused in one line."""

import pytest
import torch
from hf_models import mxfp4_pack

from core.weights import mxfp4
from core.weights.check import check_weight_files

pack = mxfp4_pack


@pytest.fixture(scope="module")
def reference():
    integration = pytest.importorskip("transformers.integrations.mxfp4")
    return integration.convert_moe_packed_tensors


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_is_transformers_bit_for_bit(reference, dtype):
    torch.manual_seed(0)
    x = torch.randn(3, 8, 64) * torch.logspace(-3, 3, 8)[None, :, None]  # experts, rows, cols
    blocks, scales = pack(x)
    got = mxfp4.dequantize(blocks, scales, dtype).transpose(1, 2)
    want = reference(blocks, scales, dtype=dtype)
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32  # -0.0 and 0.0 apart
    assert got.dtype == want.dtype and torch.equal(got.view(bits), want.view(bits))
    # the packer is right too: within e2m1's rounding of each block's scale
    err = (mxfp4.dequantize(blocks, scales) - x).abs()
    step = torch.exp2(scales.float() - mxfp4.BIAS).repeat_interleave(32, -1)
    assert bool((err <= step + 1e-12).all())
    # any bytes at all, the scales over their whole range
    raw = torch.randint(0, 256, (2, 4, 3, 16), dtype=torch.uint8)
    exps = torch.randint(0, mxfp4.MAX_SCALE + 1, (2, 4, 3), dtype=torch.uint8)
    got = mxfp4.Packed("w", raw, exps, "f")()
    assert torch.equal(got, reference(raw, exps, dtype=torch.float32))


def test_a_model_folder_reads_mxfp4_pairs_as_the_dequantized_tensor(tmp_path, reference):
    from safetensors.torch import save_file

    from core.weights.loader import read_weights

    torch.manual_seed(1)
    blocks, scales = pack(torch.randn(2, 6, 32))
    (tmp_path / "config.json").write_text("{}")
    save_file(
        {"m.gate_up_proj_blocks": blocks, "m.gate_up_proj_scales": scales, "m.b": torch.ones(2)},
        tmp_path / "model.safetensors",
    )
    state = read_weights(tmp_path)
    assert set(state) == {"m.gate_up_proj", "m.b"}
    assert state["m.gate_up_proj"].shape == (2, 32, 6)
    want = reference(blocks, scales, dtype=torch.float32)
    assert torch.equal(mxfp4.materialize(state["m.gate_up_proj"]), want)


def damaged(blocks, scales):
    return {"x.down_proj_blocks": blocks, "x.down_proj_scales": scales}


@pytest.mark.parametrize(
    ("state", "says"),
    [
        (damaged(torch.zeros(2, 3, 16), torch.zeros(2, 3, dtype=torch.uint8)), "not uint8"),
        (
            damaged(torch.zeros(2, 3, 8, dtype=torch.uint8), torch.zeros(2, 3, dtype=torch.uint8)),
            "end in 16 bytes",
        ),
        (
            damaged(torch.zeros(2, 3, 16, dtype=torch.uint8), torch.zeros(2, 4, dtype=torch.uint8)),
            "needs [2, 3]",
        ),
        (
            damaged(
                torch.zeros(2, 3, 16, dtype=torch.uint8), torch.full((2, 3), 255, dtype=torch.uint8)
            ),
            "exponent 128",
        ),
        ({"x.down_proj_blocks": torch.zeros(2, 3, 16, dtype=torch.uint8)}, "no x.down_proj_scales"),
    ],
)
def test_a_damaged_block_or_scale_tensor_is_one_line(state, says):
    with pytest.raises(mxfp4.MXFP4Error) as e:
        mxfp4.unpack(state, "shard-1.safetensors")
    message = str(e.value)
    assert says in message and "shard-1.safetensors" in message and "x.down_proj" in message
    assert "\n" not in message


def test_the_check_before_loading_reads_mxfp4_headers(tmp_path, monkeypatch):
    """check_weight_files takes a pair as the tensor it makes, and refuses a damaged pair from
    the header alone."""
    from safetensors.torch import save_file

    from core.weights import families

    rows = [("w", ["m.gate_up_proj"], False)]
    monkeypatch.setattr(families, "table", lambda family, c: rows)
    monkeypatch.setattr(
        "core.weights.check.expected_shapes",
        lambda family, c, found=None: {"m.gate_up_proj": (2, 32, 6)},
    )
    blocks, scales = pack(torch.randn(2, 6, 32))
    path = tmp_path / "model.safetensors"
    save_file({"m.gate_up_proj_blocks": blocks, "m.gate_up_proj_scales": scales}, path)
    check_weight_files(tmp_path, "llama", None, [path])
    short = scales[:, :3].clone()
    save_file({"m.gate_up_proj_blocks": blocks, "m.gate_up_proj_scales": short}, path)
    with pytest.raises(mxfp4.MXFP4Error, match="model.safetensors: tensor m.gate_up_proj_scales"):
        check_weight_files(tmp_path, "llama", None, [path])
