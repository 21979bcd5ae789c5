"""The C heap under CPU tensors. glibc serves a large malloc from its own mmap and gives it back
on free, but after each such free it raises that threshold (up to 32 MB), so the next step's
activations come from the heap, whose freed memory it keeps: on a long-context CPU fine-tune
that doubled the resident peak (2.37 GB against 1.14 GB at 2,048 tokens, docs/performance.md).
A fixed threshold keeps every large tensor on its own mapping, returned to the system when
freed. Its cost is a page fault for each fresh page of every large tensor: 25-45% of a CPU
fine-tune's step (docs/performance.md), so a run takes it only where memory is tight (`choose`),
judged by the memory the process may use (`room`: a cgroup's limit where one is set)."""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigError

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
LARGE = 64 * 1024  # bytes, kept fixed (glibc starts at 128 kB and moves it); as measured
# glibc's own heap held up to this many times the CPU estimate (which is the lean heap's):
# 2.11x at 2,048 tokens over 2 steps, 2.24x at 8,192 over 1 (benchmarks/long_context.py,
# docs/performance.md, "Both heaps"); it grows over more steps
FAST_HOLDS = 2.3
# the fast heap where this many times the estimate fits the room: what it held, and more
# steps' growth (2.0 before 2026-11-28 left it short: 2.24x measured)
ROOM = 3.0
MODES = ("auto", "lean", "fast")
GIB = 1024**3
# Where the cgroup file systems are mounted, and this process's groups in them (cgroup(7));
# a test points both at files of its own
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
NO_LIMIT = 2**60  # cgroup v1 writes "no limit" as a number near 2**63

_lean_set = False  # whether this process fixed the threshold (return_large_frees)


def chosen_mode() -> str:
    """TRAINDECK_HEAP (auto when unset); ConfigError names a value it does not know."""
    mode = os.environ.get("TRAINDECK_HEAP", "auto")
    if mode not in MODES:
        raise ConfigError(f"TRAINDECK_HEAP: expected one of {', '.join(MODES)}, got {mode!r}")
    return mode


@dataclass(frozen=True)
class Room:
    """The memory this process may still use (bytes), and where that figure comes from."""

    bytes: int
    source: str

    def __str__(self) -> str:
        return f"{self.bytes / GIB:.1f} GiB {self.source}"


@dataclass(frozen=True)
class Choice:
    """Which heap a CPU run keeps, and why, in words for its log."""

    lean: bool
    why: str

    @property
    def name(self) -> str:
        return "lean" if self.lean else "fast"


def choose(peak_bytes: int | None, room: Room) -> Choice:
    """The lean heap where ROOM x the estimated peak (None: unknown) would not fit the room, or
    where TRAINDECK_HEAP says lean (fast: never)."""
    mode = chosen_mode()
    if mode != "auto":
        return Choice(mode == "lean", f"TRAINDECK_HEAP={mode}")
    if peak_bytes is None:
        return Choice(True, "no estimate of the peak to judge by")
    need = f"{ROOM:g} x the {peak_bytes / GIB:.2f} GiB estimated peak"
    if ROOM * peak_bytes > room.bytes:
        return Choice(True, f"memory is tight: {need} is over the {room}")
    return Choice(False, f"{need} fits the {room}")


def room(root: Path | None = None, membership: Path | None = None) -> Room:
    """What this process may still use: the memory free now, or less where its cgroup's limit
    (cgroup v2's memory.max, v1's memory.limit_in_bytes) leaves less. root and membership:
    CGROUP_ROOT and PROC_CGROUP unless given."""
    import psutil

    free = Room(psutil.virtual_memory().available, "free")
    limited = cgroup_room(root or CGROUP_ROOT, membership or PROC_CGROUP)
    return limited if limited is not None and limited.bytes < free.bytes else free


def cgroup_room(root: Path, membership: Path) -> Room | None:
    """The tightest memory limit over this process's cgroup and the groups above it, less what
    that group uses (without the page cache it can drop, as `docker stats` counts it); None
    where no group sets one or nothing can be read."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return None
    best = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2's unified hierarchy
            files = ("memory.max", "memory.current", "inactive_file")
            mount = root
        elif "memory" in controllers.split(","):
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
            mount = root / "memory"
        else:
            continue
        for group in _groups(mount, path):
            found = _left(group, *files)
            if found is not None and (best is None or found[0] < best.bytes):
                name = "/" + group.relative_to(mount).as_posix().strip(".")
                limit = f"{found[1] / GIB:.1f} GiB memory limit of cgroup {name} ({files[0]})"
                best = Room(found[0], f"left under the {limit}")
    return best


def _groups(mount: Path, path: str) -> list[Path]:
    """The process's group and those above it, under mount. A container that mounts its own
    group as the root shows the host's path in /proc/self/cgroup: then the root alone."""
    group = mount / path.strip("/")
    if not group.is_dir():
        return [mount]
    out = [group]
    while group != mount:
        group = group.parent
        out.append(group)
    return out


def _left(group: Path, limit_file: str, usage_file: str, cache_key: str) -> tuple | None:
    """(bytes left, the limit) of a group that sets a limit; None where it sets none."""
    try:
        text = (group / limit_file).read_text().strip()
    except OSError:
        return None
    if not text.isdigit() or int(text) >= NO_LIMIT:  # v2 writes "max" for none
        return None
    limit = int(text)
    try:
        used = int((group / usage_file).read_text())
        stat = (group / "memory.stat").read_text().split()
        used -= int(dict(zip(stat[::2], stat[1::2], strict=False)).get(cache_key, "0"))
    except (OSError, ValueError):
        used = 0  # the limit alone
    return max(0, limit - used), limit


def return_large_frees() -> bool:
    """Fix glibc's mmap threshold (Linux); False where there is no glibc to tell."""
    global _lean_set
    if not sys.platform.startswith("linux"):
        return False
    try:
        done = bool(ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, LARGE))  # the process's libc
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    _lean_set = _lean_set or done
    return done


def in_use() -> str:
    """The heap this process keeps: "lean" once return_large_frees took, else "fast"."""
    return "lean" if _lean_set else "fast"
