"""Errors the user can fix: the CLI prints `str(exc)` as one line and exits 2."""


class UserError(Exception):
    """A bad argument, file or state; the message names it and says what to change."""
