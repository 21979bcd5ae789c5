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


def writable_problem(path: Path) -> str | None:
    """Why no file can be made in path (or, when path does not exist yet, in the nearest
    folder above it), or None. Tried, not guessed from permission bits, which say nothing for
    an administrator or a read-only disk."""
    probe = Path(path)
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return f"{path} cannot be made: {probe} is not a folder"
    test = probe / f".traindeck-write-test-{os.getpid()}"
    try:
        test.touch()
        test.unlink()
    except OSError as e:
        return f"cannot write in {probe} ({e.strerror or e}); choose a folder you can write"
    return None


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


# -- temporary siblings: written beside a target, renamed into place, owned by one process ----

TEMP_MARK = ".tmp-"


def _host_tag() -> str:
    import hashlib
    import socket

    return hashlib.blake2b(socket.gethostname().encode(), digest_size=4).hexdigest()


def _start_tag(pid: int) -> str:
    """When process pid started, in whole seconds: with the pid, names one process for ever
    (a pid reused by a later process has a later start)."""
    import psutil

    try:
        return str(int(psutil.Process(pid).create_time()))
    except (psutil.Error, OSError):
        return "0"


def temp_sibling(target: Path) -> Path:
    """A new folder beside target, named after its owner (pid, start time, host), hidden."""
    import uuid

    target = Path(target)
    pid = os.getpid()
    owner = f"{pid}-{_start_tag(pid)}-{_host_tag()}-{uuid.uuid4().hex[:6]}"
    tmp = target.parent / f".{target.name}{TEMP_MARK}{owner}"
    tmp.mkdir(parents=True)
    return tmp


def temp_owner_alive(tmp: Path) -> bool:
    """Whether the process that made this temporary may still be writing it: True unless it
    is on this host and its process is gone (another host's temporaries cannot be judged and
    are kept)."""
    try:
        pid_text, start, host, _ = Path(tmp).name.rsplit(TEMP_MARK, 1)[1].split("-")
        pid = int(pid_text)
    except ValueError:
        return True  # not named by temp_sibling: not ours to judge
    if host != _host_tag():
        return True
    import psutil

    return psutil.pid_exists(pid) and _start_tag(pid) == start


def temps_of(target: Path) -> list[Path]:
    target = Path(target)
    if not target.parent.is_dir():
        return []
    return sorted(target.parent.glob(f".{target.name}{TEMP_MARK}*"))


def clean_stale_temps(target: Path) -> list[Path]:
    """Delete the temporaries of target whose owner is gone (killed while writing); return
    the ones still owned by a live process."""
    live = []
    for tmp in temps_of(target):
        if temp_owner_alive(tmp):
            live.append(tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return live


def rename_into_place(tmp: Path, target: Path) -> bool:
    """Move a finished temporary folder to target (missing or an empty folder); False when
    target was filled meanwhile (another process won: tmp is left for the caller)."""
    target = Path(target)
    if os.name == "nt" and target.is_dir() and not any(target.iterdir()):
        target.rmdir()  # Windows renames onto nothing only
    try:
        os.rename(tmp, target)  # replaces an empty folder; refuses a full one
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST) or (
            os.name == "nt" and Path(target).exists()
        ):
            return False
        raise
    fsync_dir(target.parent)
    return True
