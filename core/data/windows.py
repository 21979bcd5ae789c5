"""Training windows from a prepared cache entry: the token file opened with np.memmap (its
train and validation split), each window a plain positioned read (pread), drawn by a seeded
torch.Generator whose state is saved in checkpoints; validation uses fixed windows at the end
of the token file, so evaluating never moves the training stream."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from core.data import tables
from core.data.chatdata import START
from core.data.images import ImageStore
from core.data.sources import find_sources
from core.data.tokenizer import Tokenizer
from core.errors import DataError


def evenly_spaced(high: int, n: int) -> torch.Tensor:
    """n integers from 0 to high inclusive, evenly spread, in exact int64 arithmetic: a float32
    linspace rounds past 2^24 (a start beyond the end of the held-out tokens)."""
    if n <= 1:
        return torch.zeros(max(0, n), dtype=torch.int64)
    return torch.arange(n, dtype=torch.int64) * high // (n - 1)


class _WindowReader:
    """Reads token windows with plain file reads. A memory map would do, but on kernels that
    cache files in large folios each touched window maps megabytes of the file into the
    process (measured: +300 MB RSS for 800 windows of a 300 MB file; file reads: +0.1 MB)."""

    def __init__(self, path: Path, dtype):
        self.file = open(path, "rb")  # noqa: SIM115 (open for the data's lifetime)
        self.dtype = np.dtype(dtype)
        self.lock = threading.Lock()

    def read(self, start: int, n: int) -> np.ndarray:
        size, offset = n * self.dtype.itemsize, start * self.dtype.itemsize
        if hasattr(os, "pread"):
            raw = os.pread(self.file.fileno(), size, offset)
        else:  # Windows: no pread; seek and read under a lock
            with self.lock:
                self.file.seek(offset)
                raw = self.file.read(size)
        return np.frombuffer(raw, dtype=self.dtype)


class Rows(tuple):
    """A batch (inputs, targets, weights, segments) with its rows' images' pixel values
    (None: no images), which the model's forward takes as images=."""

    def __new__(cls, parts, images=None):
        out = super().__new__(cls, parts)
        out.images = images
        return out


