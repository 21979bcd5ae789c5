"""What can go wrong, sorted the same way for the CLI (exit codes) and the window (dialogs)."""


class UserError(Exception):
    """Bad input: the message is one line naming the field or file and what is allowed."""


class ConfigError(UserError):
    """A setting that is wrong; field names it (the window flags that field's widget), None
    where no one field is to blame."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class DataError(UserError):
    pass


class CheckpointError(UserError):
    pass


class TrainingError(Exception):
    """Training could not go on (diverged, out of memory at micro-batch 1)."""


class StepStopped(Exception):
    """A stop request came while a step waited on the user's code (a reward): the step is
    dropped before it changed the model, and the run saves and stops at the step before."""


class DiskFullError(TrainingError):
    """The disk filled up: the message says where, what was kept and how to go on."""


def failure_kind(err: BaseException) -> str:
    """ "input" (bad settings, data or checkpoint), "training" (diverged, OOM at micro-batch 1)
    or "crash" (a bug or an unexpected failure)."""
    if isinstance(err, UserError):
        return "input"
    if isinstance(err, TrainingError):
        return "training"
    return "crash"


def failure_message(err: BaseException) -> str:
    """core's own text for input and training failures; a crash also names its type."""
    if failure_kind(err) == "crash":
        return f"{type(err).__name__}: {err}"
    return str(err)


# Exit codes of every command line (and of the window's launcher).
EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def exit_code(err: BaseException) -> int:
    return EXIT_BAD_INPUT if failure_kind(err) == "input" else EXIT_FAIL
