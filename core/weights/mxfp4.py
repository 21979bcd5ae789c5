"""MXFP4 weights, as gpt-oss checkpoints ship their experts: NAME_blocks (uint8, two FP4 e2m1
values a byte, the low nibble first) and NAME_scales (uint8 exponents with bias 127), one scale
for each block of 32 values along the last dimension. They are dequantized at load, a tensor at
a time and an expert at a time, exactly (bit for bit) as transformers'
integrations.mxfp4.convert_moe_packed_tensors does; what comes out is the tensor transformers
holds under NAME (the last two dimensions swapped), so a family's table reads an MXFP4
checkpoint and a dequantized one alike."""

from __future__ import annotations

import torch

from core.errors import ConfigError

FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # e2m1; the high bit is the sign
BLOCK_BYTES = 16  # 32 values a scale
BIAS = 127
# The largest exponent at which every e2m1 value (6 at most) stays finite in fp32 and bf16:
# 6 * 2**125 < 2**128. Above it (and 255, E8M0's NaN) a scale is damaged.
MAX_SCALE = BIAS + 125
BLOCKS, SCALES = "_blocks", "_scales"


class MXFP4Error(ConfigError):
    pass


def _pairs(dtype: torch.dtype) -> torch.Tensor:
    """Each byte's two values (low nibble first), (256, 2): one gather a byte."""
    values = torch.tensor(FP4_VALUES + tuple(-v for v in FP4_VALUES), dtype=dtype)
    byte = torch.arange(256)
    return torch.stack((values[byte & 0x0F], values[byte >> 4]), dim=-1)


def check_shapes(name: str, blocks: tuple, blocks_dtype, scales: tuple, scales_dtype, source):
    """One line naming the tensor and file where a block or scale tensor cannot be MXFP4
    (shapes and dtypes: what a safetensors header tells)."""
    where = f"init_from: {source}: tensor {name}"
    for suffix, dtype in ((BLOCKS, blocks_dtype), (SCALES, scales_dtype)):
        if dtype not in (torch.uint8, "U8"):
            raise MXFP4Error(f"{where}{suffix} is {dtype}, not uint8 (U8) as MXFP4 stores it")
    if len(blocks) < 2 or blocks[-1] != BLOCK_BYTES:
        raise MXFP4Error(
            f"{where}{BLOCKS} has shape {list(blocks)}; MXFP4 blocks end in "
            f"{BLOCK_BYTES} bytes (32 values)"
        )
    if tuple(blocks[:-1]) != tuple(scales):
        raise MXFP4Error(
            f"{where}{SCALES} has shape {list(scales)}, but {name}{BLOCKS} "
            f"{list(blocks)} needs {list(blocks[:-1])}"
        )


def check(name: str, blocks: torch.Tensor, scales: torch.Tensor, source) -> None:
    """check_shapes, and every scale exponent in range (this reads the scales: 1/16 of the
    blocks' bytes)."""
    check_shapes(name, blocks.shape, blocks.dtype, scales.shape, scales.dtype, source)
    top = int(scales.max()) if scales.numel() else 0
    if top > MAX_SCALE:
        raise MXFP4Error(
            f"init_from: {source}: tensor {name}{SCALES} holds the exponent {top - BIAS} "
            f"(byte {top}); MXFP4 scales here go up to {MAX_SCALE - BIAS} (byte {MAX_SCALE}), "
            "beyond which the weights are not finite"
        )


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """blocks (*prefix, G, 16) and scales (*prefix, G) -> (*prefix, G * 32) in dtype, in the
    stored layout (rows as stored); one leading index (an expert) at a time, so the
    temporaries stay one expert's size."""
    *prefix, groups, width = blocks.shape
    pairs = _pairs(dtype)
    out = torch.empty(*prefix, groups, 2 * width, dtype=dtype)
    flat_b = blocks.reshape(-1, groups, width)
    flat_s = scales.reshape(-1, groups, 1)
    flat_o = out.view(-1, groups, 2 * width)
    for i in range(flat_b.shape[0]):
        o = flat_o[i]
        o.copy_(pairs[flat_b[i].to(torch.int64)].view(groups, 2 * width))
        # times 2**(scale - 127), made once a block: exact, as ldexp over every value is
        o.mul_(torch.ldexp(torch.ones(groups, 1, dtype=dtype), flat_s[i].to(torch.int32) - BIAS))
    return out.reshape(*prefix, groups * 2 * width)


class Packed:
    """An MXFP4 tensor of a weight file, dequantized when called: (E, cols, rows) in fp32,
    transformers' layout of NAME."""

    def __init__(self, name: str, blocks: torch.Tensor, scales: torch.Tensor, source):
        check(name, blocks, scales, source)
        self.name, self.blocks, self.scales = name, blocks, scales
        *prefix, groups, width = blocks.shape
        rows = (*prefix, groups * 2 * width)
        self.shape = (*rows[:-2], rows[-1], rows[-2]) if len(rows) >= 2 else rows

    def __call__(self) -> torch.Tensor:
        """A view with the last two dimensions swapped (no copy: the family's convert turns
        it back into its own layout in the one copy it makes)."""
        out = dequantize(self.blocks, self.scales)
        return out.transpose(-1, -2) if out.dim() >= 2 else out


def unpack(state: dict, source) -> dict:
    """A weight file's tensors with each NAME_blocks / NAME_scales pair replaced by a Packed
    under NAME (dequantized when called); a pair with one half missing is refused."""
    out = dict(state)
    for key in [k for k in state if k.endswith((BLOCKS, SCALES))]:
        name = key[: -len(BLOCKS)]
        partner = name + (SCALES if key.endswith(BLOCKS) else BLOCKS)
        if partner not in state:
            raise MXFP4Error(f"init_from: {source}: tensor {key} has no {partner} beside it")
        if key.endswith(BLOCKS):
            out[name] = Packed(name, state[key], state[partner], source)
        out.pop(key)
    return out


def header_entries(headers: dict) -> dict:
    """For a check before loading: {NAME: (file, header entry)} of each NAME_blocks /
    NAME_scales pair in headers ({tensor: (file, safetensors header entry)}), the entry
    giving NAME's dequantized shape and the dtype "MXFP4"; a damaged pair is refused."""
    out = {}
    for key, (path, info) in headers.items():
        if not key.endswith((BLOCKS, SCALES)):
            continue
        name = key[: -len(BLOCKS)]
        partner = name + (SCALES if key.endswith(BLOCKS) else BLOCKS)
        if partner not in headers:
            raise MXFP4Error(f"init_from: {path}: tensor {key} has no {partner} beside it")
        if key.endswith(SCALES):
            continue
        scales = headers[partner][1]
        check_shapes(name, info["shape"], info["dtype"], scales["shape"], scales["dtype"], path)
        *prefix, groups, width = info["shape"]
        rows = [*prefix, groups * 2 * width]
        shape = [*rows[:-2], rows[-1], rows[-2]] if len(rows) >= 2 else rows
        out[name] = (path, {"dtype": "MXFP4", "shape": shape})
    return out


def materialize(value):
    """A file tensor, or a Packed one dequantized."""
    return value() if isinstance(value, Packed) else value
