"""The exception export raises for problems the user can fix."""

from pocket.errors import PocketError


class ExportError(PocketError):
    """The checkpoint or the options cannot be exported as asked; the message says why."""
