"""What every command line shares: the argparse base that turns usage errors into one line,
number checks for flags, and the wrapper that maps any failure to one line and an exit code."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from core.errors import EXIT_INTERRUPTED, UserError, exit_code, failure_kind, failure_message


class UsageError(UserError):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit 2, as for every other bad input
        raise UsageError(message)


def non_negative(kind):
    """An argparse type: a number of this kind, 0 or more."""

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
        return value

    return parse


def run_main(run: Callable[[list[str] | None], int], argv=None, crash_hint: str = "") -> int:
    """Run a command; bad input, failures and Ctrl+C become one line on stderr and an exit code."""
    try:
        return run(argv)
    except KeyboardInterrupt:
        print("\nAborted.", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:
        hint = crash_hint if failure_kind(e) == "crash" else ""
        print(f"error: {failure_message(e)}{hint}", file=sys.stderr)
        return exit_code(e)
