"""A model folder's weight files checked against its config before anything is loaded or
prepared: every shard an index names is there and holds what the index says, every
safetensors header reads and no tensor ends past the end of its file (a cut download), and each
tensor the family's table needs is present with the shape and a float dtype the config implies.
One line names the file and the tensor."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from core.errors import ConfigError
from core.weights import families, mxfp4

FLOAT_DTYPES = ("F32", "F16", "BF16", "F64", "MXFP4")  # MXFP4: a *_blocks/*_scales pair


class WeightFileError(ConfigError):
    pass


def read_header(path: Path) -> dict:
    """A .safetensors file's header, checked against the file's length."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        n = int.from_bytes(raw, "little") if len(raw) == 8 else -1
        if n < 2 or 8 + n > size:
            raise WeightFileError(
                f"init_from: {path} is damaged: shorter than its own header", field="init_from"
            )
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, ValueError):
            raise WeightFileError(
                f"init_from: {path} is damaged: its header is not JSON", field="init_from"
            ) from None
    data = size - 8 - n
    for name, info in header.items():
        if name != "__metadata__" and info["data_offsets"][1] > data:
            raise WeightFileError(
                f"init_from: {path} is cut short: tensor {name} ends past the end of the file "
                "(download it again)",
                field="init_from",
            )
    return header


def expected_shapes(family: str, c, names=None) -> dict[str, tuple]:
    """Hugging Face tensor name -> the shape this config's model needs from the files
    (names: the files' tensor names, which pick an MoE family's layout)."""
    from core.models.model import GPT

    with torch.device("meta"):
        state = GPT(c).state_dict()
    out = {}
    for ours, hf_names, transposed in families.table(family, c, names):
        if ours not in state:
            continue
        tensor = state[ours]
        convert = families.get(family).convert
        if convert is not None and families.is_expert(ours):  # the family's own layout
            tensor = convert(ours, tensor, True)
        parts = families.split_rows(ours, c, tensor, len(hf_names))
        for name, part in zip(hf_names, parts, strict=True):
            out[name] = tuple(reversed(part.shape)) if transposed else tuple(part.shape)
    return out


def _headers(folder: Path, files: list[Path]) -> dict[str, tuple[Path, dict]]:
    """Tensor name -> (file, header entry) over every safetensors file; an index's names
    must be in the shard it names."""
    found = {}
    for path in files:
        for name, info in read_header(path).items():
            if name != "__metadata__":
                found[name] = (path, info)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        for name, shard in json.loads(index.read_text(encoding="utf-8"))["weight_map"].items():
            if found.get(name, (None,))[0] != folder / shard:
                raise WeightFileError(
                    f"init_from: {folder / shard} lacks tensor {name}, which "
                    f"{index.name} puts there",
                    field="init_from",
                )
    return found


def check_weight_files(folder: Path, family: str, c, files: list[Path]) -> None:
    """Refuse, in one line, weight files that cannot give this config's model."""
    if any(f.suffix != ".safetensors" for f in files):
        return  # pytorch_model.bin: read (and checked) only when loaded
    headers = _headers(folder, files)
    headers.update(mxfp4.header_entries(headers))
    found = families.normalise_hf(list(headers), family)
    for name, shape in expected_shapes(family, c, found).items():
        if name not in found:
            raise WeightFileError(
                f"init_from: the weight files in {folder} lack tensor {name}", field="init_from"
            )
        path, info = headers[found[name]]
        if info["dtype"] not in FLOAT_DTYPES:
            raise WeightFileError(
                f"init_from: {path}: tensor {name} is {info['dtype']}, not "
                "a float type (F32, F16, BF16)",
                field="init_from",
            )
        if tuple(info["shape"]) != shape:
            raise WeightFileError(
                f"init_from: {path}: tensor {name} has shape {list(info['shape'])}, but "
                f"config.json gives {list(shape)}",
                field="init_from",
            )