class TokenData:
    """The token file of a cache entry: train/validation split and sampler. Text is one
    stream that windows start anywhere in; chat data is packed rows (manifest "row") with a
    weight a token, and a window is one whole row."""

    def __init__(self, folder: Path, manifest: dict, seq_len: int, seed: int):
        self.folder = Path(folder)
        self.manifest = manifest
        self.tokenizer = Tokenizer.load(
            self.folder / "tokenizer.json", manifest.get("tokenizer_meta")
        )
        self.source = manifest["source"]
        self.seq_len = seq_len
        self.row = manifest.get("row")  # None: plain text
        if self.row is not None and self.row != seq_len + 1:
            raise DataError(f"data: {self.folder} was packed for seq_len {self.row - 1}")
        n_train = manifest["train_tokens"]
        need = self.row or seq_len + 2
        if n_train < need or manifest["val_tokens"] < need:
            raise DataError(
                f"data: {self.source} gives {n_train} training and {manifest['val_tokens']} "
                f"validation tokens; seq_len {seq_len} needs at least {need} of each "
                "(lower seq_len, raise val_fraction or add text)"
            )
        # The memory map serves whole-file access; training windows use plain reads.
        tokens = np.memmap(self.folder / "tokens.bin", dtype=manifest["dtype"], mode="r")
        self._reader = _WindowReader(self.folder / "tokens.bin", manifest["dtype"])
        self._mask = _WindowReader(self.folder / "mask.bin", np.uint8) if self.row else None
        self.train = tokens[:n_train]
        self.val = tokens[n_train:]
        self.generator = torch.Generator().manual_seed(seed)
        # chat examples with images: each row's processed pixels (core.data.images)
        self.images = ImageStore(self.folder, manifest) if manifest.get("images") else None

    @property
    def is_chat(self) -> bool:
        return self.row is not None

    @property
    def train_tokens(self) -> int:
        return len(self.train)

    @property
    def val_bytes_per_token(self) -> float:
        """Bytes per scored token of the held-out data (chat: of the answers)."""
        m = self.manifest
        return m["val_bytes"] / max(1, m.get("val_target_tokens", m["val_tokens"]))

    def _windows(self, base: int, starts: torch.Tensor):
        """(inputs, targets, target weights or None, segments or None) of the windows at
        starts; chat: segments number the packed examples, so each attends only to itself."""
        n = self.seq_len + 1
        rows = [self._reader.read(base + int(s), n) for s in starts]
        chunk = torch.from_numpy(np.stack(rows).astype(np.int64))
        if self._mask is None:
            return chunk[:, :-1], chunk[:, 1:], None, None
        raw = np.stack([self._mask.read(base + int(s), n) for s in starts])
        mask = torch.from_numpy((raw[:, 1:] & 1).astype(np.float32))
        segments = torch.from_numpy(np.cumsum((raw[:, :-1] & START) > 0, axis=1))
        pixels = None
        if self.images is not None:  # the rows' images, in the order their tokens come
            pixels = self.images.batch([(base + int(s)) // self.row for s in starts])
        return Rows((chunk[:, :-1], chunk[:, 1:], mask, segments), pixels)

    @property
    def is_pairs(self) -> bool:
        """Preference pairs: two rows a pair (chosen, rejected), a window is one pair."""
        return self.manifest.get("data_format") == "preference"

    def pair_batch(self, starts: torch.Tensor, val: bool = False):
        """(inputs, targets, weights, pair ids) of the pairs at starts: the chosen rows
        first, then the rejected ones in the same order; pair ids count from the file's
        first pair (training, then held-out), for cached reference log-probs. Rows: with
        the pixel values of the rows' images (a prompt's images, for each of its rows)."""
        base = len(self.train) if val else 0
        rows = self._windows(base, torch.cat([starts, starts + self.row]))
        x, y, mask, _ = rows
        ids = torch.div(base + starts, 2 * self.row, rounding_mode="floor")
        return Rows((x, y, mask, ids), getattr(rows, "images", None))  # a prompt's images too

    def val_pair_starts(self, n_pairs: int | None = None) -> torch.Tensor:
        """Every held-out pair (at most n_pairs, evenly spread), the same every evaluation."""
        pairs = len(self.val) // (2 * self.row)
        n = pairs if n_pairs is None else min(n_pairs, pairs)
        return evenly_spaced(pairs - 1, n).unique() * 2 * self.row

    def sample_starts(self, n: int) -> torch.Tensor:
        """Start offsets for one optimizer step's n sequences (drawn once, split later)."""
        if self.is_pairs:
            pairs = len(self.train) // (2 * self.row)
            return torch.randint(0, pairs, (n,), generator=self.generator) * 2 * self.row
        if self.row is not None:
            rows = len(self.train) // self.row
            return torch.randint(0, rows, (n,), generator=self.generator) * self.row
        high = len(self.train) - self.seq_len - 1
        return torch.randint(0, high + 1, (n,), generator=self.generator)

    def train_batch(self, starts: torch.Tensor):
        return self._windows(0, starts)

    def val_batches(self, n_windows: int, batch_size: int):
        """Fixed, evenly spaced validation windows, the same every evaluation, in chunks
        (chat: at most every held-out row once)."""
        if self.row is not None:
            rows = len(self.val) // self.row
            starts = evenly_spaced(rows - 1, min(n_windows, rows)).unique()
            starts = starts * self.row
        else:
            high = len(self.val) - self.seq_len - 1
            starts = evenly_spaced(high, n_windows)
        for chunk in starts.split(batch_size):
            yield self._windows(len(self.train), chunk)

    def prompt(self, n: int = 16) -> torch.Tensor:
        """The start of the held-out data; for chat, a held-out question up to where its
        answer begins, so samples show the model answering."""
        if self.row is not None:
            weights = self._mask.read(len(self.train), self.row) & 1
            first = int(np.argmax(weights > 0)) if weights.any() else n
            n = max(1, first)
        return torch.from_numpy(self._reader.read(len(self.train), n).astype(np.int64))

    def prompt_images(self):
        """The pixel values of prompt()'s images (None: none): the first held-out row's."""
        if self.images is None:
            return None
        return self.images.batch([len(self.train) // self.row])

    def prompt_image_names(self) -> list[str]:
        """The files of prompt()'s images (empty: none)."""
        if self.images is None:
            return []
        return self.images.row_names(len(self.train) // self.row)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])

    def summary(self) -> dict:
        """data.json: what this run trains on."""
        m = self.manifest
        return {
            "source": m["source"],
            "source_bytes": m["source_bytes"],
            "total_bytes": m["total_bytes"],
            "files": len(m["files"]),
            "empty_files": m["empty_files"],
            "train_tokens": m["train_tokens"],
            "val_tokens": m["val_tokens"],
            "train_bytes": m["train_bytes"],
            "val_bytes": m["val_bytes"],
            "tokenizer": m["tokenizer"],
            "vocab_size": m["vocab_size"],
            "bytes_per_token": round(
                m["source_bytes"] / max(1, m["train_tokens"] + m["val_tokens"]), 4
            ),
            "fingerprint": m["fingerprint"],
            "cache": str(self.folder),
            **(
                {"data_format": m.get("data_format", "chat"), "examples": m["examples"]}
                if self.is_chat
                else {}
            ),
        }


EVAL_TEXT_BYTES = 1 << 20  # a second validation set reads at most this much text


@dataclass
class TextWindows:
    """Fixed windows of a text for scoring (the second validation set): inputs, targets, and
    the text's bytes per token, for bits per byte."""

    source: str
    x: torch.Tensor  # (windows, seq_len) token ids
    y: torch.Tensor  # the next tokens
    bytes_per_token: float


TEXT_EXTENSIONS = (".txt", ".md", ".py")


def text_sources(data: str):
    """A second validation set's files (a file, a folder, or 'embedded'); refused in one line
    naming eval_data when there is nothing to read. Nothing is read yet."""
    try:
        return find_sources(None if data == "embedded" else data, list(TEXT_EXTENSIONS), None)
    except DataError as e:  # named after this field, not --data
        raise DataError("eval_data:" + str(e).removeprefix("data:")) from None


def check_eval_data(data: str, seq_len: int) -> None:
    """The cheap facts of a second validation set, before any data is prepared: it exists,
    and a plain text has at least one window's worth of bytes (a token is at least a byte;
    the tokenizer may add one token)."""
    sources = text_sources(data)
    if any(tables.is_table(p) for p in sources.files):
        return  # its text column is only known by reading it
    size = sum(e["size"] for e in sources.listing()) + len(sources.files) - 1
    if size < seq_len:
        raise DataError(
            f"eval_data: {sources.description} holds {size} bytes; one window needs "
            f"{seq_len + 1} tokens (at least {seq_len} bytes)"
        )


def _leading_text(path: Path, limit: int) -> str:
    """At most limit bytes of a file's text, never reading more: a plain file's first bytes,
    a table's (.jsonl, .csv, .parquet...) text column, row by row."""
    if tables.is_table(path):
        parts, size = [], 0
        for value in tables.iter_texts(path):
            parts.append(value)
            size += len(value.encode("utf-8")) + 1
            if size >= limit:
                break
        return "\n".join(parts).encode("utf-8")[:limit].decode("utf-8", errors="ignore")
    try:
        with open(path, "rb") as f:
            raw = f.read(limit)
    except OSError as e:
        raise DataError(f"eval_data: cannot read {path} ({e.strerror or e})") from None
    return raw.decode("utf-8", errors="replace")


def text_windows(data: str, tokenizer: Tokenizer, seq_len: int, count: int) -> TextWindows:
    """Up to count windows of seq_len + 1 tokens from the start of a text file or folder, or
    of the embedded corpus for 'embedded'; a text too short for one window is refused."""
    sources = text_sources(data)
    text, left = [], EVAL_TEXT_BYTES
    for path in sources.files:
        if left <= 0:
            break
        part = _leading_text(path, left)
        text.append(part)
        left -= len(part.encode("utf-8"))
    joined = "\n".join(text)
    ids = tokenizer.encode(joined)
    n = min(count, len(ids) // (seq_len + 1))
    if n == 0:
        raise DataError(
            f"eval_data: {sources.description} gives {len(ids)} tokens; one window needs "
            f"{seq_len + 1}"
        )
    rows = torch.tensor(ids[: n * (seq_len + 1)], dtype=torch.int64).view(n, seq_len + 1)
    per_token = len(joined.encode("utf-8")) / max(1, len(ids))
    return TextWindows(sources.description, rows[:, :-1], rows[:, 1:], per_token)
