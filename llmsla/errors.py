"""The error a user can fix: printed by the command line as one line (exit code 2), never as a
traceback. Configuration, store, spool and command errors derive from it."""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input or environment; the message says what and where."""


class CliError(UserError):
    """A bad command-line argument or a command that cannot run as asked."""
