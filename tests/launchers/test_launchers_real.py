"""Launchers, layer 4: train_gpu.sh for real on a fresh copy of the repository: creates .venv,
installs torch and the project, trains a few steps; a second run skips the installation.

It downloads packages, so it runs only when asked: TRAINDECK_TEST_INSTALL=1 (CI's own setup,
`./train_gpu.sh --test` on a clean clone, goes through the same installer every time).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from launchers_common import (
    BASH,
    ROOT,
    git,
    sh_var,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("TRAINDECK_TEST_INSTALL") != "1",
        reason="downloads packages: set TRAINDECK_TEST_INSTALL=1 to run the real installer",
    ),
]


def copy_repo(dest: Path) -> Path:
    """What a fresh clone has: the files git tracks (working-tree contents)."""
    listed = git("ls-files", "-z", "--cached")
    if listed is None:  # not a git checkout: copy all but local state
        shutil.copytree(
            ROOT,
            dest,
            ignore=shutil.ignore_patterns(
                ".git", ".venv", "runs", "__pycache__", "*.egg-info", ".*_cache"
            ),
        )
        return dest
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@dataclass
class RealRun:
    rc: int
    out: str
    seconds: float
    setup_seconds: float  # until the launcher hands over to python -m core.train


def _run_timed(cmd: list[str], cwd: Path, env: dict, timeout: float) -> RealRun:
    start = time.monotonic()
    setup = None
    chunks = []
    with subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
        errors="replace",
    ) as proc:
        try:
            for line in proc.stdout:
                chunks.append(line)
                if setup is None and line.startswith("[traindeck] Training without the GUI"):
                    setup = time.monotonic() - start
                if time.monotonic() - start > timeout:
                    proc.kill()
                    break
        finally:
            rc = proc.wait(timeout=60)
    total = time.monotonic() - start
    return RealRun(rc, "".join(chunks), total, setup if setup is not None else total)


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    """Runs ./train_gpu.sh twice on a fresh copy: install + train, then train again."""
    if BASH is None:
        pytest.skip("bash is not installed")
    base = tmp_path_factory.mktemp("real")
    repo = copy_repo(base / "Train Deck")
    if not (repo / "train_gpu.sh").exists():
        pytest.fail("train_gpu.sh is not tracked by git (git add it)")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TRAINDECK_", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH"))
    }
    # The CPU build even on a GPU machine: the CUDA choice is tested with stubs,
    # and this keeps the download small.
    env.update(
        TRAINDECK_TORCH_VARIANT="cpu",
        QT_QPA_PLATFORM="offscreen",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_INPUT="1",
    )
    runs = []
    for n in (1, 2):
        out = base / f"run {n}"
        cmd = [
            str(repo / "train_gpu.sh"),
            "--preset",
            "cpu-tiny",
            "--max-steps",
            "3",
            "--out",
            str(out),
        ]
        runs.append((_run_timed(cmd, base, env, timeout=900), out))
    return repo, runs


def _show(run: RealRun) -> str:
    return run.out[-6000:]


def test_real_first_run_installs_into_a_fresh_venv(real_runs):
    repo, [(first, _), _] = real_runs
    print(f"first run: {first.seconds:.1f} s, setup {first.setup_seconds:.1f} s")
    assert "[traindeck] Creating the virtual environment" in first.out, _show(first)
    assert "[traindeck] Installation complete." in first.out, _show(first)
    venv_py = repo / ".venv" / "bin" / "python"
    proc = subprocess.run(
        [str(venv_py), "-c", "import torch, sympy, networkx, jinja2; print(torch.__version__)"],
        capture_output=True,
        text=True,
        cwd=repo.parent,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith(sh_var("TORCH_VERSION"))
    stamp = (repo / ".venv" / "traindeck-install.stamp").read_text()
    digest = hashlib.sha256((repo / "pyproject.toml").read_bytes()).hexdigest()
    variant = "macos" if sys.platform == "darwin" else "cpu"
    assert stamp == f"{digest} torch={sh_var('TORCH_VERSION')}+{variant} extras=\n"


def test_real_second_run_skips_installation(real_runs):
    repo, [(first, _), (second, _)] = real_runs
    print(f"second run: {second.seconds:.1f} s, setup {second.setup_seconds:.1f} s")
    assert "[traindeck] Dependencies up to date" in second.out, _show(second)
    assert "Installing" not in second.out and "Creating the virtual" not in second.out
    assert second.setup_seconds < 15, f"setup took {second.setup_seconds:.1f} s"


@pytest.mark.parametrize("n", [0, 1], ids=["first", "second"])
def test_real_run_trains(real_runs, n):
    _, runs = real_runs
    run, out = runs[n]
    assert run.rc == 0, _show(run)
    for rel in ("config.yaml", "metrics.jsonl", "checkpoints/latest.pt"):
        assert (out / rel).is_file(), f"{rel} missing in {out}:\n{_show(run)}"
