"""Where training text comes from: a file, a folder of files with chosen endings, or the
embedded default corpus (this Python's own standard library sources), and what changed in
them since a checkpoint."""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from core.data import chatdata
from core.errors import DataError

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


@dataclass
class Sources:
    description: str
    files: list[Path]
    cap: int | None  # bytes used at most (the embedded corpus is always capped)

    def listing(self) -> list[dict]:
        """path, size and modification time of each file: what the cache key is made of."""
        out = []
        for p in self.files:
            try:
                st = p.stat()
            except OSError as e:
                raise DataError(f"data: cannot read {p} ({e.strerror})") from None
            out.append({"path": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns})
        return out


HASH_CHUNK = 1 << 20  # bytes read at a time: memory stays bounded on any file


def content_hash(path: Path) -> str:
    """A file's content fingerprint (blake2b, streamed): on resume it tells a file edited
    to the same size from one only touched, without tokenizing it."""
    hasher = hashlib.blake2b(digest_size=16)
    try:
        with open(path, "rb") as f:
            while chunk := f.read(HASH_CHUNK):
                hasher.update(chunk)
    except OSError as e:
        raise DataError(f"data: cannot read {path} ({e.strerror})") from None
    return hasher.hexdigest()


def hashed(listing: list[dict]) -> list[dict]:
    """The listing with each file's content hash, as a cache entry's manifest keeps it (the
    cache key is made of the listing without them)."""
    return [{**f, "blake2b": content_hash(Path(f["path"]))} for f in listing]


def find_sources(
    data: str | None,
    extensions: list[str],
    embedded_cap: int,
    max_bytes: int | None = None,
    chat: bool = False,
) -> Sources:
    if data is None:
        files = _stdlib_files()
        if not files:
            raise DataError("data: no --data given and the Python stdlib sources were not found")
        return Sources(DEFAULT_CORPUS, files, embedded_cap)
    path = Path(data).expanduser().resolve()
    if path.is_file():
        return Sources(str(path), [path], max_bytes)
    if path.is_dir():
        if chat:  # a folder of chat data or tables: its .jsonl, .json, .csv, .parquet files
            extensions = list(chatdata.CHAT_SUFFIXES)
        files = _folder_files(path, extensions)
        if not files:
            raise DataError(f"data: folder {path} holds no files ending in {', '.join(extensions)}")
        return Sources(f"{path} ({len(files)} files)", files, max_bytes)
    raise DataError(f"data: {data} is neither a file nor a folder")


def data_changes(old: list[dict], new: list[dict]) -> list[str]:
    """Human-readable differences between two source listings."""
    before = {f["path"]: f for f in old}
    after = {f["path"]: f for f in new}
    changes = [f"added {p}" for p in after if p not in before]
    changes += [f"removed {p}" for p in before if p not in after]
    changes += [
        f"modified {p}"
        for p in after
        if p in before
        and (after[p]["size"], after[p]["mtime_ns"]) != (before[p]["size"], before[p]["mtime_ns"])
    ]
    return changes


def sure_changes(old: list[dict], new: list[dict]) -> list[str]:
    """The changes that certainly change the data, known without tokenizing it: a file added
    (not empty) or removed (not empty), one whose size changed, or one of the same size with
    a new time whose content hash differs from the one old keeps. A file only touched (same
    content, new time) is no change; without a kept hash (a cache entry prepared before
    hashes were kept) only its tokens can tell."""
    before = {f["path"]: f for f in old}
    after = {f["path"]: f for f in new}
    changes = [f"added {p}" for p, f in after.items() if p not in before and f["size"]]
    changes += [f"removed {p}" for p, f in before.items() if p not in after and f["size"]]
    changes += [f"modified {p}" for p in after if p in before and _modified(before[p], after[p])]
    return changes


def _modified(old: dict, new: dict) -> bool:
    if new["size"] != old["size"]:
        return True
    if new["mtime_ns"] == old["mtime_ns"] or "blake2b" not in old:
        return False
    return content_hash(Path(new["path"])) != old["blake2b"]
