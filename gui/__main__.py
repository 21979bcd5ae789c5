"""python -m gui [--preset NAME] [--data PATH] [--out RUN_DIR] [--resume PATH|latest]
[--autostart] [--max-steps N]"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from core.errors import EXIT_BAD_INPUT, EXIT_FAIL, UserError
from core.runs.folder import DEFAULT_RUNS_ROOT
from gui.platform_check import xcb_problem


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gui",
        description="TrainDeck: train or fine-tune a GPT on your own GPU (or CPU) from a window.",
    )
    p.add_argument("--preset", help="preset name or YAML file to preselect")
    p.add_argument("--data", help="text file or folder to train on (default: embedded corpus)")
    p.add_argument("--out", metavar="RUN_DIR", help="run folder for the next run")
    p.add_argument(
        "--init-from", metavar="FOLDER|HUB_ID", help="start from a pretrained model (fine-tune)"
    )
    p.add_argument("--resume", metavar="PATH|latest", help="run folder or checkpoint to continue")
    p.add_argument("--autostart", action="store_true", help="start training right away")
    p.add_argument("--max-steps", type=positive_int, metavar="N", help="override max_steps")
    p.add_argument(
        "--runs-root",
        default=str(DEFAULT_RUNS_ROOT),
        help="folder new runs go in and where 'latest' is looked for (default: %(default)s)",
    )
    p.add_argument("--settings", help=argparse.SUPPRESS)  # INI file instead of the user's
    return p


def check_args(args) -> None:
    """Reject a bad preset or resume target before any window opens (UserError)."""
    from core.config import presets as preset_lib
    from core.runs.folder import check_resume_out, resolve_resume

    if args.preset:
        preset_lib.load_preset(args.preset)
    if args.resume:
        _, run = resolve_resume(args.resume, Path(args.runs_root))
        check_resume_out(run, args.out)


def launch(window, args) -> None:
    """What the window does first: resume, start, or offer to resume an interrupted run."""
    from PySide6.QtCore import QTimer

    if args.resume:
        changes = {}
        if args.data:
            changes["data"] = args.data  # core refuses it with a clear message, as the CLI does
        if args.max_steps:
            changes.update(max_steps=args.max_steps, max_epochs=None, max_time=None)
        if args.autostart:
            QTimer.singleShot(0, lambda: window.resume_from(args.resume, changes, args.preset))
        else:
            QTimer.singleShot(
                0,
                lambda: window.open_resume_dialog(
                    args.resume, max_steps=args.max_steps, preset=args.preset
                ),
            )
        return
    window.apply_launch(args.preset, args.data, args.out, args.max_steps, args.init_from)
    if args.autostart:
        QTimer.singleShot(0, window.start)
    else:
        QTimer.singleShot(0, window.offer_interrupted_resume)


def no_display() -> bool:
    """On Linux without X11/Wayland Qt would abort; say so plainly instead."""
    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM"):
        return False
    return not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if no_display():
        print(
            "error: no display found (DISPLAY/WAYLAND_DISPLAY unset); train headless instead, "
            "e.g. python -m core.train --preset cpu-tiny --max-steps 200",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    problem = xcb_problem()
    if problem:
        print(problem, file=sys.stderr)
        return EXIT_FAIL

    from PySide6.QtCore import QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from gui.main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("TrainDeck")
    app.setOrganizationName("TrainDeck")
    if args.settings:
        settings = QSettings(args.settings, QSettings.Format.IniFormat)
    else:
        settings = QSettings("TrainDeck", "TrainDeck")
    window = MainWindow(settings, runs_root=args.runs_root)
    window.show()
    launch(window, args)

    # Qt's loop never hands control to Python's signal handler; a timer lets Ctrl+C in.
    signal.signal(signal.SIGINT, lambda *_: window.request_quit())
    heartbeat = QTimer()
    heartbeat.timeout.connect(lambda: None)
    heartbeat.start(200)
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
