"""A finished run as the start of another (supervised fine-tuning, then DPO): its model is
written once as a Hugging Face folder, which init_from then loads like any pretrained model.
A LoRA run's adapters are merged into its base's original weights there (never into a 4-bit
copy); a 4-bit base is quantized again from that folder when the next run loads it, so
disabling the next run's adapters gives exactly this model."""

from __future__ import annotations

import hashlib
from pathlib import Path

from core.data.prepare import default_cache_dir
from core.use.export import export
from core.weights.loader import checkpoint_path, is_model_folder


def is_run(target: str | Path | None) -> bool:
    """A run folder or a checkpoint file (not a model folder or a hub id)."""
    if not target:
        return False
    path = Path(target).expanduser()
    if path.is_file():
        return path.suffix == ".pt"
    return path.is_dir() and (path / "checkpoints").is_dir() and not is_model_folder(path)


def start_folder(target: str | Path, cache: str | Path | None = None, log=print) -> Path:
    """The model folder of a run's best checkpoint, written on first use and reused while
    the checkpoint is unchanged."""
    ckpt = checkpoint_path(Path(target).expanduser(), "best")
    st = ckpt.stat()
    key = f"{ckpt.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    digest = hashlib.blake2b(key.encode(), digest_size=8).hexdigest()
    run_name = ckpt.parent.parent.name if ckpt.parent.name == "checkpoints" else ckpt.stem
    root = Path(cache) if cache else default_cache_dir()
    folder = root / "start-models" / f"{run_name}-{ckpt.stem}-{digest}"
    if (folder / "config.json").is_file():
        log(f"init_from: {target} ({ckpt.name}) as the model folder {folder}")
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    log(f"init_from: writing {target} ({ckpt.name}) as a model folder in {folder}")
    return export(ckpt, "hf", folder, log=lambda line: None)
