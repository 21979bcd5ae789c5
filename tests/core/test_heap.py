"""The C heap setting (core.platform.heap): after it, freed large tensors go back to the
system; without it glibc keeps them once a large free has raised its mmap threshold."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import sys
import torch
from core.platform import heap

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

if sys.argv[1] == "fixed":
    assert heap.return_large_frees()
big = torch.ones(4 * 2**20)
del big  # 16 MB freed: glibc raises its threshold past the next tensors
before = rss_mb()
kept, small = [torch.ones(2**20) for _ in range(50)], []  # 50 x 4 MB
for t in kept:
    small.append(torch.ones(25_000))  # 100 kB after each: blocks a step leaves behind
del kept
print(rss_mb() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_large_tensors_go_back_to_the_system():
    def held(mode: str) -> float:
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True
        )
        return float(out.stdout.split()[-1])

    assert held("default") > 150  # of the 200 MB freed
    assert held("fixed") < 20


def test_a_run_keeps_the_lean_heap_only_where_memory_is_tight(monkeypatch):
    """The fixed threshold costs a page fault per fresh page (30-45% of a CPU fine-tune's
    step): taken where twice the estimated peak would not fit what is free, or when asked."""
    from core.errors import ConfigError
    from core.platform import heap

    monkeypatch.delenv("TRAINDECK_HEAP", raising=False)
    assert not heap.lean(3 * 2**30, 8 * 2**30)  # room: glibc's own (fast) heap
    assert heap.lean(5 * 2**30, 8 * 2**30)  # twice the peak would not fit: lean
    assert heap.lean(None, 8 * 2**30)  # no estimate: lean
    monkeypatch.setenv("TRAINDECK_HEAP", "lean")
    assert heap.lean(1, 8 * 2**30)
    monkeypatch.setenv("TRAINDECK_HEAP", "fast")
    assert not heap.lean(7 * 2**30, 8 * 2**30)
    monkeypatch.setenv("TRAINDECK_HEAP", "small")
    with pytest.raises(ConfigError, match="TRAINDECK_HEAP: expected one of auto, lean, fast"):
        heap.lean(1, 2)
