"""Files that are either the old version or the new one, never half-written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_dir(folder: Path) -> None:
    # Makes a rename itself durable; not possible (nor needed) on Windows.
    if os.name == "posix":
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: Path, write, durable: bool = True) -> None:
    """write(fileobj) into a temp file beside path, fsync, then atomically replace path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def write_text(path: Path, text: str, durable: bool = True) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")), durable)
