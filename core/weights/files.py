"""A model folder's weight files read as tensors (safetensors memory-mapped, .bin/.pt as plain
data), and its JSON: what the loader and a composite's tower (core.weights.vision) read."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from core.errors import ConfigError
from core.weights import mxfp4


class ModelSourceError(ConfigError):
    pass


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelSourceError(
            f"init_from: {path} is not readable JSON ({e})", field="init_from"
        ) from None


def weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(read_json(index).get("weight_map", {}).values()))
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise ModelSourceError(
                f"init_from: {folder} lacks the shard {missing[0]}", field="init_from"
            )
        return [folder / s for s in shards]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    if (folder / "pytorch_model.bin").is_file():
        return [folder / "pytorch_model.bin"]
    raise ModelSourceError(
        f"init_from: {folder} holds no weights (model.safetensors, a sharded "
        "model.safetensors.index.json, or pytorch_model.bin)",
        field="init_from",
    )


SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def map_safetensors(path: Path, maps: list | None = None) -> dict[str, torch.Tensor]:
    """A .safetensors file's tensors as views of a copy-on-write memory map of it: nothing is
    read until a tensor is used, and what is read stays file pages the system can drop.
    maps: collects the map, for drop_pages once the model holds what it needs."""
    import numpy as np

    damaged = ModelSourceError(
        f"init_from: {path} is damaged or not a safetensors file", field="init_from"
    )
    total = path.stat().st_size
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if total < 8 or size > total - 8:  # never read a length the file does not hold
            raise damaged
        try:
            header = json.loads(f.read(size))
        except ValueError:  # not JSON, not UTF-8
            raise damaged from None
    if not isinstance(header, dict) or not header:
        raise damaged
    mapped = np.memmap(path, dtype=np.uint8, mode="c")
    if maps is not None:
        maps.append(mapped)
    raw = torch.from_numpy(mapped)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:  # a header that names what the file does not hold
            begin, end = (8 + size + x for x in info["data_offsets"])
            dtype = SAFETENSORS_DTYPES[info["dtype"]]
            out[name] = raw[begin:end].view(dtype).reshape(info["shape"])
        except (KeyError, TypeError, ValueError, RuntimeError):
            raise damaged from None
    return out


def drop_pages(maps: list) -> None:
    """Let go of the file pages that loading read (joined, converted or skipped tensors):
    they would otherwise count in the process's memory for the whole run. Tensors still
    viewing the files read their pages again when used. Unwritten pages only: call before
    training changes a weight."""
    import mmap

    if not hasattr(mmap, "MADV_DONTNEED"):  # Windows: the system trims on its own
        return
    for m in maps:
        region = getattr(m, "_mmap", None)  # numpy's own map object (a private name)
        if region is not None and len(m):
            region.madvise(mmap.MADV_DONTNEED)


def read_weights(folder: Path, mapped: bool = False, maps: list | None = None) -> dict:
    """Every tensor of a model folder's weight files, in the files' own dtype; .safetensors
    are memory-mapped (read only when used), .bin/.pt ones too when mapped (exports of
    models larger than memory). maps: see map_safetensors."""
    state = {}
    for f in weight_files(folder):
        if f.suffix == ".safetensors":  # MXFP4 pairs: dequantized when a weight is made
            state.update(mxfp4.unpack(map_safetensors(f, maps), f))
            continue
        try:  # data only: a pickle that needs code to load is refused
            state.update(torch.load(f, map_location="cpu", weights_only=True, mmap=mapped))
        except Exception as e:
            raise ModelSourceError(
                f"init_from: {f} cannot be read as plain weights ({type(e).__name__}); "
                "convert it to model.safetensors",
                field="init_from",
            ) from None
    return state
