"""Shared test setup. Qt runs offscreen (no display needed); GUI fixtures are opt-in."""

from __future__ import annotations

import importlib.util
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before anything imports Qt
# pytest-xdist's workers share the cores: torch's threads in each (and in the processes tests
# start) would otherwise oversubscribe them. Set before anything imports torch.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

import pytest  # noqa: E402

# setuptools' distutils before any test imports the standard library's: in a worker that ran
# another file first, torch's cpp_extension would otherwise fail to import
if importlib.util.find_spec("setuptools"):
    import setuptools  # noqa: F401


def pytest_addoption(parser):
    parser.addoption(
        "--float-comparisons",
        action="store_true",
        help="only the tests that compare floats (read from their source: tests/float_checks.py);"
        " CI runs them again under other kernels",
    )


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--float-comparisons"):
        return
    from float_checks import compares_floats

    kept, left = [], []
    for item in items:
        function = getattr(item, "function", None)
        (kept if function is not None and compares_floats(function) else left).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


def pytest_xdist_auto_num_workers(config):
    """-n auto (pyproject's addopts): a worker a core, at most 4 (each holds torch,
    transformers and a Qt application)."""
    return max(1, min(os.cpu_count() or 1, 4))


@pytest.fixture(autouse=True, scope="session")
def data_cache(tmp_path_factory):
    """Prepared token files go to a temp folder, never the user's cache."""
    path = tmp_path_factory.mktemp("data-cache")
    os.environ["TRAINDECK_CACHE"] = str(path)
    return path


@pytest.fixture
def gui_env(tmp_path, monkeypatch):
    """Keep user presets and QSettings inside tmp_path, never in the real user folders."""
    import platformdirs
    from PySide6.QtCore import QSettings

    config_home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config_home))
    # platformdirs ignores XDG_CONFIG_HOME on Windows and macOS: patch the lookup itself.
    monkeypatch.setattr(
        platformdirs, "user_config_dir", lambda *a, **k: str(config_home / "TrainDeck")
    )
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    QSettings.setPath(
        QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "qsettings")
    )
    return tmp_path


class DialogRecorder:
    """Stands in for QMessageBox's blocking static dialogs."""

    def __init__(self):
        self.calls: list[tuple[str, str, str]] = []
        self.answer_yes = True

    def named(self, kind: str) -> list[tuple[str, str]]:
        return [(title, text) for k, title, text in self.calls if k == kind]


@pytest.fixture
def dialogs(monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    rec = DialogRecorder()
    ok = QMessageBox.StandardButton.Ok

    def record(kind):
        def show(parent, title, text, *args, **kwargs):
            rec.calls.append((kind, title, text))
            if kind == "question":
                yes, no = QMessageBox.StandardButton.Yes, QMessageBox.StandardButton.No
                return yes if rec.answer_yes else no
            return ok

        return show

    for kind in ("critical", "warning", "information", "question"):
        monkeypatch.setattr(QMessageBox, kind, record(kind))
    return rec


@pytest.fixture
def make_window(qtbot, gui_env, dialogs):
    """MainWindow factory with settings and runs in tmp_path; stops any run at teardown."""
    from PySide6.QtCore import QSettings

    from gui.main_window import MainWindow

    windows = []

    def make(**kwargs):
        kwargs.setdefault(
            "settings", QSettings(str(gui_env / "gui.ini"), QSettings.Format.IniFormat)
        )
        kwargs.setdefault("runs_root", gui_env / "runs")
        window = MainWindow(**kwargs)
        qtbot.addWidget(window)
        windows.append(window)
        return window

    yield make
    for window in windows:
        if window.worker is not None:
            window.worker.request_stop()
            window.worker.wait(60_000)
            qtbot.waitUntil(lambda w=window: w.worker is None, timeout=10_000)


@pytest.fixture
def two_gpus(monkeypatch):
    """Two CUDA cards found (tests/helpers.py's TWO), whatever this machine has."""
    from helpers import TWO

    from core.platform import hardware

    monkeypatch.setattr(hardware, "gpus", lambda: [dict(g) for g in TWO])
