"""python -m core.monitor [RUNS_OR_RUN] [--host H] [--port P] [--control]: a live web page of
the runs under a folder, or of one run, for a phone or another computer (core.monitor)."""

from __future__ import annotations

import argparse
import functools
import signal
import sys
from pathlib import Path

from core.cli.base import Parser, non_negative, run_main
from core.errors import EXIT_OK, ConfigError
from core.monitor import server
from core.monitor.reading import RunIndex

# core.runs.folder.DEFAULT_RUNS_ROOT (tests/core/test_monitor.py checks), named here so the
# command does not import torch with that module: it starts in a fraction of a second.
DEFAULT_RUNS_ROOT = Path("runs")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m core.monitor",
        description="Serve a live page of training runs to a browser on this computer, a "
        "phone or another computer. Private by default: it listens on this computer only, "
        "and the page needs the token in the URL it prints.",
        epilog="Ctrl+C stops it. Exit codes: 0 stopped, 2 bad input.",
    )
    p.add_argument(
        "target",
        nargs="?",
        metavar="RUNS_OR_RUN",
        help=f"a runs folder (every run in it, new ones too) or one run folder "
        f"(default: {DEFAULT_RUNS_ROOT}/)",
    )
    p.add_argument(
        "--host",
        default=server.LOOPBACK,
        help=f"address to listen on (default {server.LOOPBACK}: this computer only; "
        "0.0.0.0: every device on your network)",
    )
    p.add_argument(
        "--port",
        type=non_negative(int),
        help=f"port (default {server.DEFAULT_PORT}, or the next free one; 0: any free port)",
    )
    p.add_argument(
        "--control",
        action="store_true",
        help="allow Stop, Save now and Finish from the page (default: read-only)",
    )
    # core.train --monitor's child (core.monitor.beside): one run folder, which may not exist
    # yet, served until stdin closes
    p.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--with-parent", action="store_true", help=argparse.SUPPRESS)
    return p


def check_target(text: str | None) -> Path:
    """The folder to watch; the default runs folder may not exist yet (runs appear in it)."""
    if text is None:
        return DEFAULT_RUNS_ROOT
    path = Path(text).expanduser()
    what = "does not exist" if not path.exists() else "is not a folder"
    if not path.is_dir():
        raise ConfigError(f"RUNS_OR_RUN: {text} {what}; give a runs folder or a run folder")
    return path


def monitor_args(args) -> dict:
    port = server.DEFAULT_PORT if args.port is None else args.port
    if port > 65535:
        raise ConfigError(f"--port: {port} is not a port (0 to 65535)")
    return {"host": args.host, "port": port, "explicit_port": args.port is not None}


def run_cli(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.with_parent:  # Ctrl+C is the trainer's: it saves and stops, and the page shows it
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if args.run:
        index = RunIndex(Path(args.target), single=True)
    else:
        index = server.watch_target(check_target(args.target))
    log = functools.partial(print, flush=True)
    monitor = server.Monitor(index, control=args.control, log=log, **monitor_args(args))
    for line in monitor.lines():
        log(line)
    if args.with_parent:
        return beside_parent(monitor)
    try:
        monitor.serve_forever()
    except KeyboardInterrupt:
        print("Monitor stopped.")
    finally:
        monitor.close()
    return EXIT_OK


def beside_parent(monitor: server.Monitor) -> int:
    """Serve until stdin closes (the training process ended, or died), then let open pages
    hear of the end."""
    monitor.start()
    try:
        sys.stdin.read()
    finally:
        monitor.linger()
        monitor.close()
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    return run_main(run_cli, argv)


if __name__ == "__main__":
    sys.exit(main())
