"""Byte-level data: a file, a folder, or the embedded default corpus (Python's own stdlib).

Training windows are drawn by a seeded torch.Generator whose state is saved in checkpoints;
validation uses fixed windows, so evaluating never moves the training stream.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

from .errors import DataError

DEFAULT_CORPUS = "embedded: Python standard library sources"


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    # Sorted relative paths make the order the same on every run of this Python.
    # Third-party packages differ from machine to machine; tests are mostly noise.
    skip = ("test", "site-packages", "dist-packages")
    files = sorted(root.glob("*.py")) + sorted(
        p
        for p in root.glob("*/**/*.py")
        if not any(word in p.relative_to(root).parts[0] for word in skip)
    )
    return files


def _folder_files(folder: Path, extensions: list[str]) -> list[Path]:
    exts = {e.lower() for e in extensions}
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in exts)


def _read_capped(files: list[Path], cap: int) -> bytes:
    parts, total = [], 0
    for path in files:
        try:
            chunk = path.read_bytes()
        except OSError as e:
            raise DataError(f"data: cannot read {path} ({e.strerror})") from None
        parts.append(chunk)
        total += len(chunk)
        if total >= cap:
            break
    return b"".join(parts)[:cap]


def load_bytes(data: str | None, extensions: list[str], cap: int) -> tuple[bytes, str]:
    """Return (raw bytes, a description of the source)."""
    if data is None:
        files = _stdlib_files()
        if not files:
            raise DataError("data: no --data given and the Python stdlib sources were not found")
        return _read_capped(files, cap), DEFAULT_CORPUS
    path = Path(data).expanduser()
    if path.is_file():
        return _read_capped([path], cap), str(path)
    if path.is_dir():
        files = _folder_files(path, extensions)
        if not files:
            raise DataError(f"data: folder {path} holds no files ending in {', '.join(extensions)}")
        return _read_capped(files, cap), f"{path} ({len(files)} files)"
    raise DataError(f"data: {path} is neither a file nor a folder")


class ByteData:
    """Train/validation split of a byte stream, and the sampler of training windows."""

    def __init__(self, raw: bytes, source: str, seq_len: int, val_fraction: float, seed: int):
        need = 2 * (seq_len + 1)
        if len(raw) < need * 2:
            raise DataError(
                f"data: {source} has {len(raw)} bytes; seq_len {seq_len} needs at least "
                f"{need * 2} (lower seq_len or add text)"
            )
        tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        n_val = max(int(len(tokens) * val_fraction), need)
        self.train = tokens[:-n_val]
        self.val = tokens[-n_val:]
        self.source = source
        self.seq_len = seq_len
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def train_tokens(self) -> int:
        return len(self.train)

    def _windows(self, stream: torch.Tensor, starts: torch.Tensor):
        offsets = torch.arange(self.seq_len + 1)
        chunk = stream[starts[:, None] + offsets].long()
        return chunk[:, :-1], chunk[:, 1:]

    def sample_starts(self, n: int) -> torch.Tensor:
        """Start offsets for one optimizer step's n sequences (drawn once, split later)."""
        high = len(self.train) - self.seq_len - 1
        return torch.randint(0, high + 1, (n,), generator=self.generator)

    def train_batch(self, starts: torch.Tensor):
        return self._windows(self.train, starts)

    def val_batches(self, n_windows: int, batch_size: int):
        """Fixed, evenly spaced validation windows, the same every evaluation, in chunks."""
        high = len(self.val) - self.seq_len - 1
        starts = torch.linspace(0, high, n_windows).long()
        for chunk in starts.split(batch_size):
            yield self._windows(self.val, chunk)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
