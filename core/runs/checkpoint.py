"""Checkpoints that cannot be half-written and cannot run code when loaded."""

from __future__ import annotations

import copy as copy_module
import os
import pickle
import random
import shutil
import struct
import threading
import uuid
import warnings
import zlib
from pathlib import Path

import numpy as np
import torch

from core.errors import CheckpointError
from core.platform.atomic import atomic_write, fsync_dir

FORMAT_VERSION = 1
MODEL_KEYS = {"step", "config", "model"}  # what a reader of a run's model relies on


def tensor_checksum(obj, crc: int = 0) -> int:
    """CRC32 over every tensor's bytes, in order. Bytes overwritten inside tensor data do not
    stop torch.load, so a checkpoint carries this to prove its weights are the ones saved."""
    if isinstance(obj, torch.Tensor):
        flat = obj.detach().reshape(-1).contiguous().cpu()
        return zlib.crc32(flat.view(torch.uint8).numpy(), crc)
    if isinstance(obj, dict):
        for value in obj.values():
            crc = tensor_checksum(value, crc)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            crc = tensor_checksum(value, crc)
    return crc


def save(state: dict, path: Path) -> None:
    state = {**state, "checksum": tensor_checksum(state)}
    atomic_write(Path(path), lambda f: torch.save(state, f))


def link(src: Path, dst: Path) -> None:
    """Make dst the same file as src: a hard link (no second copy on disk) where the file
    system allows, else an atomic copy. Either way dst is whole at every instant."""
    src, dst = Path(src), Path(dst)
    tmp = dst.with_name(f".{dst.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        os.link(src, tmp)
    except OSError:  # FAT/exFAT, some network shares: no hard links
        copy(src, dst)
        return
    try:
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(dst.parent)


def snapshot(obj):
    """A copy of a state on the CPU that later training steps cannot change: taken on the
    training thread, so the background writer saves exactly this step."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: snapshot(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [snapshot(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(snapshot(v) for v in obj)
    return copy_module.deepcopy(obj)


class BackgroundWriter:
    """Runs one write at a time off the training thread. A new write first waits for the
    previous one; an error in a write is raised on the training thread at the next wait."""

    def __init__(self):
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, write) -> None:
        self.wait()
        self._thread = threading.Thread(target=self._run, args=(write,), name="checkpoint")
        self._thread.start()

    def _run(self, write) -> None:
        try:
            write()
        except BaseException as e:  # handed to the training thread
            self._error = e

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def copy(src: Path, dst: Path) -> None:
    """Atomic copy, so best.pt and step files are never half-written either."""

    def write(f):
        with open(src, "rb") as s:
            shutil.copyfileobj(s, f, 1 << 20)

    atomic_write(Path(dst), write)


def load(path: Path, mmap: bool = False) -> dict:
    """Load with weights_only=True: a file that needs code to unpickle is refused. mmap: map
    the file instead of reading it (only what is touched is read)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint: {path} not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        if "global" in str(e).lower():  # the weights-only unpickler met a class or function
            raise CheckpointError(
                f"checkpoint: {path} contains objects that need code to load; refused "
                "(TrainDeck checkpoints hold only tensors and plain data)"
            ) from None
        raise CheckpointError(f"checkpoint: {path} is damaged or not a checkpoint") from None
    except (RuntimeError, EOFError, OSError, ValueError, IndexError, KeyError, struct.error) as e:
        # what torch's zip reader and weights-only unpickler raise on junk or a cut file
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"checkpoint: {path} is damaged or not a checkpoint ({first})"
        ) from None
    if not isinstance(state, dict) or "format_version" not in state:
        raise CheckpointError(f"checkpoint: {path} is not a TrainDeck checkpoint")
    saved_sum = state.pop("checksum", None)  # checkpoints from before it have none
    if saved_sum is not None and tensor_checksum(state) != saved_sum:
        raise CheckpointError(f"checkpoint: {path} is damaged (its tensors fail the checksum)")
    if state["format_version"] > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint: {path} has format {state['format_version']}; this TrainDeck reads "
            f"up to {FORMAT_VERSION} (update TrainDeck)"
        )
    return state


SHARDS_DIR = "shards"  # inside checkpoints/: one folder of Distributed Checkpoint files a save


def shards_of(path: Path, state: dict) -> Path | None:
    """The folder of a sharded checkpoint's model and optimizer (FSDP2, `--shard`): its
    file names the folder beside it; None for a checkpoint that holds its model itself."""
    name = state.get("shards")
    return Path(path).parent / name if name else None


def read_shards(folder: Path, part: str = "model") -> dict[str, torch.Tensor]:
    """One part ("model" or "optimizer") of a sharded checkpoint, whole, in one process: the
    tensors every rank wrote, joined, as the single-file checkpoint holds them."""
    import torch.distributed.checkpoint as dcp

    folder = Path(folder)
    if not (folder / ".metadata").is_file():
        raise CheckpointError(f"checkpoint: {folder} is missing or not whole (no .metadata)")
    meta = dcp.FileSystemReader(folder).read_metadata()
    prefix = part + "."
    out = {}
    for key, item in meta.state_dict_metadata.items():
        if key.startswith(prefix) and hasattr(item, "size"):  # tensors; not plain values
            out[key[len(prefix) :]] = torch.empty(item.size, dtype=item.properties.dtype)
    with warnings.catch_warnings():  # "assuming ... a single process": as meant
        warnings.simplefilter("ignore", UserWarning)
        dcp.load({part: out}, checkpoint_id=folder, no_dist=True)
    return out


def load_model_state(path: Path, mmap: bool = False) -> dict:
    """load, and refuse in one line a checkpoint without a model, its config and step. A
    sharded checkpoint's model is read whole from its shards."""
    state = load(path, mmap)
    if (shards := shards_of(path, state)) is not None:
        state["model"] = read_shards(shards)
    if not state.keys() >= MODEL_KEYS or not isinstance(state["config"], dict):
        raise CheckpointError(f"checkpoint: {path} is not a TrainDeck checkpoint (no model)")
    return state


def rng_state() -> dict:
    """Every RNG training touches, as plain data that weights_only loading accepts."""
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": [version, list(internal), gauss],
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def step_rng_state() -> dict:
    """The RNG a training step draws from (dropout): torch's, on the CPU and CUDA. Cheap
    enough to take every step, so an out-of-memory retry redraws the same dropout masks."""
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_step_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": "MT19937",
            "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
            "has_gauss": n["has_gauss"],
            "gauss": n["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
