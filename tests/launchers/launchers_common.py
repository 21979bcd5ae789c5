"""Shared by the launcher tests (train_gpu.sh, train_gpu.bat, .ci/run): paths and readers."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SH = ROOT / "train_gpu.sh"
BAT = ROOT / "train_gpu.bat"
CI_RUN = ROOT / ".ci" / "run"
BASH = shutil.which("bash")
WINE = shutil.which("wine") or shutil.which("wine64")

needs_bash = pytest.mark.skipif(BASH is None, reason="bash is not installed")


def bat_text() -> str:
    return BAT.read_bytes().decode("ascii")  # keeps the \r\n


def sh_var(name: str) -> str:
    m = re.search(rf'^{name}="([^"]*)"$', SH.read_text(encoding="utf-8"), re.M)
    assert m, f"{name}=... not found in train_gpu.sh"
    return m.group(1)


def bat_var(name: str) -> str:
    m = re.search(rf'^set "{name}=([^"]*)"\r$', bat_text(), re.M)
    assert m, f'set "{name}=..." not found in train_gpu.bat'
    return m.group(1)


def git(*args: str) -> str | None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return None
    proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else None


# What the stub nvidia-smi prints (the real one's header), for both launchers.
SMI_HEADER = """\
Sat Nov 22 10:00:00 2025
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 999.99                 Driver Version: 999.99         CUDA Version: {cuda}     |
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
|=========================================+========================+======================|
|   0  NVIDIA Stub GPU                Off |   00000000:01:00.0  On |                  Off |
|  0%   38C    P8             21W /  450W |     650MiB /  24564MiB |      2%      Default |
+-----------------------------------------+------------------------+----------------------+
"""
