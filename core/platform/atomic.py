"""Files that are either the old version or the new one, never half-written."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path

DISK_FULL_ERRNOS = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
# Less free space than this after a failed write: the write failed because the disk is full.
NEARLY_FULL_BYTES = 1 << 20


def is_disk_full(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS


def free_bytes(path: Path) -> int | None:
    """Free space on the file system holding path (its nearest existing folder)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def as_disk_full(err: BaseException, path: Path) -> BaseException:
    """The error a failed write to path should raise: OSError(ENOSPC, "No space left on
    device", path) when the disk is full, however the library reported it (torch's zip writer
    says "RuntimeError: [enforce fail at inline_container.cc] unexpected pos"), else err.

    A failure with less than NEARLY_FULL_BYTES left on path's file system counts as a full
    disk. Call it before deleting the half-written file, which
    gives the space back."""
    if is_disk_full(err):
        if getattr(err, "filename", None):
            return err
        return OSError(err.errno, err.strerror or "No space left on device", str(path))
    if not isinstance(err, (OSError, RuntimeError)):
        return err
    free = free_bytes(path)
    if free is not None and free < NEARLY_FULL_BYTES:
        return OSError(errno.ENOSPC, "No space left on device", str(path))
    return err


@contextlib.contextmanager
def disk_full_as_enospc(path: Path):
    """as_disk_full for the writes inside the block."""
    try:
        yield
    except Exception as e:
        err = as_disk_full(e, path)
        if err is e:
            raise
        raise err from e


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
        with disk_full_as_enospc(path), os.fdopen(fd, "wb") as f:
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
