"""The one exception type of pocket.formats."""

from pocket.errors import PocketError


class FormatError(PocketError, ValueError):
    """A file or graph breaks the pocket format; the message names the offending field."""
