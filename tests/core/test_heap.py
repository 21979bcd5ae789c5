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
