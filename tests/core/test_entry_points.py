"""Every entry point starts, and every feature the window offers runs, from the base install:
each one is started in a fresh Python whose imports of the extras' packages fail, as on a
machine where only `pip install -e .` ran. A module-level import of an extra fails here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]


def _dist(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def optional_modules() -> list[str]:
    """Top-level modules of every package only an extra installs, and bitsandbytes (a base
    dependency only on Linux x86-64 and Windows), read from pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_dist(r) for r in project["dependencies"] if ";" not in r}
    extras = {_dist(r) for reqs in project["optional-dependencies"].values() for r in reqs}
    blocked = (extras - base) | {"bitsandbytes"}
    from importlib.metadata import packages_distributions

    modules = {d.replace("-", "_") for d in blocked}  # where it is not installed here
    for module, dists in packages_distributions().items():
        if any(d.lower().replace("_", "-") in blocked for d in dists):
            modules.add(module)
    return sorted(modules)


# Runs in the child: block the modules, then start each entry point as a user would.
CHILD = r"""
import importlib.abc, json, sys
BLOCKED = set(json.loads(sys.argv[1]))

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (an extra; blocked)", name=name)
        return None

sys.meta_path.insert(0, Blocked())
work = sys.argv[2]

def run(main, args):
    code = main(args)
    if code:
        raise SystemExit(f"{args} exited {code}")

for step in sys.argv[3].split(","):
  if step == "train":
      from core.train import main
      run(main, ["--preset", "cpu-tiny", "--max-steps", "2", "--eval-every", "2",
                 "--out", work + "/run"])
  elif step == "generate":
      from core.generate import main
      run(main, [work + "/run", "--prompt", "def", "--max-new-tokens", "4"])
  elif step == "export":
      from core.export import main
      for fmt in ("hf", "gguf", "ollama", "safetensors"):
          run(main, [work + "/run", "--format", fmt, "--out", work + "/out-" + fmt])
  elif step == "eval":
      from core.eval import main
      open(work + "/held.txt", "w").write("def add(a, b):\n    return a + b\n" * 20)
      run(main, [work + "/run", "--text", work + "/held.txt"])
  elif step == "monitor":
      import urllib.request
      from pathlib import Path
      from core.monitor.server import Monitor, watch_target
      m = Monitor(watch_target(Path(work) / "run"), port=0, explicit_port=True).start()
      assert b"TrainDeck monitor" in urllib.request.urlopen(m.url).read()
      m.close()
  elif step == "window":
      from pathlib import Path
      from PySide6.QtCore import QSettings
      from PySide6.QtWidgets import QApplication
      import gui.__main__, gui.main_window
      app = QApplication([])
      settings = QSettings(work + "/gui.ini", QSettings.Format.IniFormat)
      win = gui.main_window.MainWindow(settings=settings, runs_root=Path(work) / "runs")
      win.show()
      app.processEvents()
      watch = win.open_watch_dialog()  # the web monitor and its QR code (segno)
      watch.port = 0
      assert watch.start_serving() and not watch.qr.pixmap().isNull()
      win.close()
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)
print("LOADED", json.dumps(loaded))
"""


def start(steps: str, work: Path, blocked: list[str]) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        HOME=str(work),
        XDG_CONFIG_HOME=str(work / "config"),
        HF_HUB_OFFLINE="1",
    )
    return subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(blocked), str(work), steps],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_blocked_set_holds_every_extra_and_no_base_package():
    blocked = optional_modules()
    for module in ("transformers", "peft", "tensorboard", "bitsandbytes"):
        assert module in blocked
    for module in (
        "gguf",
        "torch",
        "PySide6",
        "pyqtgraph",
        "yaml",
        "pynvml",
        "tokenizers",
        "segno",
    ):
        assert module not in blocked


def test_each_entry_point_runs_without_the_extras(tmp_path_factory):
    """A 2-step run, generation from it, every export format, evaluation, the web monitor
    of the run, then the window (and its Watch from another device):
    one Python (one torch import) for all, to keep the suite fast."""
    work = tmp_path_factory.mktemp("base only")  # a space, as in many Windows user folders
    result = start("train,generate,export,eval,monitor,window", work, optional_modules())
    assert result.returncode == 0, result.stderr[-3000:]
    assert "LOADED []" in result.stdout
    for fmt in ("hf", "gguf", "ollama", "safetensors"):
        assert any((work / f"out-{fmt}").iterdir())


def test_a_module_level_import_of_an_extra_is_caught(tmp_path):
    """The check itself: a module that imports an extra at the top cannot be imported."""
    (tmp_path / "uses_extra.py").write_text("import peft\n")
    code = CHILD.split("work = sys.argv[2]")[0] + "import uses_extra\n"
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "-c", code, json.dumps(optional_modules())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "No module named 'peft' (an extra; blocked)" in result.stderr
