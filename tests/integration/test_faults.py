"""Faults a user meets: a full disk, a damaged checkpoint, two trainers on one run, no xcb."""

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import tiny_config

from core.errors import CheckpointError, DiskFullError
from core.runs import checkpoint as ckpt
from core.runs.events import TrainEvents
from core.runs.folder import resolve_resume
from core.runs.lock import LOCK_NAME, RunLock, RunLocked
from core.train import main
from core.training.trainer import Trainer
from gui.platform_check import xcb_problem

ROOT = Path(__file__).resolve().parents[2]


# -- a full disk ---------------------------------------------------------------------------


def test_disk_full_while_saving_stops_with_one_clear_line_and_keeps_the_good_checkpoint(
    tmp_path, monkeypatch, capsys
):
    run = tmp_path / "run"
    real_save = torch.save
    saves = []

    def save(obj, f, *args, **kwargs):
        saves.append(1)
        if len(saves) > 2:  # the checkpoints at steps 10 and 20 fit, the one at 30 does not
            f.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    args = ["--preset", "cpu-tiny", "--seq-len", "32", "--hidden-dim", "32", "--max-steps", "30"]
    args += ["--eval-every", "10", "--ckpt-every", "10", "--out", str(run)]
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bars
    assert err.startswith("error: disk full: no space left on the device holding")
    assert "MB free" in err and "the last good checkpoint is step 20" in err
    assert f"python -m core.train --resume {run}" in err
    monkeypatch.setattr(torch, "save", real_save)
    assert ckpt.load(run / "checkpoints" / "latest.pt")["step"] == 20
    assert not list(run.rglob("*.tmp")), "temporary files were left behind"
    assert not (run / LOCK_NAME).exists()
    assert main(["--resume", str(run)]) == 0  # the printed command works once space is back


