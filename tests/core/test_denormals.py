"""A training process flushes denormal floats (core.platform.device.flush_denormals): in its
own thread and in the threads torch starts after it, which is where the products run."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
import torch
from core.platform.device import flush_denormals

if sys.argv[1] == "flush":
    flush_denormals()
torch.set_num_threads(2)
tiny = torch.full((1 << 22,), 1e-20)
products = tiny * tiny  # 1e-40: a denormal, or 0 where flushed
print(int((products != 0).sum()))
"""


def nonzero(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


def test_every_thread_flushes_denormals_once_a_run_starts():
    assert nonzero("keep") == 1 << 22  # by default the products are denormals
    assert nonzero("flush") == 0  # none left, in any of the threads that made them
