"""The C heap under CPU tensors. glibc serves a large malloc from its own mmap and gives it back
on free, but after each such free it raises that threshold (up to 32 MB), so the next step's
activations come from the heap, whose freed memory it keeps: on a long-context CPU fine-tune
that doubled the resident peak (2.37 GB against 1.14 GB at 2,048 tokens, docs/performance.md).
A fixed threshold keeps every large tensor on its own mapping, returned to the system when
freed. Its cost is a page fault for each fresh page of every large tensor: 25-45% of a CPU
fine-tune's step (docs/performance.md), so a run takes it only where memory is tight (`lean`)."""

from __future__ import annotations

import ctypes
import os
import sys

from core.errors import ConfigError

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
LARGE = 64 * 1024  # bytes, kept fixed (glibc starts at 128 kB and moves it); as measured
# glibc's own heap kept up to 1.75x the lean peak (2,067 against 1,183 MB at 2,048 tokens):
# with twice the lean peak free, the fast heap cannot run out
ROOM = 2.0
MODES = ("auto", "lean", "fast")


def chosen_mode() -> str:
    """TRAINDECK_HEAP (auto when unset); ConfigError names a value it does not know."""
    mode = os.environ.get("TRAINDECK_HEAP", "auto")
    if mode not in MODES:
        raise ConfigError(f"TRAINDECK_HEAP: expected one of {', '.join(MODES)}, got {mode!r}")
    return mode


def lean(peak_bytes: int | None, available_bytes: int) -> bool:
    """Whether a CPU run of this estimated peak (None: unknown) keeps the lean heap: where twice
    the peak would not fit what is free, or TRAINDECK_HEAP says lean (fast: never)."""
    mode = chosen_mode()
    if mode != "auto":
        return mode == "lean"
    return peak_bytes is None or ROOM * peak_bytes > available_bytes


def return_large_frees() -> bool:
    """Fix glibc's mmap threshold (Linux); False where there is no glibc to tell."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, LARGE))  # the process's libc
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
