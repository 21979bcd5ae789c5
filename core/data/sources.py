"""Where training text comes from: a file, a folder of files with chosen endings, or the
embedded default corpus (this Python's own standard library sources), and what changed in
them since a checkpoint."""

from __future__ import annotations

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
    """The changes that certainly change the data, known without reading it: a file added
    (not empty) or removed (not empty), or one whose size changed. A file only touched (same
    size, new time) may hold the same text: only its tokens can tell."""
    before = {f["path"]: f for f in old}
    after = {f["path"]: f for f in new}
    changes = [f"added {p}" for p, f in after.items() if p not in before and f["size"]]
    changes += [f"removed {p}" for p, f in before.items() if p not in after and f["size"]]
    changes += [
        f"modified {p}" for p in after if p in before and after[p]["size"] != before[p]["size"]
    ]
    return changes
