"""Errors a user can cause. The CLI turns each into one `Error:` line and exit code 3."""


class PocketError(Exception):
    """Base for every error that is the user's input or environment, not a bug in pocket."""
