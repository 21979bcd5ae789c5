"""Errors that mean "the user gave us something we cannot use" (CLI exit code 2)."""


class UserError(Exception):
    """Bad input: the message is one line naming the field or file and what is allowed."""


class ConfigError(UserError):
    pass


class DataError(UserError):
    pass


class CheckpointError(UserError):
    pass
