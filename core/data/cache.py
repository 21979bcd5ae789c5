"""The data cache's one transaction, shared by every builder: an entry is written into a
temporary sibling named after its owner (core.platform.atomic.temp_sibling), its manifest
last, and renamed into place; a half-written one is never trusted, and one left by a killed
process is removed by the next preparation."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from core.data.images import ImageSpec
from core.data.sources import Sources, hashed
from core.data.tokenizer import Tokenizer
from core.errors import UserError
from core.platform.atomic import (
    TEMP_MARK,
    as_disk_full,
    fsync_dir,
    temp_owner_alive,
    temp_sibling,
    write_text,
)

CACHE_FORMAT = 2  # 2: chat masks mark where each packed example starts


@dataclass
class ChatSpec:
    """How chat examples become training rows (see core.data.chatdata)."""

    seq_len: int  # rows hold seq_len + 1 tokens: a window and its shifted targets
    train_on_prompts: bool = False
    drop_long: bool = False
    skip_bad_lines: bool = False
    pairs: bool = False  # preference pairs (method dpo): two rows a pair, not packed


@dataclass
class DataSpec:
    sources: Sources
    tokenizer: str  # "bytes" | "bpe"
    vocab_size: int
    val_fraction: float
    chat: ChatSpec | None = None  # None: plain text
    columns: dict = field(default_factory=dict)  # a table's column mapping (core.data.tables)
    table: bool = False  # plain text from the text column of table files, a document a row
    images: ImageSpec | None = None  # how the model sees images (None: text only)
    images_problem: str = ""  # why a vision model's images cannot be read (its files)

    def key(
        self, listing: list[dict], template: str | None = None, thinking: bool | None = None
    ) -> str:
        """thinking: the tokenizer's enable_thinking, where the run sets one: the rows and the
        manifest's tokenizer (which generation and evaluation read) depend on it."""
        body = {
            "format": CACHE_FORMAT,
            "files": listing,
            "cap": self.sources.cap,
            "tokenizer": self.tokenizer,
            "vocab_size": self.vocab_size if self.tokenizer == "bpe" else 256,
            "val_fraction": self.val_fraction,
        }
        if self.chat is not None:
            body["chat"] = {**vars(self.chat), "template": template}
        if self.table:
            body["table"] = True
        if thinking is not None:
            body["enable_thinking"] = thinking
        if self.columns:  # which column is the text or the answer decides the tokens
            body["columns"] = self.columns
        if self.images is not None:  # the image tokens and the processed pixels
            body["images"] = self.images.key()
        return hashlib.blake2b(json.dumps(body).encode(), digest_size=12).hexdigest()


class PrepareCancelled(UserError):
    """The user stopped data preparation; nothing was left in the cache."""


def default_cache_dir() -> Path:
    env = os.environ.get("TRAINDECK_CACHE")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("traindeck", appauthor=False)) / "data"


# -- preparation ---------------------------------------------------------------------------


class Progress:
    def __init__(self, callback, cancelled, total: int, phase: str):
        self.callback, self.cancelled = callback, cancelled
        self.total, self.phase, self.done = total, phase, 0

    def advance(self, n: int) -> None:
        self.done += n
        if self.cancelled is not None and self.cancelled():
            raise PrepareCancelled("data: preparation stopped; nothing was cached")
        if self.callback is not None:
            self.callback(self.phase, self.done, self.total)


def manifest_of(spec: DataSpec, listing, tokenizer: Tokenizer, content: str, seconds: float):
    """What every cache entry's manifest says: its sources (with their content hashes, which
    a resume checks before tokenizing: not for a capped source, where a change past the cap
    changes nothing), tokenizer and fingerprints."""
    total = sum(f["size"] for f in listing)
    return {
        "format": CACHE_FORMAT,
        "source": spec.sources.description,
        "files": listing if spec.sources.cap is not None else hashed(listing),
        "empty_files": sum(1 for f in listing if f["size"] == 0),
        "total_bytes": total,
        "source_bytes": total,
        "tokenizer": tokenizer.kind,
        "tokenizer_meta": tokenizer.meta or None,
        "vocab_size": tokenizer.vocab_size,
        "dtype": np.dtype(tokenizer.dtype).name,
        "val_fraction": spec.val_fraction,
        "content_fingerprint": content,
        "tokenizer_fingerprint": tokenizer.fingerprint(),
        "fingerprint": hashlib.blake2b(
            f"{content}:{tokenizer.fingerprint()}".encode(), digest_size=12
        ).hexdigest(),
        "prepare_seconds": round(seconds, 3),
        "created": time.time(),
    }


def temp_entry(target: Path) -> Path:
    return temp_sibling(target)  # named after its owner: a later run knows when it is stale


def commit(tmp: Path, target: Path, manifest: dict) -> None:
    write_text(tmp / "manifest.json", json.dumps(manifest, indent=1))
    fsync_dir(tmp)
    try:
        os.replace(tmp, target)  # the one step that makes the cache entry trusted
    except OSError:
        if not (target / "manifest.json").is_file():  # not a concurrent twin: a real error
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    fsync_dir(target.parent)


def discard(tmp: Path, target: Path, error: BaseException) -> None:
    """Remove a failed entry; a full disk is reported as such (raises DiskFullError)."""
    err = as_disk_full(error, target.parent)  # before the half-written files give space back
    shutil.rmtree(tmp, ignore_errors=True)
    if err is not error:
        raise err from error


def read_manifest(folder: Path) -> dict | None:
    """The manifest if the entry is whole and consistent, else None."""
    try:
        m = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        expected = (m["train_tokens"] + m["val_tokens"]) * np.dtype(m["dtype"]).itemsize
        if m["format"] != CACHE_FORMAT or (folder / "tokens.bin").stat().st_size != expected:
            return None
        if not (folder / "tokenizer.json").is_file():
            return None
        if (
            "row" in m
            and (folder / "mask.bin").stat().st_size * np.dtype(m["dtype"]).itemsize != expected
        ):
            return None
        return m
    except (OSError, ValueError, KeyError, TypeError):
        return None


def clean_stale(cache: Path) -> None:
    """Remove temp folders of preparations whose process is gone (a crash or kill)."""
    import psutil

    for tmp in cache.glob(f".*{TEMP_MARK}*"):
        if not temp_owner_alive(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    for tmp in cache.glob(".tmp-*"):  # named before temp_sibling: by the process id alone
        try:
            pid = int(tmp.name.split("-")[-2])
        except (ValueError, IndexError):
            continue
        if not psutil.pid_exists(pid) or pid == os.getpid():
            shutil.rmtree(tmp, ignore_errors=True)
