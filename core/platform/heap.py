"""The C heap under CPU tensors. glibc serves a large malloc from its own mmap and gives it back
on free, but after each such free it raises that threshold (up to 32 MB), so the next step's
activations come from the heap, whose freed memory it keeps: on a long-context CPU fine-tune
that doubled the resident peak (2.37 GB against 1.14 GB at 2,048 tokens, docs/performance.md).
A fixed threshold keeps every large tensor on its own mapping, returned to the system when
freed."""

from __future__ import annotations

import ctypes
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
LARGE = 64 * 1024  # bytes, kept fixed (glibc starts at 128 kB and moves it); as measured


def return_large_frees() -> bool:
    """Fix glibc's mmap threshold (Linux); False where there is no glibc to tell."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, LARGE))  # the process's libc
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