# -- a real full disk: a 1 MB tmpfs ---------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A real 1 MB file system: writes fail there as they do on a full disk."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root on Linux")
    folder = tmp_path / "small-disk"
    folder.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)]
    proc = subprocess.run(mount, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {proc.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def fill(folder: Path) -> None:
    """Take every free byte of folder's file system."""
    with open(folder / "filler", "ab", buffering=0) as f, pytest.raises(OSError) as full:
        while True:
            f.write(bytes(1 << 16))
    assert full.value.errno == errno.ENOSPC


def train_cli(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    tiny = ["--preset", "cpu-tiny", "--seq-len", "32", "--hidden-dim", "32"]
    return subprocess.run(
        [sys.executable, "-m", "core.train", *tiny, *args], capture_output=True, text=True, env=env
    )


def test_a_real_full_disk_while_saving_a_checkpoint_gives_the_one_line_message(small_disk):
    # A checkpoint is some 600 kB: the one at step 10 fits, the one at 20 (a second copy while
    # step-000010.pt keeps the first) does not, and torch's zip writer fails with
    # "RuntimeError: [enforce fail at inline_container.cc] unexpected pos", not ENOSPC.
    run = small_disk / "run"
    proc = train_cli(
        "--max-steps",
        "20",
        "--eval-every",
        "10",
        "--ckpt-every",
        "10",
        "--out",
        str(run),
        "--arch",
        "gpt2",
        "--optimizer",
        "adamw",  # the checkpoint size the disk is made for
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "enforce fail" not in proc.stderr, proc.stderr
    err = proc.stderr.strip().splitlines()[-1]  # after the progress bar
    latest = run / "checkpoints" / "latest.pt"
    assert err == (
        f"error: disk full: no space left on the device holding {latest} (0 MB free); "
        f"the last good checkpoint is step 10 ({latest}); free some space, then resume with: "
        f"python -m core.train --resume {run}"
    )
    assert ckpt.load(latest)["step"] == 10
    assert not list(run.rglob("*.tmp")), "temporary files were left behind"
    assert "enforce fail" not in (run / "train.log").read_text()


@pytest.mark.parametrize("prepare_only", [True, False], ids=["prepare-only", "training"])
def test_a_real_full_disk_while_preparing_data_gives_the_one_line_message(small_disk, prepare_only):
    cache = small_disk / "cache"  # the 1 MB sample of the built-in corpus does not fit
    args = ["--data-cache", str(cache), "--max-steps", "2", "--out", str(small_disk.parent / "r")]
    proc = train_cli(*args, *(["--prepare-only"] if prepare_only else []))
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr, proc.stderr
    assert err[-1].startswith(
        f"error: disk full: no space left on the device holding the data cache {cache} while "
        "preparing the data (nothing was cached;"
    )
    assert err[-1].endswith("--data-cache DIR (or TRAINDECK_CACHE)")
    assert not [p for p in err if p.startswith("error")][:-1]  # one error line
    assert os.listdir(cache) == []  # no half-prepared entry is left


class FillDiskAtFirstStep(TrainEvents):
    def __init__(self, folder: Path):
        self.folder, self.filled = folder, False

    def on_train_batch_end(self, record):
        if not self.filled:
            self.filled = True
            fill(self.folder)


def test_a_real_full_disk_while_appending_metrics_names_the_metrics_file(small_disk):
    run = small_disk / "run"
    # one record a step; the metrics file's first page holds ~15, the next cannot be had
    cfg = tiny_config(max_steps=40, log_every=1, eval_every=40, ckpt_every=40)
    with pytest.raises(DiskFullError) as full:
        Trainer(cfg, run).run(FillDiskAtFirstStep(small_disk))
    assert str(full.value) == (
        f"disk full: no space left on the device holding {run / 'metrics.jsonl'} (0 MB free); "
        "no checkpoint was saved yet; free some space and start again"
    )


# -- a damaged checkpoint ------------------------------------------------------------------


@pytest.fixture
def trained_run(tmp_path):
    run = tmp_path / "run"
    Trainer(tiny_config(max_steps=20, ckpt_every=10, eval_every=10), run).run()
    return run


def damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 3 : len(data) // 3 + 2000] = os.urandom(2000)
    path.write_bytes(bytes(data))


def test_damaged_latest_falls_back_to_the_newest_intact_checkpoint(trained_run, capsys):
    ckpts = trained_run / "checkpoints"
    # step-000020.pt is a hard link to latest.pt (one file on disk): damage hits both names
    assert os.path.samefile(ckpts / "latest.pt", ckpts / "step-000020.pt")
    damage(ckpts / "latest.pt")
    path, run = resolve_resume(str(trained_run))
    assert path == ckpts / "step-000010.pt"
    assert "latest.pt (damaged" in run.resume_note and "step-000020.pt (damaged" in run.resume_note
    assert "continuing from step-000010.pt (step 10)" in run.resume_note
    assert main(["--resume", str(trained_run), "--max-steps", "22"]) == 0
    assert "continuing from step-000010.pt (step 10)" in capsys.readouterr().out
    assert ckpt.load(ckpts / "latest.pt")["step"] == 22


def test_without_hard_links_a_damaged_latest_falls_back_to_its_intact_copy(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise OSError(errno.EPERM, "hard links not supported")

    monkeypatch.setattr(os, "link", no_links)  # e.g. exFAT: step files are copies
    run = tmp_path / "run"
    Trainer(tiny_config(max_steps=20, ckpt_every=10, eval_every=10), run).run()
    ckpts = run / "checkpoints"
    assert not os.path.samefile(ckpts / "latest.pt", ckpts / "step-000020.pt")
    damage(ckpts / "latest.pt")
    path, folder = resolve_resume(str(run))
    assert path == ckpts / "step-000020.pt"
    assert "continuing from step-000020.pt (step 20)" in folder.resume_note


def test_no_intact_checkpoint_lists_what_was_tried_and_a_named_file_is_refused(trained_run, capsys):
    ckpts = trained_run / "checkpoints"
    for p in ckpts.glob("*.pt"):
        damage(p)
    with pytest.raises(CheckpointError, match=r"no intact checkpoint .*latest\.pt.*best\.pt"):
        resolve_resume(str(trained_run))
    assert main(["--resume", str(ckpts / "latest.pt")]) == 2
    assert "latest.pt is damaged" in capsys.readouterr().err


# -- two processes, one run ----------------------------------------------------------------

HOLDER = """
import sys, time
from core.runs.lock import RunLock
lock = RunLock(sys.argv[1]); lock.acquire()
print("locked", flush=True)
time.sleep(60)
"""


def test_a_run_in_use_by_another_process_is_refused_naming_its_pid(trained_run, capsys):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(trained_run)], stdout=subprocess.PIPE, env=env
    )
    try:
        assert holder.stdout.readline().strip() == b"locked"
        assert main(["--resume", str(trained_run), "--max-steps", "25"]) == 2
        err = capsys.readouterr().err
        assert f"in use by process {holder.pid}" in err
    finally:
        holder.kill()
        holder.wait()
    # the holder died without unlocking: its lock is stale and is taken over
    assert (trained_run / LOCK_NAME).exists()
    assert main(["--resume", str(trained_run), "--max-steps", "25"]) == 0
    assert not (trained_run / LOCK_NAME).exists()


def test_lock_is_exclusive_within_a_process_too(tmp_path):
    first, second = RunLock(tmp_path), RunLock(tmp_path)
    first.acquire()
    with pytest.raises(RunLocked, match=f"process {os.getpid()}"):
        second.acquire()
    first.release()
    second.acquire()
    second.release()
    assert not (tmp_path / LOCK_NAME).exists()


# -- Linux without Qt's xcb libraries ------------------------------------------------------


def test_missing_xcb_libraries_give_one_apt_line(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    problem = xcb_problem(lambda lib: ["libxcb-cursor.so.0", "libxkbcommon-x11.so.0"])
    assert problem is not None and len(problem.splitlines()) == 1
    assert "libxcb-cursor.so.0" in problem
    assert "sudo apt install libxcb-cursor0 libxkbcommon-x11-0" in problem
    assert "train headless" in problem
    assert xcb_problem(lambda lib: []) is None
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")  # another platform: xcb is not used
    assert xcb_problem(lambda lib: ["libxcb-cursor.so.0"]) is None


def test_a_library_ldd_reports_twice_is_listed_once(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")
    monkeypatch.setattr("gui.platform_check.xcb_plugin", lambda: Path("libqxcb.so"))
    # libqxcb.so and libxcb-image.so.0 both need these two: ldd prints each once per needer
    twice = ["libxcb-keysyms.so.1", "libxcb-icccm.so.4", "libxcb-keysyms.so.1"]
    problem = xcb_problem(lambda lib: twice + ["libxcb-icccm.so.4"])
    assert "missing libxcb-icccm.so.4, libxcb-keysyms.so.1;" in problem
    assert "sudo apt install libxcb-icccm4 libxcb-keysyms1 (" in problem
    assert problem == xcb_problem(lambda lib: ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"] * 2)


def test_the_app_exits_1_with_the_hint_before_creating_qt(monkeypatch, capsys):
    import gui.__main__ as app

    monkeypatch.setattr(app, "xcb_problem", lambda: "error: the window cannot start: x")
    monkeypatch.setattr(app, "no_display", lambda: False)
    assert app.main([]) == 1
    assert capsys.readouterr().err.strip() == "error: the window cannot start: x"
